package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The manager's own metrics say where a scenario's time goes: steps in flight and waiting in the
// executor (toolnexus_inflight_steps, toolnexus_queued_steps), runs waiting for a reconcile worker
// (the agentrun workqueue) and how busy the workers are.

// series is one sample line of the Prometheus text format.
type series struct {
	name   string
	labels map[string]string
	value  float64
}

// managerMetrics is one scrape of the manager's /metrics.
type managerMetrics []series

func (m *manager) scrapeMetrics(ctx context.Context) (managerMetrics, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+m.metrics+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("manager /metrics: %s", resp.Status)
	}
	var out managerMetrics
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		s := series{labels: map[string]string{}}
		var rest string
		if open := strings.IndexByte(line, '{'); open >= 0 {
			end := strings.LastIndexByte(line, '}')
			if end < open {
				continue
			}
			s.name, s.labels, rest = line[:open], parseLabels(line[open+1:end]), line[end+1:]
		} else {
			var ok bool
			if s.name, rest, ok = strings.Cut(line, " "); !ok {
				continue
			}
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		if s.value, err = strconv.ParseFloat(fields[0], 64); err == nil {
			out = append(out, s)
		}
	}
	return out, sc.Err()
}

// sum adds the series named name whose labels include match.
func (mm managerMetrics) sum(name string, match map[string]string) float64 {
	total := 0.0
next:
	for _, s := range mm {
		if s.name != name {
			continue
		}
		for k, v := range match {
			if s.labels[k] != v {
				continue next
			}
		}
		total += s.value
	}
	return total
}

var agentrunController = map[string]string{"controller": "agentrun"}

// managerActivity is what the manager did between two scrapes.
type managerActivity struct {
	steps         float64       // steps started by the executor
	stepWait      time.Duration // their mean wait for a slot
	reconciles    float64
	reconcile     time.Duration // mean reconcile time
	workqueueWait time.Duration // mean time a run waited in the workqueue for a worker
}

func activity(before, after managerMetrics) managerActivity {
	d := func(name string, match map[string]string) float64 {
		return after.sum(name, match) - before.sum(name, match)
	}
	mean := func(sum, count float64) time.Duration {
		if count <= 0 {
			return 0
		}
		return time.Duration(sum / count * float64(time.Second))
	}
	a := managerActivity{
		steps:      d("toolnexus_step_queue_wait_seconds_count", nil),
		reconciles: d("controller_runtime_reconcile_total", agentrunController),
	}
	a.stepWait = mean(d("toolnexus_step_queue_wait_seconds_sum", nil), a.steps)
	a.reconcile = mean(d("controller_runtime_reconcile_time_seconds_sum", agentrunController),
		d("controller_runtime_reconcile_time_seconds_count", agentrunController))
	a.workqueueWait = mean(d("workqueue_queue_duration_seconds_sum", agentrunController),
		d("workqueue_queue_duration_seconds_count", agentrunController))
	return a
}

// sample is the manager's load at one moment.
type sample struct {
	at time.Time
	// inflight and queued are the executor's steps, summed over namespaces; depth is the agentrun
	// workqueue's, workers its busy reconcile workers.
	inflight, queued, depth, workers float64
	rss                              int64
	turns                            int
}

// sampler scrapes the manager every interval until stopped.
type sampler struct {
	stop    chan struct{}
	done    chan struct{}
	samples []sample
}

func (h *harness) startSampler(ctx context.Context, every time.Duration, turns func() int) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if mm, err := h.mgr.scrapeMetrics(ctx); err == nil {
				rss, _ := h.mgr.rss()
				s.samples = append(s.samples, sample{at: time.Now(),
					inflight: mm.sum("toolnexus_inflight_steps", nil), queued: mm.sum("toolnexus_queued_steps", nil),
					depth: mm.sum("workqueue_depth", agentrunController), workers: mm.sum("controller_runtime_active_workers", agentrunController),
					rss: rss, turns: turns()})
			}
			select {
			case <-tick.C:
			case <-s.stop:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return s
}

// finish stops the sampler and summarizes what it saw.
func (s *sampler) finish() loadSummary {
	close(s.stop)
	<-s.done
	var l loadSummary
	l.samples = len(s.samples)
	if l.samples == 0 {
		return l
	}
	for _, x := range s.samples {
		l.inflight.add(x.inflight)
		l.queued.add(x.queued)
		l.depth.add(x.depth)
		l.workers.add(x.workers)
		l.rssMax = max(l.rssMax, x.rss)
	}
	for _, st := range []*stat{&l.inflight, &l.queued, &l.depth, &l.workers} {
		st.mean /= float64(l.samples)
	}
	l.steadyRate = steadyRate(s.samples)
	return l
}

// steadyRate is the turns per second between the samples at 10% and 90% of the turns taken, which
// leaves out the ramp while runs are being created and the tail of the last runs; 0 when one
// sample interval holds both.
func steadyRate(ss []sample) float64 {
	total := ss[len(ss)-1].turns
	lo, hi := -1, -1
	for i, x := range ss {
		if lo < 0 && x.turns >= total/10 {
			lo = i
		}
		if hi < 0 && x.turns >= total*9/10 {
			hi = i
		}
	}
	if lo < 0 || hi <= lo {
		return 0
	}
	return float64(ss[hi].turns-ss[lo].turns) / ss[hi].at.Sub(ss[lo].at).Seconds()
}

// stat is the mean (a sum until finish divides it) and maximum of a sampled figure.
type stat struct{ mean, max float64 }

func (s *stat) add(v float64) { s.mean += v; s.max = max(s.max, v) }

func (s stat) String() string { return fmt.Sprintf("%.0f / %.0f", s.mean, s.max) }

// loadSummary is the manager's sampled load over a scenario: means and maxima.
type loadSummary struct {
	samples                          int
	inflight, queued, depth, workers stat
	rssMax                           int64
	steadyRate                       float64
}

package main

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// workload is one batch of runs on one model, spread over namespaces, measured from the first
// create to the end of the last run.
type workload struct {
	runs, turns, namespaces int
	delay                   time.Duration
	// created is how long the harness took to create the runs; wall runs to the last run's end.
	created, wall time.Duration
	turnsTaken    int
	// timedOut is set when the runs had not all ended by the deadline; the figures are then what
	// was done by it, and phases says where the runs were.
	timedOut bool
	phases   map[toolnexusv1alpha1.RunPhase]int
	requests requestCounts
	// cpu, apiCPU and etcdCPU are the CPU time of the manager, the kube-apiserver and etcd.
	cpu, apiCPU, etcdCPU time.Duration
	rssBefore            int64
	load                 loadSummary
	mgr                  managerActivity
	// modelRequests and modelConns are what the model server received.
	modelRequests, modelConns int64
}

func (w workload) rate() float64 { return float64(w.turnsTaken) / w.wall.Seconds() }

func (w workload) perTurn(v float64) float64 { return v / float64(max(w.turnsTaken, 1)) }

// cores is the mean CPU the manager used over the workload, in cores.
func (w workload) cores(d time.Duration) float64 { return d.Seconds() / w.wall.Seconds() }

// namespaces creates n namespaces named <prefix>-….
func (h *harness) namespaces(ctx context.Context, prefix string, n int) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		ns, err := h.namespace(ctx, prefix)
		if err != nil {
			return nil, err
		}
		out[i] = ns
	}
	return out, nil
}

// runWorkload creates runs of turns on model, spread over namespaces, and follows them to their end
// or the timeout, sampling the manager; then it deletes them.
func (h *harness) runWorkload(ctx context.Context, phase string, model *modelServer, runs, turns, namespaces int, timeout time.Duration) (workload, error) {
	w := workload{runs: runs, turns: turns, namespaces: namespaces, delay: model.delay}
	nss, err := h.namespaces(ctx, "bench-"+phase, namespaces)
	if err != nil {
		return w, err
	}
	defer h.cleanupLogged(ctx, nss...)
	tr, err := track(ctx, h.c, client.MatchingLabels{benchLabel: phase})
	if err != nil {
		return w, err
	}
	before, mBefore, err := h.counters(ctx)
	if err != nil {
		return w, err
	}
	requests0, conns0 := model.requests.Load(), model.conns.Load()
	cp := controlPlanePIDs()
	cp0 := cpuOf(cp)
	w.rssBefore, _ = h.mgr.rss()
	smp := h.startSampler(ctx, 500*time.Millisecond, tr.turnsTaken)
	cpu0, t0 := h.mgr.cpu(), time.Now()
	if prof := h.startProfiles(ctx, phase); prof != nil {
		go func() {
			if err := <-prof; err != nil {
				logf("%s: manager CPU profile: %v", phase, err)
			} else {
				logf("%s: manager CPU profile written to %s", phase, h.cfg.cpuProfile)
			}
		}()
	}

	logf("%s: creating %d runs of %d turns (model answers in %s) in %d namespaces", phase, runs, turns, model.delay, namespaces)
	shape := runShape{model: model, turns: turns, tool: toolWork, phase: phase}
	if _, err := h.createSpread(ctx, nss, phase, runs, 32, shape); err != nil {
		smp.finish()
		return w, err
	}
	w.created = time.Since(t0)
	logf("%s: created in %s", phase, w.created.Round(time.Millisecond))
	err = tr.waitFor(ctx, timeout, runs, toolnexusv1alpha1.RunPhaseSucceeded, toolnexusv1alpha1.RunPhaseFailed,
		toolnexusv1alpha1.RunPhaseIncomplete)
	w.wall, w.cpu = time.Since(t0), h.mgr.cpu()-cpu0
	w.load = smp.finish()
	cp1 := cpuOf(cp)
	w.apiCPU, w.etcdCPU = cp1["kube-apiserver"]-cp0["kube-apiserver"], cp1["etcd"]-cp0["etcd"]
	if ctx.Err() != nil {
		return w, ctx.Err()
	}
	if err != nil {
		w.timedOut = true
		logf("%s: %v", phase, err)
	}
	w.turnsTaken = tr.turnsTaken()
	w.modelRequests, w.modelConns = model.requests.Load()-requests0, model.conns.Load()-conns0
	if ok := tr.count(toolnexusv1alpha1.RunPhaseSucceeded); ok != runs {
		w.phases = tr.phaseCounts()
		if !w.timedOut {
			return w, fmt.Errorf("%d of %d runs succeeded: %v", ok, runs, w.phases)
		}
	}
	time.Sleep(time.Second) // events land asynchronously
	after, mAfter, err := h.counters(ctx)
	if err != nil {
		return w, err
	}
	w.requests = delta(before, after)
	delete(w.requests, "POST agentruns") // the harness's own creates
	w.mgr = activity(mBefore, mAfter)
	logf("%s: %d turns in %s (%.1f turns/s, steady %.1f), manager %.2f cores, RSS max %d MiB, %.2f API writes/turn%s",
		phase, w.turnsTaken, w.wall.Round(time.Millisecond), w.rate(), w.load.steadyRate, w.cores(w.cpu), w.load.rssMax>>20,
		w.perTurn(w.requests.writes()), map[bool]string{true: " (TIMED OUT)"}[w.timedOut])
	return w, nil
}

// counters scrapes the kube-apiserver's request counters and the manager's metrics.
func (h *harness) counters(ctx context.Context) (requestCounts, managerMetrics, error) {
	api, err := scrapeAPIServer(ctx, h.rest)
	if err != nil {
		return nil, nil, err
	}
	mgr, err := h.mgr.scrapeMetrics(ctx)
	return api, mgr, err
}

package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/tools"
)

const (
	toolWork = "work" // answers at once
	toolGate = "gate" // suspends on an approval, then answers
)

var answerPatch = client.RawPatch(types.MergePatchType, []byte(`{"status":{"answer":{"ok":true}}}`))

func (h *harness) namespace(ctx context.Context, name string) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: name + "-"}}
	if err := h.c.Create(ctx, ns); err != nil {
		return "", err
	}
	return ns.Name, nil
}

// benchLabel marks the runs of one scenario phase, so a tracker follows them across namespaces.
const benchLabel = "bench.toolnexus.dev/phase"

// runShape is what the runs of a workload look like.
type runShape struct {
	model *modelServer
	// turns is the model turns of a run: turns-1 tool calls, then a final text.
	turns int
	tool  string
	// timeout is the run's model.requestTimeout; zero leaves the default.
	timeout time.Duration
	// phase, when set, is the run's benchLabel.
	phase string
}

func (h *harness) newRun(ns, name string, s runShape) *toolnexusv1alpha1.AgentRun {
	run := &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "turns=" + strconv.Itoa(s.turns), AgentSpec: toolnexusv1alpha1.AgentSpec{
			Model:    toolnexusv1alpha1.ModelSpec{Name: "bench", BaseURL: s.model.URL},
			MaxTurns: int32(s.turns + 1),
			Tools: []toolnexusv1alpha1.ToolSpec{{
				Name: s.tool, Description: "benchmark tool",
				Parameters: &apiextensionsv1.JSON{Raw: []byte(`{"type":"object","properties":{"k":{"type":"integer"}}}`)},
				HTTP:       &toolnexusv1alpha1.HTTPToolSpec{URL: h.tools.URL + "/" + s.tool},
			}},
		}},
	}
	if s.timeout > 0 {
		run.Spec.Model.RequestTimeout = &metav1.Duration{Duration: s.timeout}
	}
	if s.phase != "" {
		run.Labels = map[string]string{benchLabel: s.phase}
	}
	return run
}

// shape is a run of turns on the zero-latency model.
func (h *harness) shape(turns int, tool string) runShape {
	return runShape{model: h.model, turns: turns, tool: tool}
}

// parallel runs f(0..n-1) on workers goroutines and returns the first error.
func parallel(ctx context.Context, n, workers int, f func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range min(workers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// createRuns creates n runs named <prefix>-<i> and returns their names.
func (h *harness) createRuns(ctx context.Context, ns, prefix string, n, workers int, s runShape) ([]string, error) {
	return h.createSpread(ctx, []string{ns}, prefix, n, workers, s)
}

// createSpread creates n runs named <prefix>-<i>, run i in namespaces[i mod len(namespaces)].
func (h *harness) createSpread(ctx context.Context, namespaces []string, prefix string, n, workers int, s runShape) ([]string, error) {
	names := make([]string, n)
	err := parallel(ctx, n, workers, func(i int) error {
		names[i] = fmt.Sprintf("%s-%05d", prefix, i)
		return h.c.Create(ctx, h.newRun(namespaces[i%len(namespaces)], names[i], s))
	})
	return names, err
}

// warmUp takes one run through a suspension and one through tool calls, so caches, connections and
// the manager's lazily built state exist before anything is measured.
func (h *harness) warmUp(ctx context.Context) error {
	ns, err := h.namespace(ctx, "bench-warmup")
	if err != nil {
		return err
	}
	tr, err := track(ctx, h.c, client.InNamespace(ns))
	if err != nil {
		return err
	}
	if _, err := h.createRuns(ctx, ns, "work", 4, 4, h.shape(3, toolWork)); err != nil {
		return err
	}
	if _, err := h.createRuns(ctx, ns, "gate", 4, 4, h.shape(2, toolGate)); err != nil {
		return err
	}
	if err := tr.waitFor(ctx, time.Minute, 8, toolnexusv1alpha1.RunPhaseSucceeded, toolnexusv1alpha1.RunPhaseSuspended); err != nil {
		return err
	}
	for name, s := range tr.snapshot() {
		if s.Phase == toolnexusv1alpha1.RunPhaseSuspended {
			if err := h.answer(ctx, ns, s.Pending); err != nil {
				return fmt.Errorf("answering %s: %w", name, err)
			}
		}
	}
	return tr.waitFor(ctx, time.Minute, 8, toolnexusv1alpha1.RunPhaseSucceeded)
}

func (h *harness) answer(ctx context.Context, ns, name string) error {
	if name == "" {
		return errors.New("the run lists no pending request")
	}
	preq := &toolnexusv1alpha1.PendingRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	return h.c.Status().Patch(ctx, preq, answerPatch)
}

// resume measures, per answer, the time from the status.answer patch to the tool server receiving
// the retried call: through the operator, and through the in-process loop with WaitFor.
func (h *harness) resume(ctx context.Context) error {
	n := h.cfg.resumeN
	ns, err := h.namespace(ctx, "bench-resume")
	if err != nil {
		return err
	}
	defer h.cleanupLogged(ctx, ns)
	tr, err := track(ctx, h.c, client.InNamespace(ns))
	if err != nil {
		return err
	}
	logf("resume: parking %d runs", n)
	names, err := h.createRuns(ctx, ns, "resume", n, 16, h.shape(2, toolGate))
	if err != nil {
		return err
	}
	if err := tr.waitFor(ctx, 5*time.Minute, n, toolnexusv1alpha1.RunPhaseSuspended); err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // let the manager go quiet
	runs := tr.snapshot()
	logf("resume: answering %d runs one at a time", n)
	before, err := scrapeAPIServer(ctx, h.rest)
	if err != nil {
		return err
	}
	lat := make([]time.Duration, 0, n)
	patchRTT := make([]time.Duration, 0, n)
	profDone := h.startProfiles(ctx, "resume")
	for _, name := range names {
		s := runs[name]
		arrived := h.tools.expect(s.UID)
		t0 := time.Now()
		if err := h.answer(ctx, ns, s.Pending); err != nil {
			return fmt.Errorf("answering %s: %w", name, err)
		}
		patchRTT = append(patchRTT, time.Since(t0))
		select {
		case t1 := <-arrived:
			lat = append(lat, t1.Sub(t0))
		case <-time.After(30 * time.Second):
			return fmt.Errorf("run %s: the retried call did not arrive within 30s", name)
		}
		// Let the resumed run finish (its final turn), so answers do not queue behind each other.
		if err := h.waitPhase(ctx, tr, name, toolnexusv1alpha1.RunPhaseSucceeded, 30*time.Second); err != nil {
			return err
		}
		time.Sleep(h.cfg.resumeGap)
	}
	h.results.resumeOperator = lat
	h.results.answerPatch = patchRTT
	if profDone != nil {
		if err := <-profDone; err != nil {
			return err
		}
	}
	time.Sleep(time.Second) // events land asynchronously
	after, err := scrapeAPIServer(ctx, h.rest)
	if err != nil {
		return err
	}
	d := delta(before, after)
	d["PATCH pendingrequests/status"] -= float64(n) // the harness's answers
	if d["PATCH pendingrequests/status"] <= 0 {
		delete(d, "PATCH pendingrequests/status")
	}
	h.results.resumeRequests = d

	logf("resume: in-process baseline, %d runs", n)
	inproc, err := h.resumeInProcess(ctx, n)
	if err != nil {
		return err
	}
	h.results.resumeInProcess = inproc
	return nil
}

func (h *harness) waitPhase(ctx context.Context, tr *tracker, name string, phase toolnexusv1alpha1.RunPhase, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		tr.mu.Lock()
		s, ch := tr.runs[name], tr.changed
		tr.mu.Unlock()
		if s.Phase == phase {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("run %s: still %q after %s, want %q", name, s.Phase, timeout, phase)
		}
		select {
		case <-ch:
		case <-time.After(left):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// benchHTTPClient is what the controller uses for model and tool calls: a clone of the default
// transport shared by every run.
func benchHTTPClient() *http.Client {
	return &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
}

func (h *harness) toolkit(hc *http.Client, name string) (*tools.Toolkit, error) {
	t, err := tools.HTTPTool(tools.HTTPToolSpec{
		Name: name, Description: "benchmark tool",
		InputSchema: map[string]any{"type": "object", "properties": map[string]any{"k": map[string]any{"type": "integer"}}},
		URL:         h.tools.URL + "/" + name, Client: hc,
	})
	if err != nil {
		return nil, err
	}
	return tools.NewToolkit(t)
}

func (h *harness) resumeInProcess(ctx context.Context, n int) ([]time.Duration, error) {
	hc := benchHTTPClient()
	tk, err := h.toolkit(hc, toolGate)
	if err != nil {
		return nil, err
	}
	lat := make([]time.Duration, 0, n)
	for i := range n {
		key := fmt.Sprintf("inproc-resume-%d", i)
		parked := make(chan struct{})
		answers := make(chan tools.Answer, 1)
		c, err := loop.New(loop.Options{
			BaseURL: h.model.URL, Model: "bench", MaxTurns: 3, HTTPClient: hc, IdempotencyPrefix: key,
			WaitFor: func(ctx context.Context, _ tools.Request) (tools.Answer, error) {
				close(parked)
				select {
				case a := <-answers:
					return a, nil
				case <-ctx.Done():
					return tools.Answer{}, ctx.Err()
				}
			},
		})
		if err != nil {
			return nil, err
		}
		done := make(chan error, 1)
		go func() {
			res, err := c.Run(ctx, "turns=2", tk)
			if err == nil && res.Status != loop.StatusDone {
				err = fmt.Errorf("in-process run ended %q", res.Status)
			}
			done <- err
		}()
		select {
		case <-parked:
		case err := <-done:
			return nil, fmt.Errorf("in-process run did not park: %v", err)
		}
		arrived := h.tools.expect(key)
		t0 := time.Now()
		answers <- tools.Answer{OK: true}
		lat = append(lat, (<-arrived).Sub(t0))
		if err := <-done; err != nil {
			return nil, err
		}
		time.Sleep(h.cfg.resumeGap)
	}
	return lat, nil
}

// startProfiles starts the CPU profiles of the manager and the kube-apiserver when workload is the
// one -profile-during names. The channel, nil when there is no manager profile, receives the end
// of the manager's.
func (h *harness) startProfiles(ctx context.Context, workload string) chan error {
	if h.cfg.profileDuring != workload {
		return nil
	}
	var done chan error
	if h.cfg.cpuProfile != "" {
		done = make(chan error, 1)
		go func() { done <- h.mgr.profile(ctx, "profile", h.cfg.profileSecs, h.cfg.cpuProfile) }()
	}
	if h.cfg.apiProfile != "" {
		go func() {
			if err := apiserverProfile(ctx, h.rest, h.cfg.profileSecs, h.cfg.apiProfile); err != nil {
				logf("apiserver CPU profile: %v", err)
			}
		}()
	}
	return done
}

// throughput runs rounds of runs×turns through the operator, counting the API requests the
// manager makes, then the same workload through the in-process loop.
func (h *harness) throughput(ctx context.Context) error {
	profDone := h.startProfiles(ctx, "throughput")
	for round := 0; ; round++ {
		counted := round < h.cfg.rounds
		if !counted {
			if profDone == nil {
				break
			}
			select {
			case err := <-profDone:
				if err != nil {
					return fmt.Errorf("CPU profile: %w", err)
				}
				logf("throughput: CPU profile written to %s", h.cfg.cpuProfile)
				profDone = nil
				continue
			default:
			}
		}
		r, err := h.throughputRound(ctx, round, h.cfg.turns)
		if err != nil {
			return err
		}
		logf("throughput: round %d: %d turns in %s: %.1f turns/s, %.2f writes/turn, %.2f reads/turn, CPU/turn: manager %.2f ms, apiserver %.2f ms, etcd %.2f ms%s",
			round, r.turns, r.elapsed.Round(time.Millisecond), r.rate(), r.writesPerTurn(), r.readsPerTurn(), r.cpuPerTurn(),
			r.apiCPUPerTurn(), r.etcdCPUPerTurn(),
			map[bool]string{true: "", false: " (uncounted, profiling)"}[counted])
		if counted {
			h.results.throughput = append(h.results.throughput, r)
		}
	}
	// The same runs with twice the turns: the difference in writes is what a turn costs, apart from
	// what a run costs once (its start and end).
	long, err := h.throughputRound(ctx, h.cfg.rounds+1, 2*h.cfg.turns)
	if err != nil {
		return err
	}
	logf("throughput: round of %d-turn runs: %d turns, %.2f writes/turn", 2*h.cfg.turns, long.turns, long.writesPerTurn())
	h.results.throughputLong = long
	for round := range h.cfg.rounds {
		r, err := h.throughputInProcess(ctx, round)
		if err != nil {
			return err
		}
		logf("throughput: in-process round %d: %d turns in %s: %.1f turns/s", round, r.turns, r.elapsed.Round(time.Millisecond), r.rate())
		h.results.throughputInProcess = append(h.results.throughputInProcess, r)
	}
	return nil
}

type tpRound struct {
	turns    int
	elapsed  time.Duration
	requests requestCounts
	cpu      time.Duration
	// apiCPU and etcdCPU are the control plane's CPU time during the round.
	apiCPU, etcdCPU time.Duration
}

func perTurnMS(d time.Duration, turns int) float64 {
	return float64(d) / float64(time.Millisecond) / float64(turns)
}

func (r tpRound) rate() float64           { return float64(r.turns) / r.elapsed.Seconds() }
func (r tpRound) writesPerTurn() float64  { return r.requests.writes() / float64(r.turns) }
func (r tpRound) readsPerTurn() float64   { return r.requests.reads() / float64(r.turns) }
func (r tpRound) cpuPerTurn() float64     { return perTurnMS(r.cpu, r.turns) }
func (r tpRound) apiCPUPerTurn() float64  { return perTurnMS(r.apiCPU, r.turns) }
func (r tpRound) etcdCPUPerTurn() float64 { return perTurnMS(r.etcdCPU, r.turns) }

func (h *harness) throughputRound(ctx context.Context, round, turns int) (tpRound, error) {
	n := h.cfg.runs
	ns, err := h.namespace(ctx, fmt.Sprintf("bench-tp%d", round))
	if err != nil {
		return tpRound{}, err
	}
	defer h.cleanupLogged(ctx, ns)
	tr, err := track(ctx, h.c, client.InNamespace(ns))
	if err != nil {
		return tpRound{}, err
	}
	before, err := scrapeAPIServer(ctx, h.rest)
	if err != nil {
		return tpRound{}, err
	}
	cp := controlPlanePIDs()
	cp0 := cpuOf(cp)
	cpu0, t0 := h.mgr.cpu(), time.Now()
	if _, err := h.createRuns(ctx, ns, "tp", n, n, h.shape(turns, toolWork)); err != nil {
		return tpRound{}, err
	}
	if err := tr.waitFor(ctx, 5*time.Minute, n, toolnexusv1alpha1.RunPhaseSucceeded, toolnexusv1alpha1.RunPhaseFailed,
		toolnexusv1alpha1.RunPhaseIncomplete); err != nil {
		return tpRound{}, err
	}
	elapsed, cpu := time.Since(t0), h.mgr.cpu()-cpu0
	cp1 := cpuOf(cp)
	var cpAPI, cpEtcd time.Duration
	cpAPI, cpEtcd = cp1["kube-apiserver"]-cp0["kube-apiserver"], cp1["etcd"]-cp0["etcd"]
	if ok := tr.count(toolnexusv1alpha1.RunPhaseSucceeded); ok != n {
		return tpRound{}, fmt.Errorf("%d of %d runs succeeded: %v", ok, n, tr.phaseCounts())
	}
	// Events are sent asynchronously; give them a moment to land before counting.
	time.Sleep(time.Second)
	after, err := scrapeAPIServer(ctx, h.rest)
	if err != nil {
		return tpRound{}, err
	}
	d := delta(before, after)
	delete(d, "POST agentruns") // the harness's own creates
	return tpRound{turns: tr.turnsTaken(), elapsed: elapsed, requests: d, cpu: cpu, apiCPU: cpAPI, etcdCPU: cpEtcd}, nil
}

func (h *harness) throughputInProcess(ctx context.Context, round int) (tpRound, error) {
	return h.runInProcess(ctx, h.model, h.cfg.runs, h.cfg.turns, fmt.Sprintf("inproc-tp%d", round))
}

// runInProcess runs n runs of turns at once through loop.Client.Run against model, as the
// baseline of a workload the operator ran.
func (h *harness) runInProcess(ctx context.Context, model *modelServer, n, turns int, key string) (tpRound, error) {
	hc := benchHTTPClient()
	tk, err := h.toolkit(hc, toolWork)
	if err != nil {
		return tpRound{}, err
	}
	var taken atomic.Int64
	t0 := time.Now()
	err = parallel(ctx, n, n, func(i int) error {
		c, err := loop.New(loop.Options{
			BaseURL: model.URL, Model: "bench", MaxTurns: turns + 1, HTTPClient: hc,
			IdempotencyPrefix: fmt.Sprintf("%s-%d", key, i),
			WaitFor: func(context.Context, tools.Request) (tools.Answer, error) {
				return tools.Answer{OK: true}, nil
			},
		})
		if err != nil {
			return err
		}
		res, err := c.Run(ctx, "turns="+strconv.Itoa(turns), tk)
		if err == nil && res.Status != loop.StatusDone {
			err = fmt.Errorf("in-process run ended %q", res.Status)
		}
		taken.Add(int64(res.Turns))
		return err
	})
	return tpRound{turns: int(taken.Load()), elapsed: time.Since(t0)}, err
}

// parkedScale parks many runs, measures the idle manager, then answers them all.
func (h *harness) parkedScale(ctx context.Context) error {
	n := h.cfg.parked
	res := &h.results.parked
	res.n = n
	res.rssBefore, _ = h.mgr.rss()
	ns, err := h.namespace(ctx, "bench-parked")
	if err != nil {
		return err
	}
	defer h.cleanupLogged(ctx, ns)
	tr, err := track(ctx, h.c, client.InNamespace(ns))
	if err != nil {
		return err
	}
	logf("parked: creating %d runs", n)
	t0 := time.Now()
	names, err := h.createRuns(ctx, ns, "parked", n, 32, h.shape(2, toolGate))
	if err != nil {
		return err
	}
	res.created = time.Since(t0)
	if err := tr.waitFor(ctx, 30*time.Minute, n, toolnexusv1alpha1.RunPhaseSuspended); err != nil {
		return err
	}
	res.parkedIn = time.Since(t0)
	logf("parked: %d runs parked in %s; settling %s", n, res.parkedIn.Round(time.Millisecond), h.cfg.settle)
	time.Sleep(h.cfg.settle)

	res.rss, res.hwm = h.mgr.rss()
	if h.cfg.heapProfile != "" {
		if err := h.mgr.profile(ctx, "heap", 0, h.cfg.heapProfile); err != nil {
			return fmt.Errorf("heap profile: %w", err)
		}
	}
	logf("parked: measuring idle CPU for %s (RSS %d MiB)", h.cfg.idle, res.rss>>20)
	before, err := scrapeAPIServer(ctx, h.rest)
	if err != nil {
		return err
	}
	cpu0, i0 := h.mgr.cpu(), time.Now()
	time.Sleep(h.cfg.idle)
	res.idleCPU, res.idleFor = h.mgr.cpu()-cpu0, time.Since(i0)
	after, err := scrapeAPIServer(ctx, h.rest)
	if err != nil {
		return err
	}
	res.idleRequests = delta(before, after)
	res.rssIdle, _ = h.mgr.rss()

	runs := tr.snapshot()
	uids := make([]string, 0, n)
	for _, name := range names {
		uids = append(uids, runs[name].UID)
	}
	logf("parked: answering all %d runs", n)
	a0 := time.Now()
	err = parallel(ctx, n, 32, func(i int) error {
		s := runs[names[i]]
		return h.answer(ctx, ns, s.Pending)
	})
	if err != nil {
		return err
	}
	res.answered = time.Since(a0)
	deadline := time.Now().Add(30 * time.Minute)
	for {
		last, got := h.tools.lastArrival(uids)
		if got == n {
			res.resumed = last.Sub(a0)
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d retried calls arrived", got, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := tr.waitFor(ctx, 30*time.Minute, n, toolnexusv1alpha1.RunPhaseSucceeded); err != nil {
		return err
	}
	res.finished = time.Since(a0)
	res.rssAfter, res.hwmAfter = h.mgr.rss()
	logf("parked: all %d retried calls arrived %s after the first answer; all succeeded after %s",
		n, res.resumed.Round(time.Millisecond), res.finished.Round(time.Millisecond))
	return nil
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p/100*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

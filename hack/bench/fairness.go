package main

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// fairnessResult is how long a fast run takes, alone and beside another namespace's slow or hung
// runs.
type fairnessResult struct {
	// alone, besideSlow and besideHung are fast 2-turn runs, create → Succeeded.
	alone, besideSlow, besideHung []time.Duration
	slowRuns, slowTurns           int
	slowDelay                     time.Duration
	// slowWall is the slow runs' own time, first create → last Succeeded.
	slowWall time.Duration
	hungRuns int
	// hungHeld is how many requests the hung model held once the last fast run had ended, and
	// hungInflight the manager's toolnexus_inflight_steps for their namespace then.
	hungHeld     int64
	hungInflight float64
	// hungAborted is from deleting the hung runs to the model holding none of their requests.
	hungAborted time.Duration
}

// fastTurns is the fast run of the fairness scenario: one tool call and a final text on the
// zero-latency model.
const fastTurns = 2

// fairness measures fast runs in a namespace of their own: alone, beside -fairness-slow runs on a
// model that answers in -fairness-delay, and beside -fairness-hung runs whose model never answers.
func (h *harness) fairness(ctx context.Context) error {
	c := h.cfg
	res := &h.results.fairness
	res.slowRuns, res.slowTurns, res.slowDelay, res.hungRuns = c.fairSlow, c.slowTurns, c.fairDelay, c.fairHung
	var err error

	logf("fairness: %d fast runs alone", c.fairSamples)
	if res.alone, err = h.fastRuns(ctx, "fast-alone", 200*time.Millisecond); err != nil {
		return err
	}

	slow, nsSlow, done, err := h.beside(ctx, c.fairDelay, "bench-fair-slow")
	if err != nil {
		return err
	}
	defer done()
	trSlow, err := track(ctx, h.c, client.InNamespace(nsSlow))
	if err != nil {
		return err
	}
	logf("fairness: %d runs of %d turns on a model that answers in %s", c.fairSlow, c.slowTurns, c.fairDelay)
	t0 := time.Now()
	res.besideSlow, err = h.fastBeside(ctx, nsSlow, "slow", c.fairSlow, runShape{model: slow, turns: c.slowTurns, tool: toolWork})
	if err != nil {
		return err
	}
	chain := time.Duration(c.slowTurns) * c.fairDelay
	if err := trSlow.waitFor(ctx, 3*chain+time.Minute, c.fairSlow, toolnexusv1alpha1.RunPhaseSucceeded); err != nil {
		return err
	}
	res.slowWall = time.Since(t0)

	hung, nsHung, done, err := h.beside(ctx, hangFor, "bench-fair-hung")
	if err != nil {
		return err
	}
	defer done()
	logf("fairness: %d runs whose model never answers (model.requestTimeout 10m)", c.fairHung)
	res.besideHung, err = h.fastBeside(ctx, nsHung, "hung", c.fairHung,
		runShape{model: hung, turns: fastTurns, tool: toolWork, timeout: 10 * time.Minute})
	if err != nil {
		return err
	}
	res.hungHeld = hung.held.Load()
	if mm, err := h.mgr.scrapeMetrics(ctx); err == nil {
		res.hungInflight = mm.sum("toolnexus_inflight_steps", map[string]string{"namespace": nsHung})
	}
	logf("fairness: deleting the hung runs")
	d0 := time.Now()
	if err := h.cleanup(ctx, nsHung); err != nil {
		return err
	}
	if err := hung.awaitReleased(ctx, 30*time.Second); err != nil {
		return err
	}
	res.hungAborted = time.Since(d0)
	logf("fairness: fast run p50 alone %s, beside slow %s, beside hung %s; hung requests aborted %s after the delete",
		ms(percentile(res.alone, 50)), ms(percentile(res.besideSlow, 50)), ms(percentile(res.besideHung, 50)),
		res.hungAborted.Round(time.Millisecond))
	return nil
}

// beside starts a model that answers after delay and a namespace for the runs that use it; done
// deletes the runs and stops the model.
func (h *harness) beside(ctx context.Context, delay time.Duration, prefix string) (*modelServer, string, func(), error) {
	model, err := newModelServer(delay)
	if err != nil {
		return nil, "", nil, err
	}
	ns, err := h.namespace(ctx, prefix)
	if err != nil {
		model.close()
		return nil, "", nil, err
	}
	return model, ns, func() { h.cleanupLogged(ctx, ns); model.close() }, nil
}

// fastBeside creates n runs shaped s in ns, waits until their model holds all n requests, then
// measures fast runs beside them.
func (h *harness) fastBeside(ctx context.Context, ns, prefix string, n int, s runShape) ([]time.Duration, error) {
	if _, err := h.createRuns(ctx, ns, prefix, n, 16, s); err != nil {
		return nil, err
	}
	if err := s.model.awaitHeld(ctx, int64(n), time.Minute); err != nil {
		return nil, err
	}
	logf("fairness: %d fast runs beside them", h.cfg.fairSamples)
	return h.fastRuns(ctx, "fast-"+prefix, h.cfg.fairGap)
}

// fastRuns creates -fairness-samples fast runs in a new namespace, one at a time with gap between
// them, and returns how long each took from its create to Succeeded.
func (h *harness) fastRuns(ctx context.Context, prefix string, gap time.Duration) ([]time.Duration, error) {
	ns, err := h.namespace(ctx, "bench-"+prefix)
	if err != nil {
		return nil, err
	}
	defer h.cleanupLogged(ctx, ns)
	tr, err := track(ctx, h.c, client.InNamespace(ns))
	if err != nil {
		return nil, err
	}
	out := make([]time.Duration, 0, h.cfg.fairSamples)
	for i := range h.cfg.fairSamples {
		name := fmt.Sprintf("%s-%02d", prefix, i)
		t0 := time.Now()
		if err := h.c.Create(ctx, h.newRun(ns, name, h.shape(fastTurns, toolWork))); err != nil {
			return nil, err
		}
		if err := h.waitPhase(ctx, tr, name, toolnexusv1alpha1.RunPhaseSucceeded, time.Minute); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t0))
		time.Sleep(gap)
	}
	return out, nil
}

func (h *harness) cleanupLogged(ctx context.Context, namespaces ...string) {
	if err := h.cleanup(ctx, namespaces...); err != nil {
		logf("%v", err)
	}
}

package main

import (
	"context"
	"fmt"
	"time"
)

// slowResult is one run count of the slow scenario, with its in-process baseline.
type slowResult struct {
	workload
	// slots is what the executor can hold of these runs' steps at once.
	slots     int
	inProcess tpRound
}

// chainIdeal is one run's turns one after another: what no scheduler can beat.
func (r slowResult) chainIdeal() time.Duration { return time.Duration(r.turns) * r.delay }

// slotIdeal is the runs' model time shared by the executor's slots: when the steps outnumber the
// slots, the slots, not the chains, bound the wall time.
func (r slowResult) slotIdeal() time.Duration {
	return time.Duration(float64(r.runs*r.turns) / float64(r.slots) * float64(r.delay))
}

func (r slowResult) ideal() time.Duration { return max(r.chainIdeal(), r.slotIdeal()) }

// slowModel runs each of -slow-runs runs × -slow-turns turns on a model that answers in
// -slow-delay, spread over as many namespaces as the per-namespace bound needs, so that only the
// total bound (--max-inflight) can hold them back; then the same runs through the in-process loop.
func (h *harness) slowModel(ctx context.Context) error {
	model, err := newModelServer(h.cfg.slowDelay)
	if err != nil {
		return err
	}
	defer model.close()
	c := h.cfg
	for _, n := range c.slowRuns {
		namespaces := (n + c.perNamespace - 1) / c.perNamespace
		r := slowResult{workload: workload{runs: n, turns: c.slowTurns, delay: c.slowDelay},
			slots: min(c.maxInflight, namespaces*c.perNamespace, n)}
		r.workload, err = h.runWorkload(ctx, fmt.Sprintf("slow-%d", n), model, n, c.slowTurns, namespaces, 10*r.ideal()+2*time.Minute)
		if err != nil {
			return err
		}
		logf("slow: %d runs: %s against the ideal %s (%.2f×)", n, r.wall.Round(time.Millisecond), r.ideal().Round(time.Millisecond),
			r.wall.Seconds()/r.ideal().Seconds())
		if r.inProcess, err = h.runInProcess(ctx, model, n, c.slowTurns, fmt.Sprintf("inproc-slow%d", n)); err != nil {
			return err
		}
		logf("slow: %d runs in process: %s", n, r.inProcess.elapsed.Round(time.Millisecond))
		h.results.slow = append(h.results.slow, r)
	}
	return nil
}

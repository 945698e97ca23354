package main

import (
	"context"
	"time"
)

// scale keeps -scale runs of -scale-turns turns active at once on a model that answers in
// -scale-delay, spread over -scale-namespaces namespaces, and measures the turn rate, the
// manager's memory and CPU and the API requests per turn. It stops at -scale-timeout.
func (h *harness) scale(ctx context.Context) error {
	c := h.cfg
	model, err := newModelServer(c.scaleDelay)
	if err != nil {
		return err
	}
	defer model.close()
	r := slowResult{slots: min(c.maxInflight, c.scaleNamespaces*c.perNamespace, c.scaleRuns)}
	r.workload, err = h.runWorkload(ctx, "scale", model, c.scaleRuns, c.scaleTurns, c.scaleNamespaces, c.scaleTimeout)
	if err != nil {
		return err
	}
	h.results.scale = &r
	logf("scale: %d runs: %s against the executor's bound %s", c.scaleRuns, r.wall.Round(time.Millisecond), r.ideal().Round(time.Millisecond))
	return nil
}

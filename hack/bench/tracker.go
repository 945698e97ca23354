package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// runState is what the harness follows of one AgentRun.
type runState struct {
	UID     string
	Phase   toolnexusv1alpha1.RunPhase
	Turns   int32
	Pending string // the first open PendingRequest
}

// tracker follows AgentRuns (those of a namespace, or those with a label in every namespace)
// through a watch, without polling the API server. Runs are known by name: a scenario that spans
// namespaces names its runs uniquely.
type tracker struct {
	mu      sync.Mutex
	runs    map[string]runState
	phases  map[toolnexusv1alpha1.RunPhase]int
	turns   int // Σ status.turns
	changed chan struct{}
}

func track(ctx context.Context, wc client.WithWatch, opts ...client.ListOption) (*tracker, error) {
	t := &tracker{runs: map[string]runState{}, phases: map[toolnexusv1alpha1.RunPhase]int{}, changed: make(chan struct{})}
	var list toolnexusv1alpha1.AgentRunList
	if err := wc.List(ctx, &list, opts...); err != nil {
		return nil, err
	}
	for i := range list.Items {
		t.update(&list.Items[i], false)
	}
	rv := list.ResourceVersion
	watchFrom := func() (watch.Interface, error) {
		return wc.Watch(ctx, &toolnexusv1alpha1.AgentRunList{},
			append(opts[:len(opts):len(opts)], &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})...)
	}
	w, err := watchFrom()
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			for ev := range w.ResultChan() {
				run, ok := ev.Object.(*toolnexusv1alpha1.AgentRun)
				if !ok {
					continue
				}
				rv = run.ResourceVersion
				t.update(run, ev.Type == watch.Deleted)
			}
			if ctx.Err() != nil {
				return
			}
			// The watch ended (timeout): resume from the last version seen.
			for {
				w, err = watchFrom()
				if err == nil || ctx.Err() != nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if ctx.Err() != nil {
				return
			}
		}
	}()
	return t, nil
}

func (t *tracker) update(run *toolnexusv1alpha1.AgentRun, deleted bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.runs[run.Name]; ok {
		t.phases[old.Phase]--
		t.turns -= int(old.Turns)
	}
	if deleted {
		delete(t.runs, run.Name)
	} else {
		s := runState{UID: string(run.UID), Phase: run.Status.Phase, Turns: run.Status.Turns}
		if len(run.Status.Pending) > 0 {
			s.Pending = run.Status.Pending[0].Name
		}
		t.runs[run.Name] = s
		t.phases[s.Phase]++
		t.turns += int(s.Turns)
	}
	close(t.changed)
	t.changed = make(chan struct{})
}

// count is how many runs are in one of phases.
func (t *tracker) count(phases ...toolnexusv1alpha1.RunPhase) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, p := range phases {
		n += t.phases[p]
	}
	return n
}

// turnsTaken is Σ status.turns of the runs followed.
func (t *tracker) turnsTaken() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.turns
}

func (t *tracker) snapshot() map[string]runState {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]runState, len(t.runs))
	for k, v := range t.runs {
		out[k] = v
	}
	return out
}

// waitFor waits until n runs are in one of phases.
func (t *tracker) waitFor(ctx context.Context, timeout time.Duration, n int, phases ...toolnexusv1alpha1.RunPhase) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		t.mu.Lock()
		ch := t.changed
		t.mu.Unlock()
		if t.count(phases...) >= n {
			return nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return fmt.Errorf("timed out after %s: %d of %d runs in %v (phases now %v)", timeout, t.count(phases...), n, phases, t.phaseCounts())
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (t *tracker) phaseCounts() map[toolnexusv1alpha1.RunPhase]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[toolnexusv1alpha1.RunPhase]int{}
	for k, v := range t.phases {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

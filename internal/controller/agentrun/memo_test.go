package agentrun

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/toolnexus/operator/internal/executor"
)

// A step's outcome keeps the memory its job held (executor.Keep) until a reconcile takes and saves
// it. An outcome of a step cancelled (its run deleted or cancelled) is never kept: nothing would
// take it, and the memory would count against every namespace's steps for good.
func TestOutcomesGiveTheirMemoryBack(t *testing.T) {
	var held atomic.Int64
	e := executor.New(executor.Limits{MemoryBytes: 64 << 20}, executor.Observer{Bytes: func(n int64) { held.Store(n) }})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() { _ = e.Start(ctx) }()
	s := newSteps()
	key := types.NamespacedName{Namespace: "tenant", Name: "run"}
	step := func(jobKey string, cancelled bool) {
		t.Helper()
		ran, done := make(chan struct{}), make(chan struct{})
		e.Submit(executor.Job{Key: jobKey, Share: "tenant", Bytes: 1 << 20, Run: func(jobCtx context.Context) {
			close(ran)
			if cancelled {
				<-jobCtx.Done()
			}
			o := &stepOutcome{uid: "uid-1"}
			o.done = executor.Keep(jobCtx)
			s.put(jobCtx, key, o)
		}, Done: func(context.Context) { close(done) }})
		<-ran
		if cancelled {
			e.Cancel(jobKey)
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the step did not end")
		}
	}

	step("kept", false)
	if held.Load() != 1<<20 {
		t.Fatalf("an outcome not taken yet holds %d bytes, want the step's %d", held.Load(), 1<<20)
	}
	o := s.take(key, "uid-1")
	if o == nil {
		t.Fatal("the outcome was not kept")
	}
	o.release()
	if held.Load() != 0 {
		t.Fatalf("a released outcome still holds %d bytes", held.Load())
	}

	step("cancelled", true)
	if o := s.take(key, "uid-1"); o != nil {
		t.Fatal("the outcome of a cancelled step was kept")
	}
	if held.Load() != 0 {
		t.Fatalf("the cancelled step's outcome holds %d bytes, want none", held.Load())
	}
}

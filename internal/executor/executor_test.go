package executor

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// gate is a job body that blocks until released or cancelled, recording starts.
type gate struct {
	mu      sync.Mutex
	started []string
	release chan struct{}
	running atomic.Int32
	peak    atomic.Int32
}

func newGate() *gate { return &gate{release: make(chan struct{})} }

func (g *gate) job(key, share string) Job {
	return Job{Key: key, Share: share, Run: func(ctx context.Context) {
		n := g.running.Add(1)
		for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
		}
		g.mu.Lock()
		g.started = append(g.started, key)
		g.mu.Unlock()
		select {
		case <-g.release:
		case <-ctx.Done():
		}
		g.running.Add(-1)
	}}
}

func (g *gate) starts() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.started...)
}

func start(t *testing.T, e *Executor) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.Start(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return cancel
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A share with hung jobs holds only its own slots: another share's job starts at once.
func TestHungShareHoldsOnlyItsShare(t *testing.T) {
	e := New(8, 3, Observer{})
	hung, fast := newGate(), newGate()
	start(t, e)
	for i := range 16 {
		e.Submit(hung.job(fmt.Sprintf("a/%d", i), "a"))
	}
	waitFor(t, "a's share to fill", func() bool { return hung.running.Load() == 3 })
	e.Submit(fast.job("b/1", "b"))
	waitFor(t, "b's job to start", func() bool { return fast.running.Load() == 1 })
	if got := hung.peak.Load(); got != 3 {
		t.Errorf("share a ran %d jobs at once, want its share of 3", got)
	}
}

// Waiting work is served round robin across shares, and never more than the total at once.
func TestRoundRobinAndTotalBound(t *testing.T) {
	e := New(2, 2, Observer{})
	g := newGate()
	for i := range 3 {
		e.Submit(g.job(fmt.Sprintf("a/%d", i), "a"))
	}
	for i := range 3 {
		e.Submit(g.job(fmt.Sprintf("b/%d", i), "b"))
	}
	start(t, e)
	waitFor(t, "two starts", func() bool { return len(g.starts()) == 2 })
	for n := 3; n <= 6; n++ {
		g.release <- struct{}{} // one job ends: one slot frees
		waitFor(t, "the next start", func() bool { return len(g.starts()) == n })
	}
	got := g.starts()
	slices.Sort(got[:2]) // the first two start together
	want := []string{"a/0", "b/0", "a/1", "b/1", "a/2", "b/2"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("start order (-want +got):\n%s", diff)
	}
	close(g.release)
	if p := g.peak.Load(); p > 2 {
		t.Errorf("%d jobs ran at once, want at most 2", p)
	}
}

// One job per key; Cancel drops a queued job and stops a running one; Start's end stops all.
func TestKeysAndCancellation(t *testing.T) {
	e := New(1, 1, Observer{})
	g := newGate()
	if !e.Submit(g.job("a/1", "a")) || e.Submit(g.job("a/1", "a")) {
		t.Fatal("a second job for a queued key was accepted")
	}
	e.Submit(g.job("a/2", "a"))
	stop := start(t, e)
	waitFor(t, "a/1 to run", func() bool { return g.running.Load() == 1 })
	e.Cancel("a/2") // queued: dropped
	e.Cancel("a/1") // running: cancelled
	waitFor(t, "a/1 to stop", func() bool { return !e.Busy("a/1") })
	if e.Busy("a/2") {
		t.Error("the cancelled queued job is still there")
	}
	e.Submit(g.job("a/3", "a"))
	waitFor(t, "a/3 to run", func() bool { return g.running.Load() == 1 })
	stop()
	waitFor(t, "a/3 to stop when the executor stops", func() bool { return g.running.Load() == 0 })
	if diff := cmp.Diff([]string{"a/1", "a/3"}, g.starts()); diff != "" {
		t.Errorf("starts (-want +got):\n%s", diff)
	}
}

// The observer sees queue waits and the figures per share.
func TestObserver(t *testing.T) {
	var mu sync.Mutex
	inflight, waited := map[string]int{}, 0
	e := New(1, 1, Observer{
		Inflight: func(share string, n int) { mu.Lock(); inflight[share] = n; mu.Unlock() },
		Waited:   func(string, time.Duration) { mu.Lock(); waited++; mu.Unlock() },
	})
	g := newGate()
	e.Submit(g.job("a/1", "a"))
	start(t, e)
	waitFor(t, "a/1 to run", func() bool { mu.Lock(); defer mu.Unlock(); return inflight["a"] == 1 && waited == 1 })
	close(g.release)
	waitFor(t, "a/1 to end", func() bool { mu.Lock(); defer mu.Unlock(); return inflight["a"] == 0 })
}

// Done runs once the job's key is free: a run woken by it can submit its next step at once.
func TestDoneFindsTheKeyFree(t *testing.T) {
	e := New(1, 1, Observer{})
	start(t, e)
	type seen struct{ busy, resubmitted bool }
	got := make(chan seen, 1)
	e.Submit(Job{Key: "run", Share: "ns", Run: func(context.Context) {},
		Done: func(context.Context) {
			s := seen{busy: e.Busy("run")}
			s.resubmitted = e.Submit(Job{Key: "run", Share: "ns", Run: func(context.Context) {}})
			got <- s
		}})
	select {
	case s := <-got:
		if s.busy || !s.resubmitted {
			t.Errorf("in Done: Busy %v, a new job with the key accepted %v; want false, true", s.busy, s.resubmitted)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Done was not called")
	}
}

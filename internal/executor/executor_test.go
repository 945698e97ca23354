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
	e := New(Limits{MaxInflight: 8, PerShare: 3}, Observer{})
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
	e := New(Limits{MaxInflight: 2, PerShare: 2}, Observer{})
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
	e := New(Limits{MaxInflight: 1, PerShare: 1}, Observer{})
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
	e := New(Limits{MaxInflight: 1, PerShare: 1}, Observer{
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
	e := New(Limits{MaxInflight: 1, PerShare: 1}, Observer{})
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

// hungJobs submits n jobs of share that block until released or cancelled.
func hungJobs(e *Executor, g *gate, share string, n int) {
	for i := range n {
		e.Submit(g.job(fmt.Sprintf("%s/%d", share, i), share))
	}
}

// No group of shares takes every slot: a share with nothing in flight starts at once beside any
// number of hung jobs, until as many new shares as the reserve holds have a job each.
func TestNewShareStartsBesideHungShares(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		limits               Limits
		hungShares, perHung  int
		wantHung, newStarted int
	}{
		// The bounds that failed before (256 slots, 64 per namespace): 4 × 64 hung jobs hold the 224
		// slots outside the reserve, and 32 new namespaces still start a job each.
		{name: "256 slots, 4 × 64 hung", limits: Limits{MaxInflight: 256, PerShare: 64}, hungShares: 4, perHung: 64, wantHung: 224, newStarted: 32},
		{name: "the defaults, 4 × 64 hung", limits: Limits{}, hungShares: 4, perHung: 64, wantHung: 256, newStarted: 768},
		{name: "the defaults, 20 × 64 hung", limits: Limits{}, hungShares: 20, perHung: 64, wantHung: 896, newStarted: 128},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(tc.limits, Observer{})
			hung, fresh := newGate(), newGate()
			// Queued before the start, they are taken round robin: every hung share has its first
			// job in flight before the slots outside the reserve are full.
			for s := range tc.hungShares {
				hungJobs(e, hung, fmt.Sprintf("hung-%d", s), tc.perHung)
			}
			start(t, e)
			waitFor(t, "the hung jobs to start", func() bool { return int(hung.running.Load()) == tc.wantHung })
			e.Submit(fresh.job("fifth/0", "fifth"))
			waitFor(t, "the fifth share's job to start", func() bool { return fresh.running.Load() == 1 })
			// Each further new share takes one free slot, the reserved ones included.
			for s := 1; s <= tc.newStarted; s++ {
				e.Submit(fresh.job(fmt.Sprintf("new-%d/0", s), fmt.Sprintf("new-%d", s)))
			}
			waitFor(t, "every new share's job to start", func() bool { return int(fresh.running.Load()) == tc.newStarted })
			e.Submit(fresh.job("fifth/1", "fifth")) // a second job of a share in flight: no reserve
			time.Sleep(20 * time.Millisecond)
			if got := int(fresh.running.Load()); got != tc.newStarted {
				t.Errorf("%d new jobs run, want %d", got, tc.newStarted)
			}
			if got := int(hung.running.Load()); got != tc.wantHung {
				t.Errorf("%d hung jobs run, want %d", got, tc.wantHung)
			}
		})
	}
}

// sized is a gate job that declares bytes.
func (g *gate) sized(key, share string, bytes int64) Job {
	j := g.job(key, share)
	j.Bytes = bytes
	return j
}

// bytesSeen records the memory the observer was told of.
type bytesSeen struct {
	mu        sync.Mutex
	now, peak int64
}

func (b *bytesSeen) observer() Observer {
	return Observer{Bytes: func(n int64) {
		b.mu.Lock()
		b.now, b.peak = n, max(b.peak, n)
		b.mu.Unlock()
	}}
}

func (b *bytesSeen) get() (now, peak int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.now, b.peak
}

// Jobs start while what they hold fits the budget; the rest wait and start as memory frees, and a
// share whose next job does not fit holds up no other share.
func TestMemoryBudgetAdmission(t *testing.T) {
	var seen bytesSeen
	// 800 bytes, of which 100 reserved for a share's first job.
	e := New(Limits{MaxInflight: 16, PerShare: 16, MemoryBytes: 800}, seen.observer())
	g := newGate()
	start(t, e)
	for i := range 4 {
		e.Submit(g.sized(fmt.Sprintf("a/%d", i), "a", 300))
	}
	waitFor(t, "a/0 and a/1 to start", func() bool { return g.running.Load() == 2 })
	time.Sleep(20 * time.Millisecond)
	if n := g.running.Load(); n != 2 {
		t.Fatalf("%d jobs of 300 bytes run in a budget of 800 (100 reserved), want 2", n)
	}
	e.Submit(g.sized("b/0", "b", 150)) // b's first job: it may take the reserve
	e.Submit(g.sized("b/1", "b", 150)) // it may not
	waitFor(t, "b/0 to start", func() bool { return slices.Contains(g.starts(), "b/0") })
	time.Sleep(20 * time.Millisecond)
	if slices.Contains(g.starts(), "b/1") {
		t.Error("b/1 started past the budget outside the reserve")
	}
	g.release <- struct{}{} // one job ends: 300 or 150 bytes free
	waitFor(t, "a third job", func() bool { return g.running.Load() == 3 })
	close(g.release)
	waitFor(t, "every job to end", func() bool { now, _ := seen.get(); return now == 0 && len(g.starts()) == 6 })
	if _, peak := seen.get(); peak > 800 {
		t.Errorf("the jobs held %d bytes at once, want at most the budget of 800", peak)
	}
}

// A job larger than the whole budget waits for the memory held to drain, then runs alone; it
// holds up neither its share's successors for ever nor jobs that hold nothing.
func TestJobOverTheBudgetRunsAlone(t *testing.T) {
	e := New(Limits{MaxInflight: 16, PerShare: 16, MemoryBytes: 800}, Observer{})
	g := newGate()
	start(t, e)
	e.Submit(g.sized("a/small", "a", 100))
	waitFor(t, "a/small to start", func() bool { return g.running.Load() == 1 })
	e.Submit(g.sized("b/huge", "b", 5000))
	e.Submit(g.sized("c/small", "c", 100))
	waitFor(t, "c/small to start beside a/small", func() bool { return g.running.Load() == 2 })
	if slices.Contains(g.starts(), "b/huge") {
		t.Fatal("a job over the budget started while others held memory")
	}
	g.release <- struct{}{}
	g.release <- struct{}{}
	waitFor(t, "b/huge to start once nothing is held", func() bool { return slices.Contains(g.starts(), "b/huge") })
	e.Submit(g.sized("d/small", "d", 100))
	e.Submit(g.job("e/free", "e")) // holds nothing: never waits for memory
	waitFor(t, "e/free to start beside b/huge", func() bool { return slices.Contains(g.starts(), "e/free") })
	time.Sleep(20 * time.Millisecond)
	if slices.Contains(g.starts(), "d/small") {
		t.Error("a job holding memory started beside the job over the budget")
	}
	close(g.release)
	waitFor(t, "d/small to start", func() bool { return slices.Contains(g.starts(), "d/small") })
}

// charger is a job body that charges steps one at a time, each when proceed says so, reporting
// each grant; then it holds what it charged until released.
type charger struct {
	key     string
	proceed chan struct{}
	release chan struct{}
}

func newCharger(e *Executor, key, share string, steps []int64, granted chan<- string) *charger {
	c := &charger{key: key, proceed: make(chan struct{}), release: make(chan struct{})}
	e.Submit(Job{Key: key, Share: share, Run: func(ctx context.Context) {
		for i, n := range steps {
			select {
			case <-c.proceed:
			case <-ctx.Done():
				return
			}
			if err := Charge(ctx, n); err != nil {
				granted <- fmt.Sprintf("%s:%d:%v", key, i, err)
				return
			}
			granted <- fmt.Sprintf("%s:%d", key, i)
		}
		select {
		case <-c.release:
		case <-ctx.Done():
		}
	}})
	return c
}

func (c *charger) step() { c.proceed <- struct{}{} }

func next(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no charge was granted")
		return ""
	}
}

func quiet(t *testing.T, ch <-chan string) {
	t.Helper()
	select {
	case s := <-ch:
		t.Fatalf("%s was granted, want it to wait", s)
	case <-time.After(20 * time.Millisecond):
	}
}

// Charges wait while the budget is spent and go on as memory frees; when every holder waits (a
// job alone among them included), the oldest goes on, so charging never deadlocks.
func TestChargeWaitsAndNeverDeadlocks(t *testing.T) {
	var seen bytesSeen
	// 1000 bytes, 125 of them reserved for a share's first job.
	e := New(Limits{MaxInflight: 8, PerShare: 8, MemoryBytes: 1000}, seen.observer())
	start(t, e)
	granted := make(chan string, 16)
	alone := newCharger(e, "a/alone", "a", []int64{500, 600}, granted)
	alone.step()
	if got := next(t, granted); got != "a/alone:0" {
		t.Fatalf("granted %s, want a/alone:0", got)
	}
	// 1100 > 1000, but a/alone is the only holder: nobody else would free memory, so it goes on.
	alone.step()
	if got := next(t, granted); got != "a/alone:1" {
		t.Fatalf("granted %s, want a/alone:1", got)
	}
	close(alone.release)
	waitFor(t, "a/alone's memory to be freed", func() bool { now, _ := seen.get(); return now == 0 })

	first := newCharger(e, "b/first", "b", []int64{500, 600}, granted)
	second := newCharger(e, "b/second", "b", []int64{300, 200}, granted) // not b's first job: 875 at most
	first.step()
	second.step()
	got := []string{next(t, granted), next(t, granted)}
	slices.Sort(got)
	if diff := cmp.Diff([]string{"b/first:0", "b/second:0"}, got); diff != "" {
		t.Fatalf("grants (-want +got):\n%s", diff)
	}
	// b/first's 600 waits while b/second, a holder that does not wait, could free memory.
	first.step()
	quiet(t, granted)
	// Now b/second waits for its 200 too: the oldest waiting job, b/first, goes on over the budget.
	second.step()
	if got := next(t, granted); got != "b/first:1" {
		t.Fatalf("granted %s, want b/first:1 (the oldest of the waiting holders)", got)
	}
	quiet(t, granted)
	close(first.release)
	if got := next(t, granted); got != "b/second:1" {
		t.Fatalf("granted %s, want b/second:1 once b/first freed its memory", got)
	}
	if now, peak := seen.get(); now != 500 || peak != 1400 {
		t.Errorf("held %d now and %d at the peak, want 500 and 1400 (b/first's over-budget charge)", now, peak)
	}
	close(second.release)
	waitFor(t, "the memory to be freed", func() bool { now, _ := seen.get(); return now == 0 })
}

// A share's first job may charge the reserve; a waiting charge ends with its context; outside a
// job Charge does nothing.
func TestChargeReserveAndCancel(t *testing.T) {
	e := New(Limits{MaxInflight: 8, PerShare: 8, MemoryBytes: 1000}, Observer{})
	start(t, e)
	if err := Charge(context.Background(), 1<<40); err != nil {
		t.Fatalf("Charge outside a job: %v", err)
	}
	granted := make(chan string, 16)
	a0 := newCharger(e, "a/0", "a", []int64{800}, granted)
	a0.step()
	next(t, granted)
	a1 := newCharger(e, "a/1", "a", []int64{1}, granted) // 801 of the 875 outside the reserve
	a1.step()
	next(t, granted)
	a2 := newCharger(e, "a/2", "a", []int64{100}, granted) // past the 875: waits (a/1 could free)
	a2.step()
	quiet(t, granted)
	b0 := newCharger(e, "b/0", "b", []int64{150}, granted) // b's first job: within the reserve
	b0.step()
	if got := next(t, granted); got != "b/0:0" {
		t.Fatalf("granted %s, want b/0:0 from the reserve", got)
	}
	e.Cancel("a/2")
	if got := next(t, granted); got != "a/2:0:context canceled" {
		t.Fatalf("got %s, want a/2's waiting charge to end with its context", got)
	}
}

// Memory a job keeps outlives it: jobs wait for it until it is released, not when the job ends.
func TestKeptMemoryOutlivesTheJob(t *testing.T) {
	var seen bytesSeen
	e := New(Limits{MaxInflight: 8, PerShare: 8, MemoryBytes: 1000}, seen.observer())
	start(t, e)
	released := make(chan func(), 1)
	e.Submit(Job{Key: "a/0", Share: "a", Bytes: 100, Run: func(ctx context.Context) {
		_ = Charge(ctx, 500)
		released <- Keep(ctx)
	}})
	release := <-released
	waitFor(t, "a/0 to end", func() bool { return !e.Busy("a/0") })
	if now, _ := seen.get(); now != 600 {
		t.Fatalf("%d bytes held after a/0 ended, want the 600 it kept", now)
	}
	granted := make(chan string, 4)
	a1 := newCharger(e, "a/1", "a", []int64{500}, granted) // 1100: waits for the kept memory
	a1.step()
	quiet(t, granted)
	release()
	release() // twice is once
	if got := next(t, granted); got != "a/1:0" {
		t.Fatalf("granted %s, want a/1:0 once the kept memory was released", got)
	}
	if now, _ := seen.get(); now != 500 {
		t.Errorf("%d bytes held, want a/1's 500", now)
	}
	close(a1.release)
	waitFor(t, "a/1's memory to be freed", func() bool { now, _ := seen.get(); return now == 0 })
	if release := Keep(context.Background()); release == nil {
		t.Error("Keep outside a job returned no release")
	} else {
		release()
	}
}

// Package executor runs the model requests and tool calls of runs off the controller's workers,
// with a bound on the I/O in flight in total and per share (a namespace), a budget of the memory
// that work in flight may hold, and round robin across shares for waiting work: a share whose
// endpoints are slow or hung only ever holds its own slots, and every other share's work starts as
// soon as a slot is free. The last eighth of the slots and of the memory is kept for a share with
// nothing in flight, so no group of shares can take every slot or every byte. No Kubernetes
// imports.
package executor

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Defaults of the bounds. A step that waits on the network costs a goroutine and a connection,
// not memory worth budgeting, so the slots are many; what the steps hold is bounded by the memory
// budget instead.
const (
	DefaultMaxInflight = 1024
	DefaultPerShare    = 64
	// DefaultMemoryBytes is the memory budget when Limits names none.
	DefaultMemoryBytes int64 = 256 << 20
)

// reserveDivisor sets the reserve: 1/reserveDivisor of the slots and of the memory budget is used
// only by a share's job started while the share had nothing in flight.
const reserveDivisor = 8

// Limits are the executor's bounds; zero values take the defaults.
type Limits struct {
	// MaxInflight bounds the jobs running at once, PerShare those of one share.
	MaxInflight, PerShare int
	// MemoryBytes bounds the bytes the running jobs hold: what they declare (Job.Bytes) and what
	// they Charge while they run.
	MemoryBytes int64
}

// Job is one unit of I/O of one run.
type Job struct {
	// Key names the run; at most one job per key is queued or running.
	Key string
	// Share is what the job is counted against (the run's namespace).
	Share string
	// Bytes is the memory the job holds from its start to its end (its copy of the run's state,
	// the request it sends); what it reads while it runs it adds with Charge. A job larger than the
	// whole budget starts when no other job holds any memory.
	Bytes int64
	// Run does the I/O. Its context is cancelled by Cancel, and when the executor stops (the
	// manager lost its leadership or is shutting down). Charge with that context counts against
	// the job.
	Run func(ctx context.Context)
	// Done, when set, is called once Run has returned and the job's key, slot and memory are free,
	// with Run's context: what it wakes finds the key free to submit the job's successor.
	Done func(ctx context.Context)
}

// Observer receives the executor's figures; nil methods are not called.
type Observer struct {
	// Inflight reports the jobs running for a share after every change.
	Inflight func(share string, n int)
	// Queued reports the jobs waiting for a share after every change.
	Queued func(share string, n int)
	// Waited reports how long a job waited between Submit and its start.
	Waited func(share string, d time.Duration)
	// Bytes reports the memory the running jobs hold, in total, after every change.
	Bytes func(n int64)
}

type entry struct {
	job       Job
	submitted time.Time
	cancel    context.CancelFunc
	// seq orders running jobs by their start: when every holder of charged memory waits for more,
	// the oldest goes on.
	seq uint64
	// reserved says the job started while its share had nothing in flight: it may use the reserve.
	reserved bool
	// held is what the job holds (Bytes and its charges), charged its charges alone.
	held, charged int64
	// waits counts the job's charges that wait (its tool calls run in parallel).
	waits int
	// ended is set once the job's Run returned: a late Charge counts for nothing. kept says its
	// memory outlives it until Keep's release.
	ended, kept bool
}

// waiter is a charge that waits for memory; granted is closed once it is made.
type waiter struct {
	en      *entry
	n       int64
	granted chan struct{}
}

// Executor runs jobs with bounded, fair concurrency. Use New; Start runs it.
type Executor struct {
	maxInflight, perShare, slotReserve int
	budget, memReserve                 int64
	observe                            Observer
	now                                func() time.Time

	mu     sync.Mutex
	root   context.Context
	queues map[string][]*entry
	// rotation lists the shares with queued jobs, in the order they are served next.
	rotation []string
	inflight map[string]int
	total    int
	// byKey holds every queued or running job.
	byKey map[string]*entry
	// bytes is what the running jobs hold; waiting are the charges that wait, their jobs in start
	// order. holders counts the running jobs with charges, and waitingHolders those of them that
	// wait for more.
	bytes                   int64
	waiting                 []*waiter
	holders, waitingHolders int
	seq                     uint64
	wg                      sync.WaitGroup
}

// New returns an executor with the bounds of l.
func New(l Limits, observe Observer) *Executor {
	if l.MaxInflight <= 0 {
		l.MaxInflight = DefaultMaxInflight
	}
	if l.PerShare <= 0 {
		l.PerShare = DefaultPerShare
	}
	if l.MemoryBytes <= 0 {
		l.MemoryBytes = DefaultMemoryBytes
	}
	return &Executor{maxInflight: l.MaxInflight, perShare: min(l.PerShare, l.MaxInflight),
		slotReserve: l.MaxInflight / reserveDivisor, budget: l.MemoryBytes, memReserve: l.MemoryBytes / reserveDivisor,
		observe: observe, now: time.Now,
		queues: map[string][]*entry{}, inflight: map[string]int{}, byKey: map[string]*entry{}}
}

// Start runs queued jobs until ctx ends, then cancels the running ones and waits for them. Jobs
// submitted before Start wait for it.
func (e *Executor) Start(ctx context.Context) error {
	e.mu.Lock()
	e.root = ctx
	e.dispatch()
	e.mu.Unlock()
	<-ctx.Done()
	e.mu.Lock()
	for _, en := range e.byKey {
		if en.cancel != nil {
			en.cancel()
		}
	}
	e.mu.Unlock()
	e.wg.Wait()
	return nil
}

// NeedLeaderElection makes a manager run the executor only while it leads: losing the lease stops
// every job in flight.
func (e *Executor) NeedLeaderElection() bool { return true }

// Submit queues job unless a job with its key is queued or running; it reports whether it did.
func (e *Executor) Submit(job Job) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, busy := e.byKey[job.Key]; busy {
		return false
	}
	en := &entry{job: job, submitted: e.now()}
	e.byKey[job.Key] = en
	if len(e.queues[job.Share]) == 0 {
		e.rotation = append(e.rotation, job.Share)
	}
	e.queues[job.Share] = append(e.queues[job.Share], en)
	e.report(job.Share)
	e.dispatch()
	return true
}

// Busy reports whether a job with key is queued or running.
func (e *Executor) Busy(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, busy := e.byKey[key]
	return busy
}

// Cancel drops the queued job with key, or cancels its context if it runs.
func (e *Executor) Cancel(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	en, ok := e.byKey[key]
	if !ok {
		return
	}
	if en.cancel != nil {
		en.cancel()
		return
	}
	share := en.job.Share
	q := e.queues[share]
	for i := range q {
		if q[i] == en {
			e.queues[share] = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if len(e.queues[share]) == 0 {
		e.dropFromRotation(share)
	}
	delete(e.byKey, key)
	e.report(share)
}

// dispatch starts queued jobs while they fit, taking shares in turn. Called with mu held.
func (e *Executor) dispatch() {
	if e.root == nil || e.root.Err() != nil {
		return
	}
	for {
		i := e.nextShare()
		if i < 0 {
			return
		}
		share := e.rotation[i]
		en := e.queues[share][0]
		e.queues[share] = e.queues[share][1:]
		// The share goes to the back of the rotation: the next slot is another share's.
		e.rotation = append(e.rotation[:i:i], e.rotation[i+1:]...)
		if len(e.queues[share]) > 0 {
			e.rotation = append(e.rotation, share)
		}
		e.start(en)
	}
}

// nextShare is the index in rotation of the first share whose next job may start now, or -1. A
// share whose next job does not fit the memory left is passed over, so that it holds up no other
// share; the memory it waits for frees as running jobs end.
func (e *Executor) nextShare() int {
	for i, share := range e.rotation {
		if e.fits(share, e.queues[share][0].job.Bytes) {
			return i
		}
	}
	return -1
}

// fits says whether a job of share holding bytes may start now: below the share's bound and the
// total, within the memory budget (or alone, holding more than all of it). Only a share with
// nothing in flight may take the reserve.
func (e *Executor) fits(share string, bytes int64) bool {
	n := e.inflight[share]
	if n >= e.perShare {
		return false
	}
	slots, memory := e.maxInflight, e.budget
	if n > 0 {
		slots, memory = slots-e.slotReserve, memory-e.memReserve
	}
	return e.total < slots && (bytes <= 0 || e.bytes+bytes <= memory || e.bytes == 0)
}

func (e *Executor) dropFromRotation(share string) {
	for i, s := range e.rotation {
		if s == share {
			e.rotation = append(e.rotation[:i:i], e.rotation[i+1:]...)
			return
		}
	}
}

// start runs en on its own goroutine. Called with mu held.
func (e *Executor) start(en *entry) {
	ctx, cancel := context.WithCancel(e.root)
	ctx = context.WithValue(ctx, jobKey{}, &jobRef{e: e, en: en})
	en.cancel = cancel
	share := en.job.Share
	e.seq++
	en.seq, en.reserved = e.seq, e.inflight[share] == 0
	e.inflight[share]++
	e.total++
	if en.job.Bytes > 0 {
		en.held = en.job.Bytes
		e.addBytes(en.held)
	}
	if e.observe.Waited != nil {
		e.observe.Waited(share, e.now().Sub(en.submitted))
	}
	e.report(share)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer cancel()
		en.job.Run(ctx)
		e.release(en)
		if en.job.Done != nil {
			en.job.Done(ctx)
		}
	}()
}

// release frees the slot, the memory (unless kept) and the key of a job whose Run returned, and
// starts what waited for them.
func (e *Executor) release(en *entry) {
	e.mu.Lock()
	defer e.mu.Unlock()
	share := en.job.Share
	e.inflight[share]--
	if e.inflight[share] == 0 {
		delete(e.inflight, share)
	}
	e.total--
	// Charges of the job's own goroutines that still wait (none, unless Run left some running)
	// now count for nothing.
	for i := len(e.waiting) - 1; i >= 0; i-- {
		if e.waiting[i].en == en {
			close(e.unwait(i).granted)
		}
	}
	en.ended = true
	delete(e.byKey, en.job.Key)
	e.report(share)
	if en.kept {
		e.dispatch() // the slot is free, the memory is not yet
		return
	}
	e.freeMemory(en)
}

func (e *Executor) addBytes(n int64) {
	e.bytes += n
	if e.observe.Bytes != nil {
		e.observe.Bytes(e.bytes)
	}
}

// report tells the observer a share's figures. Called with mu held.
func (e *Executor) report(share string) {
	if e.observe.Inflight != nil {
		e.observe.Inflight(share, e.inflight[share])
	}
	if e.observe.Queued != nil {
		e.observe.Queued(share, len(e.queues[share]))
	}
	if len(e.queues[share]) == 0 {
		delete(e.queues, share)
	}
}

// jobKey carries a running job in its context, for Charge.
type jobKey struct{}

type jobRef struct {
	e  *Executor
	en *entry
}

// Charge counts n more bytes against the job whose context ctx is (or derives from) until the
// job ends (or, kept, until Keep's release): what it has read and will hold, a response body as
// it arrives. It waits while the
// memory budget is spent, and returns ctx's error if ctx ends first. Outside a job it does
// nothing.
//
// Waiting cannot deadlock: when every job that holds charged memory waits for more, the oldest of
// the waiting jobs goes on over the budget, so the budget is exceeded by at most what that job
// reads before it ends.
func Charge(ctx context.Context, n int64) error {
	ref, ok := ctx.Value(jobKey{}).(*jobRef)
	if !ok || n <= 0 {
		return nil
	}
	return ref.e.charge(ctx, ref.en, n)
}

// Keep makes the memory held by the job whose context ctx is outlive the job: it is given back
// when release is called (once; later calls do nothing), not when Run returns, for a host that
// hands the job's result to a worker of its own which holds it until then (the reconcile that
// applies a step's outcome and saves it). Until then it counts as memory that no running job will
// free: jobs waiting for memory wait for it. So release must not wait for the executor. Outside a
// job, release does nothing.
func Keep(ctx context.Context) (release func()) {
	ref, ok := ctx.Value(jobKey{}).(*jobRef)
	if !ok {
		return func() {}
	}
	e, en := ref.e, ref.en
	e.mu.Lock()
	en.kept = !en.ended
	e.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { e.giveBack(en) }) }
}

// giveBack frees what a kept job held, once it has ended.
func (e *Executor) giveBack(en *entry) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !en.kept {
		return
	}
	en.kept = false
	if en.ended {
		e.freeMemory(en)
	}
}

// freeMemory gives back what en holds and makes what waited for it. Called with mu held.
func (e *Executor) freeMemory(en *entry) {
	if en.charged > 0 {
		e.holders--
	}
	e.addBytes(-en.held)
	en.held, en.charged = 0, 0
	e.grantWaiting()
	e.dispatch()
}

func (e *Executor) charge(ctx context.Context, en *entry, n int64) error {
	e.mu.Lock()
	if en.ended {
		e.mu.Unlock()
		return nil
	}
	if e.chargeFits(en, n) {
		e.grant(en, n)
		e.mu.Unlock()
		return nil
	}
	w := &waiter{en: en, n: n, granted: make(chan struct{})}
	if en.waits == 0 && en.charged > 0 {
		e.waitingHolders++
	}
	en.waits++
	// After every waiter of an older or the same job: the oldest job's charges go first.
	i := len(e.waiting)
	for i > 0 && e.waiting[i-1].en.seq > en.seq {
		i--
	}
	e.waiting = slices.Insert(e.waiting, i, w)
	e.grantWaiting()
	e.mu.Unlock()
	select {
	case <-w.granted:
		return nil
	case <-ctx.Done():
		e.mu.Lock()
		defer e.mu.Unlock()
		if i := slices.Index(e.waiting, w); i >= 0 {
			e.unwait(i)
			e.grantWaiting()
		} // else granted meanwhile: held until the job ends, like any charge
		return ctx.Err()
	}
}

// chargeFits says whether n more bytes of en fit the budget; only a job that started as its
// share's only one may take the reserve. Called with mu held.
func (e *Executor) chargeFits(en *entry, n int64) bool {
	limit := e.budget
	if !en.reserved {
		limit -= e.memReserve
	}
	return e.bytes+n <= limit
}

// grant adds n bytes to what en holds. Called with mu held.
func (e *Executor) grant(en *entry, n int64) {
	if en.charged == 0 {
		e.holders++
		if en.waits > 0 {
			e.waitingHolders++
		}
	}
	en.charged += n
	en.held += n
	e.addBytes(n)
}

// unwait takes the i-th waiting charge out of the queue. Called with mu held.
func (e *Executor) unwait(i int) *waiter {
	w := e.waiting[i]
	e.waiting = slices.Delete(e.waiting, i, i+1)
	w.en.waits--
	if w.en.waits == 0 && w.en.charged > 0 {
		e.waitingHolders--
	}
	return w
}

// grantWaiting makes the waiting charges that fit now, oldest job first; and when every holder of
// charged memory waits, so that none would ever free any, the oldest job's first waiting charge.
// Called with mu held.
func (e *Executor) grantWaiting() {
	for i := 0; i < len(e.waiting); {
		if w := e.waiting[i]; !e.chargeFits(w.en, w.n) {
			i++
			continue
		}
		e.grantWaiter(i)
	}
	if len(e.waiting) > 0 && e.waitingHolders == e.holders {
		e.grantWaiter(0)
	}
}

func (e *Executor) grantWaiter(i int) {
	w := e.unwait(i)
	e.grant(w.en, w.n)
	close(w.granted)
}

// Package executor runs the model requests and tool calls of runs off the controller's workers,
// with a bound on the I/O in flight in total and per share (a namespace), and round robin across
// shares for waiting work: a share whose endpoints are slow or hung only ever holds its own
// slots, and every other share's work starts as soon as a slot is free. No Kubernetes imports.
package executor

import (
	"context"
	"sync"
	"time"
)

// Defaults of the bounds.
const (
	DefaultMaxInflight = 256
	DefaultPerShare    = 64
)

// Job is one unit of I/O of one run.
type Job struct {
	// Key names the run; at most one job per key is queued or running.
	Key string
	// Share is what the job is counted against (the run's namespace).
	Share string
	// Run does the I/O. Its context is cancelled by Cancel, and when the executor stops (the
	// manager lost its leadership or is shutting down).
	Run func(ctx context.Context)
	// Done, when set, is called once Run has returned and the job's key and slot are free, with
	// Run's context: what it wakes finds the key free to submit the job's successor.
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
}

type entry struct {
	job       Job
	submitted time.Time
	cancel    context.CancelFunc
}

// Executor runs jobs with bounded, fair concurrency. Use New; Start runs it.
type Executor struct {
	maxInflight, perShare int
	observe               Observer
	now                   func() time.Time

	mu     sync.Mutex
	root   context.Context
	queues map[string][]*entry
	// rotation lists the shares with queued jobs, in the order they are served next.
	rotation []string
	inflight map[string]int
	total    int
	// byKey holds every queued or running job.
	byKey map[string]*entry
	wg    sync.WaitGroup
}

// New returns an executor that runs at most maxInflight jobs at once, at most perShare of them
// from one share; zero values take the defaults.
func New(maxInflight, perShare int, observe Observer) *Executor {
	if maxInflight <= 0 {
		maxInflight = DefaultMaxInflight
	}
	if perShare <= 0 {
		perShare = DefaultPerShare
	}
	return &Executor{maxInflight: maxInflight, perShare: min(perShare, maxInflight), observe: observe, now: time.Now,
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

// dispatch starts queued jobs while slots are free, taking shares in turn. Called with mu held.
func (e *Executor) dispatch() {
	if e.root == nil || e.root.Err() != nil {
		return
	}
	for e.total < e.maxInflight {
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

// nextShare is the index in rotation of the first share with a free slot, or -1.
func (e *Executor) nextShare() int {
	for i, share := range e.rotation {
		if e.inflight[share] < e.perShare {
			return i
		}
	}
	return -1
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
	en.cancel = cancel
	share := en.job.Share
	e.inflight[share]++
	e.total++
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

// release frees the slot and the key of a job whose Run returned, and starts what waited for them.
func (e *Executor) release(en *entry) {
	e.mu.Lock()
	defer e.mu.Unlock()
	share := en.job.Share
	e.inflight[share]--
	if e.inflight[share] == 0 {
		delete(e.inflight, share)
	}
	e.total--
	delete(e.byKey, en.job.Key)
	e.report(share)
	e.dispatch()
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

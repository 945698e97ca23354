package agentrun

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// steps is what this process keeps of each run between its reconciles: one runMemo per run, for
// the run with the UID it names (a run deleted and created again under the same name inherits
// nothing).
type steps struct {
	mu   sync.Mutex
	runs map[types.NamespacedName]*runMemo
	// wake tells the controller a step finished.
	wake chan event.GenericEvent
}

// runMemo is what this process keeps of one run.
type runMemo struct {
	uid types.UID
	// outcome is what its finished step left, until a reconcile takes it.
	outcome *stepOutcome
	// retryAt is when the run, whose model failed transiently, may try again.
	retryAt time.Time
	// reportedAt is when this process last patched the run's status.
	reportedAt time.Time
	// owedStart and owedEnd are the start and end this process saved and no status patch has
	// shown yet.
	owedStart, owedEnd bool
}

func newSteps() *steps {
	return &steps{runs: map[types.NamespacedName]*runMemo{}, wake: make(chan event.GenericEvent, 1024)}
}

// of is the memo of the run with uid, made afresh when the kept one was another run's; the caller
// holds s.mu.
func (s *steps) of(key types.NamespacedName, uid types.UID) *runMemo {
	m := s.runs[key]
	if m == nil || m.uid != uid {
		if m != nil {
			m.outcome.release()
		}
		m = &runMemo{uid: uid}
		s.runs[key] = m
	}
	return m
}

// put keeps the outcome of a step whose job context is ctx, unless that context was cancelled (the
// run was cancelled or deleted, or this process lost its leadership): then nothing may apply it,
// and what it holds is given back now. Checked under the lock, as Cancel cancels the context before
// the reconcile that cancels drops what is kept, so an outcome is never kept after that drop.
func (s *steps) put(ctx context.Context, key types.NamespacedName, o *stepOutcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ctx.Err() != nil {
		o.release()
		return
	}
	m := s.of(key, o.uid)
	m.outcome.release()
	m.outcome = o
}

// take removes and returns the outcome left for the run with uid, if any. The caller releases it
// once it has applied and saved it.
func (s *steps) take(key types.NamespacedName, uid types.UID) *stepOutcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.of(key, uid)
	o := m.outcome
	m.outcome = nil
	return o
}

func (s *steps) backoff(key types.NamespacedName, uid types.UID, at time.Time) {
	s.mu.Lock()
	s.of(key, uid).retryAt = at
	s.mu.Unlock()
}

// notBefore is when the run may take its next step; zero when it may now.
func (s *steps) notBefore(key types.NamespacedName, uid types.UID, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.of(key, uid)
	if !now.Before(m.retryAt) {
		m.retryAt = time.Time{}
	}
	return m.retryAt
}

// reportedAt remembers that the run's status was patched at t.
func (s *steps) reportedAt(key types.NamespacedName, uid types.UID, t time.Time) {
	s.mu.Lock()
	s.of(key, uid).reportedAt = t
	s.mu.Unlock()
}

// reportDue reports whether the run's status was last patched by this process longer than
// statusInterval before now (or never).
func (s *steps) reportDue(key types.NamespacedName, uid types.UID, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := s.of(key, uid).reportedAt
	return at.IsZero() || now.Sub(at) >= statusInterval
}

// owe notes that this process saved the run's start or end: they are reported (events, the run
// span) once a status patch shows them, in this reconcile or, when its patch failed, a later one.
func (s *steps) owe(key types.NamespacedName, uid types.UID, start, ended bool) {
	if !start && !ended {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.of(key, uid)
	m.owedStart, m.owedEnd = m.owedStart || start, m.owedEnd || ended
}

// shown returns what was owed for the run and clears it: a status patch has just shown it.
func (s *steps) shown(key types.NamespacedName, uid types.UID) (start, ended bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.of(key, uid)
	start, ended = m.owedStart, m.owedEnd
	m.owedStart, m.owedEnd = false, false
	return start, ended
}

// drop discards the outcome and the backoff of a run's step: the run was cancelled, and what its
// aborted step left must not be applied. What it still owes is kept.
func (s *steps) drop(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.runs[key]; m != nil {
		m.outcome.release()
		m.outcome, m.retryAt = nil, time.Time{}
	}
}

// forget drops whatever is kept for a run that is gone or has ended.
func (s *steps) forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.runs[key]; m != nil {
		m.outcome.release()
		delete(s.runs, key)
	}
}

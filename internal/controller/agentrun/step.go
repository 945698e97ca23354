package agentrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/controller/runspec"
	"github.com/toolnexus/operator/internal/executor"
	"github.com/toolnexus/operator/internal/kube"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/runstore"
	"github.com/toolnexus/operator/internal/tools"
)

// Model requests and tool calls never run on a reconcile worker. A reconcile decides that the run
// can take a step, submits it to the executor with a copy of the state, and returns; the step runs
// there (the tool calls of a turn, then the next model turn: a model turn is always saved before
// the tool calls it asks for run), keeps its outcome here, and wakes the run, whose next reconcile
// saves the outcome and goes on. While a step is in flight the run's state is not touched.

// stepOutcome is what a finished step left for its run's next reconcile.
type stepOutcome struct {
	uid types.UID
	// from is the record the step started from, as the reconcile that submitted it left it (nothing
	// touches it since): the reconcile that takes the outcome starts from it, with no read, and
	// applies the outcome to it. Another writer meanwhile makes the save conflict (the head's
	// resourceVersion), and the step is taken again from a fresh read.
	from  *runstore.Record
	state *loop.State
	err   error
	// toolsBuilt says whether the MCP servers were connected, and mcpFailures which failed.
	toolsBuilt  bool
	mcpFailures []string
	// events are those of the reconcile that submitted the step with state it had not saved (an
	// answer consumed): they are recorded once the outcome, which holds that state, is saved.
	events []func()
}

// steps holds the outcomes of finished steps and the backoffs of failing models, by run.
type steps struct {
	mu       sync.Mutex
	outcomes map[types.NamespacedName]*stepOutcome
	// retryAt is when a run whose model failed transiently may try again.
	retryAt map[types.NamespacedName]runTime
	// reported is when this process last patched a run's status.
	reported map[types.NamespacedName]runTime
	// owed are the start and end this process saved and no status patch has shown yet.
	owed map[types.NamespacedName]transitions
	// wake tells the controller a step finished.
	wake chan event.GenericEvent
}

// runTime is a time kept for the run with uid (a run deleted and created again under the same
// name does not inherit it).
type runTime struct {
	uid types.UID
	at  time.Time
}

// transitions are the start and end of the run with uid.
type transitions struct {
	uid          types.UID
	start, ended bool
}

func newSteps() *steps {
	return &steps{outcomes: map[types.NamespacedName]*stepOutcome{}, retryAt: map[types.NamespacedName]runTime{},
		reported: map[types.NamespacedName]runTime{}, owed: map[types.NamespacedName]transitions{},
		wake: make(chan event.GenericEvent, 1024)}
}

func (s *steps) put(key types.NamespacedName, o *stepOutcome) {
	s.mu.Lock()
	s.outcomes[key] = o
	s.mu.Unlock()
}

// take removes and returns the outcome left for the run with uid, if any.
func (s *steps) take(key types.NamespacedName, uid types.UID) *stepOutcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.outcomes[key]
	delete(s.outcomes, key)
	if o == nil || o.uid != uid {
		return nil
	}
	return o
}

func (s *steps) backoff(key types.NamespacedName, uid types.UID, at time.Time) {
	s.mu.Lock()
	s.retryAt[key] = runTime{uid: uid, at: at}
	s.mu.Unlock()
}

// notBefore is when the run may take its next step; zero when it may now.
func (s *steps) notBefore(key types.NamespacedName, uid types.UID, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.retryAt[key]
	if !ok || r.uid != uid || !now.Before(r.at) {
		delete(s.retryAt, key)
		return time.Time{}
	}
	return r.at
}

// reportedAt remembers that the run's status was patched at t.
func (s *steps) reportedAt(key types.NamespacedName, uid types.UID, t time.Time) {
	s.mu.Lock()
	s.reported[key] = runTime{uid: uid, at: t}
	s.mu.Unlock()
}

// reportDue reports whether the run's status was last patched by this process longer than
// statusInterval before now (or never).
func (s *steps) reportDue(key types.NamespacedName, uid types.UID, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reported[key]
	return !ok || r.uid != uid || now.Sub(r.at) >= statusInterval
}

// owe notes that this process saved the run's start or end: they are reported (events, the run
// span) once a status patch shows them, in this reconcile or, when its patch failed, a later one.
func (s *steps) owe(key types.NamespacedName, uid types.UID, start, ended bool) {
	if !start && !ended {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.owed[key]
	if o.uid != uid {
		o = transitions{uid: uid}
	}
	o.start, o.ended = o.start || start, o.ended || ended
	s.owed[key] = o
}

// shown returns what was owed for the run and clears it: a status patch has just shown it.
func (s *steps) shown(key types.NamespacedName, uid types.UID) (start, ended bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.owed[key]
	delete(s.owed, key)
	if !ok || o.uid != uid {
		return false, false
	}
	return o.start, o.ended
}

// drop discards the outcome and the backoff of a run's step: the run was cancelled, and what its
// aborted step left must not be applied. What it still owes is kept.
func (s *steps) drop(key types.NamespacedName) {
	s.mu.Lock()
	delete(s.outcomes, key)
	delete(s.retryAt, key)
	s.mu.Unlock()
}

// forget drops whatever is kept for a run that is gone or has ended.
func (s *steps) forget(key types.NamespacedName) {
	s.drop(key)
	s.mu.Lock()
	delete(s.reported, key)
	delete(s.owed, key)
	s.mu.Unlock()
}

// submitStep hands the run's next step to the executor. The step works on a copy of the state.
func (r *Reconciler) submitStep(s *scope, rt *stepper) error {
	raw, err := json.Marshal(s.rec.State)
	if err != nil {
		return fmt.Errorf("copying the run's state: %w", err)
	}
	st := &loop.State{}
	if err := json.Unmarshal(raw, st); err != nil {
		return fmt.Errorf("copying the run's state: %w", err)
	}
	key, uid, from, events := runKey(s.run), s.run.UID, s.rec, s.events
	if s.dirty {
		s.events = nil
	} else {
		events = nil
	}
	wake := &toolnexusv1alpha1.AgentRun{}
	wake.Name, wake.Namespace = s.run.Name, s.run.Namespace
	r.Executor.Submit(executor.Job{Key: key.String(), Share: s.run.Namespace, Run: func(ctx context.Context) {
		ctx = r.Tracing.Step(ctx, rt.trace)
		o := &stepOutcome{uid: uid, from: from, state: st, events: events}
		var tk *tools.Toolkit
		tk, o.mcpFailures, o.err = rt.Toolkit(ctx)
		if o.err == nil {
			o.toolsBuilt = true
			o.err = rt.Client.StepUntilSaved(ctx, st, tk, r.store.Limits().MaxRawBytes)
		}
		r.steps.put(key, o)
	}, Done: func(ctx context.Context) {
		// Once the key is free: the reconcile it wakes finds the step over and takes its outcome.
		kube.Wake(ctx, r.steps.wake, wake)
	}})
	return nil
}

// failureOf classifies the error a step ended with for Settle (nil: it finished).
func failureOf(err error) *state.Failure {
	var invalid *runspec.Error
	if errors.As(err, &invalid) {
		return &state.Failure{InvalidSpec: true, Message: clip.Marked(invalid.Error(), 2048)}
	}
	f := loop.Classify(err)
	if f != nil {
		f.Message = clip.Marked(f.Message, 2048)
	}
	return f
}

// runKey names a run in the executor and in steps.
func runKey(run *toolnexusv1alpha1.AgentRun) types.NamespacedName {
	return types.NamespacedName{Namespace: run.Namespace, Name: run.Name}
}

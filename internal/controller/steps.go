package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/executor"
	"github.com/toolnexus/operator/internal/loop"
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
	// base is the version of the record the step started from: the outcome applies only to it.
	base  string
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
	retryAt map[types.NamespacedName]retry
	// wake tells the controller a step finished.
	wake chan event.GenericEvent
}

type retry struct {
	uid types.UID
	at  time.Time
}

func newSteps() *steps {
	return &steps{outcomes: map[types.NamespacedName]*stepOutcome{}, retryAt: map[types.NamespacedName]retry{},
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
	s.retryAt[key] = retry{uid: uid, at: at}
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

// forget drops whatever is kept for a run that is gone or has ended.
func (s *steps) forget(key types.NamespacedName) {
	s.mu.Lock()
	delete(s.outcomes, key)
	delete(s.retryAt, key)
	s.mu.Unlock()
}

// notify wakes the run; it never blocks the step that calls it for longer than ctx lives.
func (s *steps) notify(ctx context.Context, run *toolnexusv1alpha1.AgentRun) {
	select {
	case s.wake <- event.GenericEvent{Object: run}:
	case <-ctx.Done():
	}
}

// submitStep hands the run's next step to the executor. The step works on a copy of the state.
func (r *AgentRunReconciler) submitStep(s *scope, rt *stepper) error {
	raw, err := json.Marshal(s.rec.State)
	if err != nil {
		return fmt.Errorf("copying the run's state: %w", err)
	}
	st := &loop.State{}
	if err := json.Unmarshal(raw, st); err != nil {
		return fmt.Errorf("copying the run's state: %w", err)
	}
	key, uid, base, events := runKey(s.run), s.run.UID, s.rec.version(), s.events
	if s.dirty {
		s.events = nil
	} else {
		events = nil
	}
	wake := &toolnexusv1alpha1.AgentRun{}
	wake.Name, wake.Namespace = s.run.Name, s.run.Namespace
	r.Executor.Submit(executor.Job{Key: key.String(), Share: s.run.Namespace, Run: func(ctx context.Context) {
		ctx = r.Tracing.Step(ctx, rt.trace)
		o := &stepOutcome{uid: uid, base: base, state: st, events: events}
		var tk *tools.Toolkit
		tk, o.mcpFailures, o.err = rt.toolkit(ctx)
		if o.err == nil {
			o.toolsBuilt = true
			o.err = takeSteps(ctx, rt.client, st, tk, r.maxTranscriptRawBytes())
		}
		r.steps.put(key, o)
		r.steps.notify(ctx, wake)
	}})
	return nil
}

// takeSteps runs the steps the state allows in one go: the tool calls of the turn and then the next
// model turn, stopping after a model turn that asks for tool calls, so that it is saved before
// they run, and before a model turn when the transcript has outgrown what a run may hold, so that
// the save ends the run instead of the transcript going to the model.
func takeSteps(ctx context.Context, c *loop.Client, st *loop.State, tk *tools.Toolkit, maxRaw int) error {
	for {
		next := st.Next()
		if next != loop.ActionModelTurn && next != loop.ActionToolCalls {
			return nil
		}
		if next == loop.ActionModelTurn && transcriptSize(st) > maxRaw {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		res, err := c.Step(ctx, st, tk)
		if err != nil {
			return err
		}
		if res.Action == loop.ActionModelTurn && st.Next() == loop.ActionToolCalls {
			return nil
		}
	}
}

// transcriptSize is what the transcript's texts add up to: a lower bound of its encoded size.
func transcriptSize(st *loop.State) int {
	n := 0
	for _, m := range st.Messages {
		n += len(m.Content)
		for _, tc := range m.ToolCalls {
			n += len(tc.Arguments)
		}
	}
	return n
}

// applyStep takes the outcome of the run's finished step into its state. It reports false when
// the outcome is stale (the record moved on meanwhile) and was dropped.
func (r *AgentRunReconciler) applyStep(s *scope, o *stepOutcome) bool {
	if o.base != s.rec.version() {
		return false
	}
	s.rec.State, s.dirty = o.state, true
	s.progress.toolsBuilt, s.progress.mcpFailures = o.toolsBuilt, o.mcpFailures
	s.events = append(o.events, s.events...)
	var invalid *specError
	switch {
	case o.err == nil:
	case errors.Is(o.err, context.Canceled):
		// Stopped by a cancellation or a lost leadership: what it finished is kept, the rest is
		// taken again.
	case errors.As(o.err, &invalid):
		s.rec.State.End(toolnexusv1alpha1.ReasonInvalidSpec, truncate(invalid.Error(), 2048))
	default:
		r.modelFailed(s, o.err)
	}
	return true
}

// modelFailed records a failed model request: a transient failure backs off (the run is requeued,
// no worker waits), others end the run with the provider's redacted message.
func (r *AgentRunReconciler) modelFailed(s *scope, err error) {
	retries := 0
	if s.spec.Model.Retries != nil { // defaulted by the CRD
		retries = int(*s.spec.Model.Retries)
	}
	st := s.rec.State
	delay, retry, msg := loop.ModelFailed(st, err, retries, retryBase)
	if !retry {
		st.End(toolnexusv1alpha1.ReasonModelError, truncate(msg, 2048))
		return
	}
	r.steps.backoff(runKey(s.run), s.run.UID, s.now.Add(delay))
	s.progress.reason = toolnexusv1alpha1.ReasonModelRetrying
	s.progress.message = fmt.Sprintf("Model request failed (attempt %d of %d), retrying in %s: %v", st.ModelFailures, retries+1, delay, err)
	s.event(func() {
		r.Recorder.Eventf(s.run, nil, corev1.EventTypeWarning, EventModelRetrying, actionStep, "%s", truncate(s.progress.message, 1024))
	})
}

// runKey names a run in the executor and in steps.
func runKey(run *toolnexusv1alpha1.AgentRun) types.NamespacedName {
	return types.NamespacedName{Namespace: run.Namespace, Name: run.Name}
}

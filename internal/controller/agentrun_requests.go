package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/runstore"
	"github.com/toolnexus/operator/internal/telemetry"
	"github.com/toolnexus/operator/internal/tools"
)

// requestsOf lists the PendingRequests the run controls (owner UID and all), from the cache, by name.
func (r *AgentRunReconciler) requestsOf(ctx context.Context, run *toolnexusv1alpha1.AgentRun) (map[string]*toolnexusv1alpha1.PendingRequest, error) {
	var list toolnexusv1alpha1.PendingRequestList
	if err := r.List(ctx, &list, client.InNamespace(run.Namespace), client.MatchingFields{ownerRunIndexField: run.Name}); err != nil {
		return nil, fmt.Errorf("listing PendingRequests: %w", err)
	}
	out := make(map[string]*toolnexusv1alpha1.PendingRequest, len(list.Items))
	for i := range list.Items {
		p := &list.Items[i]
		if metav1.IsControlledBy(p, run) {
			out[p.Name] = p
		}
	}
	return out, nil
}

// consumeAnswers hands every answered, expired or deleted request of a suspended call to the loop.
// An answer is read only from the request the record says this run created for the call (same
// name, same UID), and only when that request shows the call the record holds, so what runs is
// what the answerer saw; any other request ends the run (StateMismatch) and nothing runs.
func (r *AgentRunReconciler) consumeAnswers(ctx context.Context, s *scope) error {
	st := s.rec.State
	for _, call := range st.Suspended() {
		if call.Announced == nil {
			continue
		}
		name := call.Announced.Name
		preq := s.requests[name]
		if preq == nil {
			live, err := r.liveRequest(ctx, s.run.Namespace, name)
			if err != nil {
				return err
			}
			if live != nil && string(live.UID) == call.Announced.UID {
				continue // the cache has not seen it yet
			}
			if live != nil {
				r.fail(s, runstore.Mismatch("PendingRequest %s is not the request this run created for call %s (it was replaced)", name, call.ID))
				return nil
			}
			s.event(func() {
				r.Recorder.Eventf(s.run, nil, corev1.EventTypeWarning, EventRequestDeleted, actionAnswer,
					"PendingRequest %s was deleted before it was answered; the model is told the call was declined", name)
			})
			r.hand(s, call, tools.AnswerDeclined(call.Request.ID, "the PendingRequest was deleted"))
			continue
		}
		if err := verifyRequest(call, preq); err != nil {
			r.fail(s, err)
			return nil
		}
		if preq.Status.Answer != nil {
			r.consume(ctx, s, call, preq)
			continue
		}
		if exp := expiresAt(preq); exp.IsZero() || s.now.Before(exp) {
			continue
		}
		expired, err := r.expire(ctx, preq, s.now)
		if err != nil {
			return err
		}
		if !expired {
			continue // answered just before: the answer arrives with its event, and stands
		}
		s.event(func() {
			r.Recorder.Eventf(s.run, preq, corev1.EventTypeWarning, EventRequestExpired, actionAnswer, "PendingRequest %s expired unanswered", name)
			r.Metrics.suspensionWait.WithLabelValues(call.Request.Kind, tools.ReasonExpired).Observe(s.now.Sub(preq.CreationTimestamp.Time).Seconds())
			r.traceSuspension(ctx, s.run, preq, tools.ReasonExpired, s.now)
		})
		r.hand(s, call, tools.AnswerDeclined(call.Request.ID, tools.ReasonExpired))
		if p := s.spec.Suspension; p != nil && p.OnTimeout == toolnexusv1alpha1.OnTimeoutFail {
			st.End(toolnexusv1alpha1.ReasonRequestExpired,
				fmt.Sprintf("PendingRequest %s expired unanswered and spec.suspension.onTimeout is Fail", name))
		}
	}
	return nil
}

// consume records the answer of a verified request.
func (r *AgentRunReconciler) consume(ctx context.Context, s *scope, call loop.Call, preq *toolnexusv1alpha1.PendingRequest) {
	a, err := answerOf(preq.Status.Answer)
	if err == nil {
		err = s.rec.State.Answer(call.ID, a)
	}
	if err != nil {
		// Admission should have refused this answer; it is immutable now, so the call must not wait
		// forever: the model is told the answer was unusable.
		s.event(func() {
			r.Recorder.Eventf(preq, s.run, corev1.EventTypeWarning, EventInvalidAnswer, actionAnswer, "The answer cannot be used: %v", err)
		})
		r.hand(s, call, tools.AnswerDeclined(call.Request.ID, "invalid answer: "+err.Error()))
		return
	}
	s.dirty = true
	s.event(func() {
		r.Metrics.suspensionWait.WithLabelValues(call.Request.Kind, outcomeOf(a)).Observe(s.now.Sub(preq.CreationTimestamp.Time).Seconds())
		outcome := outcomeOf(a) // declined, expired or cancelled, as the metric says
		if a.OK {
			outcome = telemetry.OutcomeAnswered
		}
		r.traceSuspension(ctx, s.run, preq, outcome, s.now)
		r.Recorder.Eventf(s.run, preq, corev1.EventTypeNormal, EventRequestAnswered, actionAnswer,
			"PendingRequest %s answered by %s (ok: %t)", preq.Name, answererOf(preq), a.OK)
	})
}

// verifyRequest checks that preq is the request this run created for call, showing the call the
// record holds: same object (UID), same call, same request, and exactly the arguments the retry
// will run with.
func verifyRequest(call loop.Call, preq *toolnexusv1alpha1.PendingRequest) error {
	tc, rq := preq.Spec.ToolCall, preq.Spec.Request
	switch {
	case string(preq.UID) != call.Announced.UID:
		return runstore.Mismatch("PendingRequest %s is not the request this run created for call %s (it was replaced)", preq.Name, call.ID)
	case tc.ID != call.ID || tc.Name != call.Name:
		return runstore.Mismatch("PendingRequest %s shows call %s of %s, the run's record holds call %s of %s", preq.Name, tc.ID, tc.Name, call.ID, call.Name)
	case rq.ID != call.Request.ID || rq.Kind != call.Request.Kind:
		return runstore.Mismatch("PendingRequest %s shows request %s (%s), the run's record holds request %s (%s)", preq.Name, rq.ID, rq.Kind, call.Request.ID, call.Request.Kind)
	case tc.Arguments != call.Args:
		return runstore.Mismatch("PendingRequest %s shows other arguments for call %s than the run's record holds; the call does not run", preq.Name, call.ID)
	}
	return nil
}

// fail ends the run closed: nothing runs, its requests are cancelled, status says why.
func (r *AgentRunReconciler) fail(s *scope, err error) {
	reason := toolnexusv1alpha1.ReasonStateMismatch
	if bad, ok := err.(*runstore.CorruptError); ok {
		reason = bad.Reason
	}
	s.rec.State.End(reason, truncate(err.Error(), 1024))
	s.dirty = true
}

// nearestExpiry is when the first of the run's open requests expires; zero when none does.
func nearestExpiry(s *scope) time.Time {
	var wake time.Time
	for _, call := range s.rec.State.Suspended() {
		if call.Announced == nil || s.requests[call.Announced.Name] == nil {
			continue
		}
		if exp := expiresAt(s.requests[call.Announced.Name]); !exp.IsZero() && (wake.IsZero() || exp.Before(wake)) {
			wake = exp
		}
	}
	return wake
}

// hand records a refusal the controller decided on (expiry, deletion, an unusable answer).
func (r *AgentRunReconciler) hand(s *scope, call loop.Call, a tools.Answer) {
	if err := s.rec.State.Answer(call.ID, a); err == nil {
		s.dirty = true
	}
}

// liveRequest reads a request around the cache; nil when it does not exist.
func (r *AgentRunReconciler) liveRequest(ctx context.Context, namespace, name string) (*toolnexusv1alpha1.PendingRequest, error) {
	preq := &toolnexusv1alpha1.PendingRequest{}
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, preq)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading PendingRequest %s: %w", name, err)
	}
	return preq, nil
}

// expire answers a request {ok: false, reason: expired} as system:expired. It reports false when
// someone answered first (the API server refuses to change an answer): their answer stands.
func (r *AgentRunReconciler) expire(ctx context.Context, preq *toolnexusv1alpha1.PendingRequest, now time.Time) (bool, error) {
	expired := preq.DeepCopy()
	expired.Status.Answer = &toolnexusv1alpha1.Answer{OK: false, Reason: tools.ReasonExpired}
	expired.Status.AnsweredBy = toolnexusv1alpha1.ExpiredAnswerer
	expired.Status.AnsweredAt = &metav1.Time{Time: now}
	if _, err := patchStatus(ctx, r.Client, expired, preq); err != nil {
		if apierrors.IsInvalid(err) {
			return false, nil
		}
		return false, fmt.Errorf("expiring PendingRequest %s: %w", preq.Name, err)
	}
	expired.DeepCopyInto(preq)
	return true, nil
}

// announce creates the PendingRequest of every suspended call that has none yet and marks the
// call with it. It runs after the record that holds the suspension was saved, so a crash in
// between re-creates the same request (deterministic name and spec). A request that already
// exists is adopted only when this run controls it and its spec is the one the run would
// create; anything else ends the run closed, naming the object.
func (r *AgentRunReconciler) announce(ctx context.Context, s *scope) error {
	st := s.rec.State
	for i := range st.Calls {
		call := &st.Calls[i]
		if call.Phase != loop.PhaseSuspended || call.Announced != nil {
			continue
		}
		preq, err := newPendingRequest(s.run, s.spec.Suspension, st.Turn, *call)
		if err != nil {
			return err
		}
		if err := controllerutil.SetControllerReference(s.run, preq, r.Scheme); err != nil {
			return err
		}
		want := preq.Spec
		err = r.Create(ctx, preq)
		if apierrors.IsAlreadyExists(err) {
			// Created before a crash, possibly answered since: read it as it is now.
			if err = r.APIReader.Get(ctx, client.ObjectKeyFromObject(preq), preq); err == nil {
				if !metav1.IsControlledBy(preq, s.run) || !equality.Semantic.DeepEqual(preq.Spec, want) {
					r.fail(s, runstore.Mismatch("PendingRequest %s exists but is not the request this run would create for call %s; delete it or rename the run", preq.Name, call.ID))
					return nil
				}
			}
		}
		if err != nil {
			return fmt.Errorf("creating PendingRequest %s: %w", preq.Name, err)
		}
		s.requests[preq.Name] = preq
		call.Announced = &loop.Announcement{Name: preq.Name, UID: string(preq.UID)}
		s.dirty = true
		name, tool, kind := preq.Name, call.Name, call.Request.Kind
		s.event(func() {
			r.Recorder.Eventf(s.run, preq, corev1.EventTypeNormal, EventToolSuspended, actionStep,
				"Tool %s suspended (%s); answer PendingRequest %s", tool, kind, name)
		})
	}
	if !s.dirty {
		return nil
	}
	return r.save(ctx, s)
}

// requestFate is where the saved state leaves a request.
type requestFate int

const (
	// requestOpen: its call still waits on it.
	requestOpen requestFate = iota
	// requestDone: its call moved on (the answer was consumed, or the call was settled otherwise).
	requestDone
	// requestDropped: the run ended while its call still waited on it.
	requestDropped
)

// syncRequests projects the saved state onto the run's requests: a request is open while the
// call it was created for still waits on it; once the saved state holds its answer (or the turn
// moved on) it is Resolved, and when the run ended first it is Resolved with reason RunGone.
func (r *AgentRunReconciler) syncRequests(ctx context.Context, s *scope) error {
	waiting := map[string]bool{}
	for _, c := range s.rec.State.Suspended() {
		if c.Announced != nil {
			waiting[c.Announced.Name+"/"+c.Announced.UID] = true
		}
	}
	for name, preq := range s.requests {
		fate := requestDone
		if waiting[name+"/"+string(preq.UID)] {
			fate = requestOpen
			if s.rec.State.Ended() {
				fate = requestDropped
			}
		}
		if fate == requestDone && preq.Status.Answer == nil {
			// The state consumed its answer, which the cache does not show yet (this manager's
			// own expiry among them): read it, rather than report the request cancelled.
			live, err := r.liveRequest(ctx, preq.Namespace, preq.Name)
			if err != nil {
				return err
			}
			if live == nil {
				continue
			}
			preq = live
		}
		before := preq.DeepCopy()
		setRequestStatus(preq, fate)
		if _, err := patchStatus(ctx, r.Client, preq, before); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("updating PendingRequest %s status: %w", name, err)
		}
		// Cancelled unanswered (the run ended first): an answer that declined with reason cancelled
		// had its span written when the state consumed it.
		if cancelled := toolnexusv1alpha1.RequestPhaseCancelled; preq.Status.Phase == cancelled && before.Status.Phase != cancelled && preq.Status.Answer == nil {
			r.traceSuspension(ctx, s.run, preq, tools.ReasonCancelled, s.now)
		}
	}
	return nil
}

// setRequestStatus derives a request's phase and its Answered and Resolved conditions from where
// the saved state leaves it.
func setRequestStatus(preq *toolnexusv1alpha1.PendingRequest, fate requestFate) {
	cancelled := fate != requestOpen && preq.Status.Answer == nil
	preq.Status.Phase = requestPhase(preq, cancelled)
	preq.Status.ObservedGeneration = preq.Generation
	setAnswered(preq, cancelled)
	setResolved(preq, fate, cancelled)
}

// setAnswered is True once an answer is there, with a reason saying which.
func setAnswered(preq *toolnexusv1alpha1.PendingRequest, cancelled bool) {
	a := preq.Status.Answer
	switch {
	case a != nil && a.OK:
		setCondition(preq, toolnexusv1alpha1.ConditionAnswered, metav1.ConditionTrue, toolnexusv1alpha1.ReasonApproved, "Answered ok by "+answererOf(preq))
	case a != nil && preq.Status.Phase == toolnexusv1alpha1.RequestPhaseExpired:
		setCondition(preq, toolnexusv1alpha1.ConditionAnswered, metav1.ConditionTrue, toolnexusv1alpha1.ReasonExpired, "Expired unanswered")
	case a != nil:
		setCondition(preq, toolnexusv1alpha1.ConditionAnswered, metav1.ConditionTrue, toolnexusv1alpha1.ReasonDeclined, "Declined by "+answererOf(preq))
	case cancelled:
		setCondition(preq, toolnexusv1alpha1.ConditionAnswered, metav1.ConditionFalse, toolnexusv1alpha1.ReasonRunGone, "The run ended before an answer came")
	default:
		setCondition(preq, toolnexusv1alpha1.ConditionAnswered, metav1.ConditionFalse, toolnexusv1alpha1.ReasonAwaitingAnswer, "Waiting for status.answer")
	}
}

// setResolved is True once the saved state no longer waits on the request.
func setResolved(preq *toolnexusv1alpha1.PendingRequest, fate requestFate, cancelled bool) {
	switch {
	case fate == requestOpen:
		setCondition(preq, toolnexusv1alpha1.ConditionResolved, metav1.ConditionFalse, toolnexusv1alpha1.ReasonAnswerPending, "The run has not consumed an answer yet")
	case cancelled:
		setCondition(preq, toolnexusv1alpha1.ConditionResolved, metav1.ConditionTrue, toolnexusv1alpha1.ReasonRunGone, "The run ended; the request was cancelled")
	case fate == requestDropped:
		setCondition(preq, toolnexusv1alpha1.ConditionResolved, metav1.ConditionTrue, toolnexusv1alpha1.ReasonRunGone, "The run ended before it consumed the answer")
	default:
		setCondition(preq, toolnexusv1alpha1.ConditionResolved, metav1.ConditionTrue, toolnexusv1alpha1.ReasonAnswerConsumed, "The run has consumed the answer")
	}
}

// openSummaries lists the run's open requests for status.pending, in call order.
func openSummaries(s *scope) []toolnexusv1alpha1.PendingSummary {
	if s.rec.State.Ended() {
		return nil
	}
	var out []toolnexusv1alpha1.PendingSummary
	for _, c := range s.rec.State.Suspended() {
		if c.Announced == nil {
			continue
		}
		out = append(out, toolnexusv1alpha1.PendingSummary{
			Name: c.Announced.Name, Kind: c.Request.Kind, Prompt: truncate(c.Request.Prompt, maxStatusPrompt), URL: c.Request.URL, ToolCallID: c.ID,
		})
	}
	return out
}

func answererOf(preq *toolnexusv1alpha1.PendingRequest) string {
	if preq.Status.AnsweredBy == "" {
		return "an unknown user"
	}
	return preq.Status.AnsweredBy
}

// outcomeOf is the metric label of an answer: ok, or a refusal reason from a closed vocabulary
// (free-text reasons count as declined, keeping the label's cardinality bounded).
func outcomeOf(a tools.Answer) string {
	switch {
	case a.OK:
		return "ok"
	case a.Reason == tools.ReasonExpired || a.Reason == tools.ReasonCancelled:
		return a.Reason
	}
	return tools.ReasonDeclined
}

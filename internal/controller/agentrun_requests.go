package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/tools"
)

// requestsOf lists the run's PendingRequests from the cache, by name.
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

// consumeAnswers hands every answered, expired or deleted request of a suspended call to the loop,
// exactly once: the loop state records the answer, and the record is saved before the request is
// marked Resolved.
func (r *AgentRunReconciler) consumeAnswers(ctx context.Context, s *scope) error {
	st := s.rec.State
	for _, call := range st.Suspended() {
		name, announced := s.rec.Announced[call.ID]
		if !announced {
			continue
		}
		preq := s.requests[name]
		if preq == nil {
			gone, err := r.requestGone(ctx, s.run.Namespace, name)
			if err != nil || !gone {
				return err
			}
			r.Recorder.Eventf(s.run, nil, corev1.EventTypeWarning, EventRequestDeleted, actionAnswer,
				"PendingRequest %s was deleted before it was answered; the model is told the call was declined", name)
			r.hand(s, call, tools.AnswerDeclined(call.Request.ID, "the PendingRequest was deleted"), name)
			continue
		}
		if preq.Status.Answer != nil {
			a, err := answerOf(preq.Status.Answer)
			if err == nil {
				err = st.Answer(call.ID, a)
			}
			if err != nil {
				// Admission should have refused this answer; it is immutable now, so the call must
				// not wait forever: the model is told the answer was unusable.
				r.Recorder.Eventf(preq, s.run, corev1.EventTypeWarning, EventInvalidAnswer, actionAnswer, "The answer cannot be used: %v", err)
				r.hand(s, call, tools.AnswerDeclined(call.Request.ID, "invalid answer: "+err.Error()), name)
				continue
			}
			s.markConsumed(name)
			r.Metrics.suspensionWait.WithLabelValues(call.Request.Kind, outcomeOf(a)).Observe(s.now.Sub(preq.CreationTimestamp.Time).Seconds())
			r.Recorder.Eventf(s.run, preq, corev1.EventTypeNormal, EventRequestAnswered, actionAnswer,
				"PendingRequest %s answered by %s (ok: %t)", name, answererOf(preq), a.OK)
			continue
		}
		if exp := expiresAt(preq); exp.IsZero() || s.now.Before(exp) {
			continue
		}
		if err := r.expire(ctx, preq, s.now); err != nil {
			return err
		}
		r.Recorder.Eventf(s.run, preq, corev1.EventTypeWarning, EventRequestExpired, actionAnswer, "PendingRequest %s expired unanswered", name)
		r.Metrics.suspensionWait.WithLabelValues(call.Request.Kind, tools.ReasonExpired).Observe(s.now.Sub(preq.CreationTimestamp.Time).Seconds())
		r.hand(s, call, tools.AnswerDeclined(call.Request.ID, tools.ReasonExpired), name)
		if p := s.run.Spec.Suspension; p != nil && p.OnTimeout == toolnexusv1alpha1.OnTimeoutFail {
			s.rec.Outcome = &outcome{Reason: toolnexusv1alpha1.ReasonRequestExpired,
				Message: fmt.Sprintf("PendingRequest %s expired unanswered and spec.suspension.onTimeout is Fail", name)}
		}
	}
	return nil
}

// nearestExpiry is when the first of the run's open requests expires; zero when none does.
func nearestExpiry(s *scope) time.Time {
	var wake time.Time
	for _, call := range s.rec.State.Suspended() {
		preq := s.requests[s.rec.Announced[call.ID]]
		if preq == nil {
			continue
		}
		if exp := expiresAt(preq); !exp.IsZero() && (wake.IsZero() || exp.Before(wake)) {
			wake = exp
		}
	}
	return wake
}

// hand records a refusal the controller decided on (expiry, deletion, an unusable answer).
func (r *AgentRunReconciler) hand(s *scope, call loop.Call, a tools.Answer, name string) {
	if err := s.rec.State.Answer(call.ID, a); err == nil {
		s.markConsumed(name)
	}
}

func (s *scope) markConsumed(name string) {
	if s.consumed == nil {
		s.consumed = map[string]bool{}
	}
	s.consumed[name] = true
}

// requestGone confirms, around the cache, that a request the run created no longer exists.
func (r *AgentRunReconciler) requestGone(ctx context.Context, namespace, name string) (bool, error) {
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &toolnexusv1alpha1.PendingRequest{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	return false, err
}

// expire answers a request {ok: false, reason: expired} as system:expired.
func (r *AgentRunReconciler) expire(ctx context.Context, preq *toolnexusv1alpha1.PendingRequest, now time.Time) error {
	before := preq.DeepCopy()
	preq.Status.Answer = &toolnexusv1alpha1.Answer{OK: false, Reason: tools.ReasonExpired}
	preq.Status.AnsweredBy = toolnexusv1alpha1.ExpiredAnswerer
	preq.Status.AnsweredAt = &metav1.Time{Time: now}
	if err := r.Status().Patch(ctx, preq, client.MergeFrom(before)); err != nil {
		if apierrors.IsInvalid(err) {
			// Someone answered in the meantime: their answer stands and arrives with the next event.
			return nil
		}
		return fmt.Errorf("expiring PendingRequest %s: %w", preq.Name, err)
	}
	return nil
}

// announce creates the PendingRequest of every suspended call that has none yet. It runs after the
// record that holds the suspension was saved, so a crash in between re-creates the same request
// (deterministic name) instead of losing it.
func (r *AgentRunReconciler) announce(ctx context.Context, s *scope) error {
	changed := false
	for _, call := range s.rec.State.Suspended() {
		if _, done := s.rec.Announced[call.ID]; done {
			continue
		}
		preq, err := newPendingRequest(s.run, s.rec.State.Turn, call, s.now)
		if err != nil {
			return err
		}
		if err := controllerutil.SetControllerReference(s.run, preq, r.Scheme); err != nil {
			return err
		}
		err = r.Create(ctx, preq)
		if apierrors.IsAlreadyExists(err) {
			// Created before a crash, possibly answered since: read it as it is now.
			err = r.APIReader.Get(ctx, client.ObjectKeyFromObject(preq), preq)
		}
		if err != nil {
			return fmt.Errorf("creating PendingRequest %s: %w", preq.Name, err)
		}
		s.requests[preq.Name] = preq
		if s.rec.Announced == nil {
			s.rec.Announced = map[string]string{}
		}
		s.rec.Announced[call.ID] = preq.Name
		changed = true
		r.Recorder.Eventf(s.run, preq, corev1.EventTypeNormal, EventToolSuspended, actionStep,
			"Tool %s suspended (%s); answer PendingRequest %s", call.Name, call.Request.Kind, preq.Name)
	}
	if !changed {
		return nil
	}
	return r.save(ctx, s)
}

// syncRequests keeps each request's phase and Answered/Resolved conditions in step with the run.
func (r *AgentRunReconciler) syncRequests(ctx context.Context, s *scope) error {
	waiting := map[string]bool{}
	ended := s.rec.Outcome != nil || s.rec.State.Status != ""
	for _, c := range s.rec.State.Calls {
		if c.Phase == loop.PhaseSuspended || c.Phase == loop.PhaseAnswered {
			waiting[s.rec.Announced[c.ID]] = !s.consumed[s.rec.Announced[c.ID]] && c.Phase == loop.PhaseSuspended
		}
	}
	for name, preq := range s.requests {
		if preq.ResourceVersion == "" {
			continue // created this reconcile; its first status comes with the next event
		}
		open := waiting[name] && !ended
		before := preq.DeepCopy()
		cancelled := !open && preq.Status.Answer == nil
		preq.Status.Phase = requestPhase(preq, cancelled)
		preq.Status.ObservedGeneration = preq.Generation
		answered := metav1.Condition{Type: toolnexusv1alpha1.ConditionAnswered, Status: metav1.ConditionFalse,
			Reason: toolnexusv1alpha1.ReasonAwaitingAnswer, Message: "Waiting for status.answer", ObservedGeneration: preq.Generation}
		if a := preq.Status.Answer; a != nil {
			answered.Status, answered.Reason, answered.Message = metav1.ConditionTrue, toolnexusv1alpha1.ReasonApproved, "Answered ok by "+answererOf(preq)
			if !a.OK {
				answered.Reason, answered.Message = toolnexusv1alpha1.ReasonDeclined, "Declined by "+answererOf(preq)
				if preq.Status.Phase == toolnexusv1alpha1.RequestPhaseExpired {
					answered.Reason, answered.Message = toolnexusv1alpha1.ReasonExpired, "Expired unanswered"
				}
			}
		} else if cancelled {
			answered.Reason, answered.Message = toolnexusv1alpha1.ReasonRunGone, "The run ended before an answer came"
		}
		meta.SetStatusCondition(&preq.Status.Conditions, answered)
		resolved := metav1.Condition{Type: toolnexusv1alpha1.ConditionResolved, Status: metav1.ConditionFalse,
			Reason: toolnexusv1alpha1.ReasonAnswerPending, Message: "The run has not consumed an answer yet", ObservedGeneration: preq.Generation}
		if !open {
			resolved.Status, resolved.Reason, resolved.Message = metav1.ConditionTrue, toolnexusv1alpha1.ReasonAnswerConsumed, "The run has consumed the answer"
			if cancelled {
				resolved.Reason, resolved.Message = toolnexusv1alpha1.ReasonRunGone, "The run ended; the request was cancelled"
			}
		}
		meta.SetStatusCondition(&preq.Status.Conditions, resolved)
		if equality.Semantic.DeepEqual(before.Status, preq.Status) {
			continue
		}
		if err := r.Status().Patch(ctx, preq, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("updating PendingRequest %s status: %w", name, err)
		}
	}
	return nil
}

// openSummaries lists the run's open requests for status.pending, in call order.
func openSummaries(s *scope) []toolnexusv1alpha1.PendingSummary {
	if s.rec.Outcome != nil || s.rec.State.Status != "" {
		return nil
	}
	var out []toolnexusv1alpha1.PendingSummary
	for _, c := range s.rec.State.Suspended() {
		name, ok := s.rec.Announced[c.ID]
		if !ok {
			continue
		}
		out = append(out, toolnexusv1alpha1.PendingSummary{
			Name: name, Kind: c.Request.Kind, Prompt: truncate(c.Request.Prompt, maxStatusPrompt), URL: c.Request.URL, ToolCallID: c.ID,
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

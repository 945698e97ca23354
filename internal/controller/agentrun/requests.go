package agentrun

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
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/kube"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/telemetry"
	"github.com/toolnexus/operator/internal/tools"
)

// requestsOf lists the PendingRequests the run controls (owner UID and all), from the cache, by name.
func (r *Reconciler) requestsOf(ctx context.Context, run *toolnexusv1alpha1.AgentRun) (map[string]*toolnexusv1alpha1.PendingRequest, error) {
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

// settle asks the run's state what happened since it was saved (the end of its step, a
// cancellation, its requests as seen now) and carries out what it decides: the expiries to write,
// the step to abort, the backoff to keep, the events to report. An expiry written is settled at
// once, as its request now shows it. It returns when the run must be looked at again.
func (r *Reconciler) settle(ctx context.Context, s *scope, end *state.StepEnd, seen []state.Seen) (time.Time, error) {
	out := state.Settle(s.rec.State, end, seen, s.now, r.policyOf(s))
	if out.Changed {
		s.dirty = true
	}
	key, expired := runKey(s.run), false
	for _, e := range out.Effects {
		switch e.Kind {
		case state.EffectExpire:
			ok, err := r.expire(ctx, s.requests[e.Name], s.now)
			if err != nil {
				return time.Time{}, err
			}
			// Not written: answered just before; the answer arrives with its event, and stands.
			expired = expired || ok
		case state.EffectCancelStep:
			r.Executor.Cancel(key.String()) // in-flight I/O of a cancelled run is aborted
			r.steps.drop(key)
		case state.EffectCancelWait:
			r.cancelWait(ctx, s, e)
		case state.EffectRetry:
			r.steps.backoff(key, s.run.UID, e.At)
			s.progress.reason, s.progress.message = toolnexusv1alpha1.ReasonModelRetrying, e.Message
			s.event(func() {
				r.Recorder.Eventf(s.run, nil, corev1.EventTypeWarning, EventModelRetrying, actionStep, "%s", clip.Marked(e.Message, 1024))
			})
		default:
			r.report(ctx, s, e)
		}
	}
	if expired {
		seen, err := r.seen(ctx, s)
		if err != nil {
			return time.Time{}, err
		}
		return r.settle(ctx, s, nil, seen)
	}
	return out.WakeAt, nil
}

// policyOf is what the run's spec says Settle must do about its requests and its model.
func (r *Reconciler) policyOf(s *scope) state.Policy {
	p := state.Policy{Cancel: s.run.Spec.Cancel, RetryBase: retryBase}
	if s.spec != nil {
		if sp := s.spec.Suspension; sp != nil {
			p.OnTimeoutFail = sp.OnTimeout == toolnexusv1alpha1.OnTimeoutFail
		}
		if n := s.spec.Model.Retries; n != nil { // defaulted by the CRD
			p.Retries = int(*n)
		}
	}
	return p
}

// seen reads the request of every suspended call of the saved state, as Settle needs it: from the
// cache, or, when the cache has not seen it, around it (absent there too: it was deleted). Only
// the requests the run created are kept for the projection; another object under a request's name
// is handed to Settle as it is, and ends the run closed.
func (r *Reconciler) seen(ctx context.Context, s *scope) ([]state.Seen, error) {
	var out []state.Seen
	for _, open := range s.rec.State.Open() {
		announced := open.Ask.Announced
		if announced == nil {
			continue
		}
		name := announced.Name
		preq := s.requests[name]
		if preq == nil {
			live, err := r.liveRequest(ctx, s.run.Namespace, name)
			if err != nil {
				return nil, err
			}
			if live == nil {
				out = append(out, state.Seen{Name: name, Gone: true})
				continue
			}
			if string(live.UID) == announced.UID && metav1.IsControlledBy(live, s.run) {
				s.requests[name] = live // the cache has not seen it yet
			}
			preq = live
		}
		out = append(out, seenOf(preq))
	}
	return out, nil
}

// seenOf is a PendingRequest as Settle reads it.
func seenOf(preq *toolnexusv1alpha1.PendingRequest) state.Seen {
	tc, rq := preq.Spec.ToolCall, preq.Spec.Request
	s := state.Seen{Name: preq.Name, UID: string(preq.UID), CallID: tc.ID, CallName: tc.Name, Args: tc.Arguments,
		RequestID: rq.ID, Kind: rq.Kind, AnsweredBy: preq.Status.AnsweredBy}
	a := preq.Status.Answer
	if a == nil {
		return s
	}
	if ans, err := answerOf(a); err != nil {
		s.AnswerError = err.Error()
	} else {
		s.Answer = &ans
	}
	s.ByExpiry = !a.OK && a.Reason == tools.ReasonExpired && preq.Status.AnsweredBy == toolnexusv1alpha1.ExpiredAnswerer
	if at := preq.Status.AnsweredAt; at != nil {
		s.AnsweredAt = at.Time
	}
	return s
}

// report records what Settle decided about a request (events, metrics, the suspension's span),
// once the writes it depends on are made.
func (r *Reconciler) report(ctx context.Context, s *scope, e state.Effect) {
	preq := s.requests[e.Name]
	wait := func(kind, outcome string) {
		if preq != nil {
			r.Metrics.SuspensionWait.WithLabelValues(kind, outcome).Observe(s.now.Sub(preq.CreationTimestamp.Time).Seconds())
		}
	}
	kind := ""
	for _, c := range s.rec.State.Calls {
		for _, a := range c.Asks() {
			if c.ID == e.CallID && a.Announced != nil && a.Announced.Name == e.Name {
				kind = a.Request.Kind
			}
		}
	}
	s.event(func() {
		switch e.Kind {
		case state.EffectConsumed:
			outcome := outcomeOf(*e.Answer) // declined, expired or cancelled, as the metric says
			wait(kind, outcome)
			if e.Answer.OK {
				outcome = telemetry.OutcomeAnswered
			}
			if preq != nil {
				r.traceSuspension(ctx, s.run, preq, outcome, s.now)
				r.Recorder.Eventf(s.run, preq, corev1.EventTypeNormal, EventRequestAnswered, actionAnswer,
					"PendingRequest %s answered by %s (ok: %t)", preq.Name, answererOf(preq), e.Answer.OK)
			}
		case state.EffectExpired:
			wait(kind, tools.ReasonExpired)
			r.Recorder.Eventf(s.run, preq, corev1.EventTypeWarning, EventRequestExpired, actionAnswer, "PendingRequest %s expired unanswered", e.Name)
			if preq != nil {
				r.traceSuspension(ctx, s.run, preq, tools.ReasonExpired, s.now)
			}
		case state.EffectLateAnswer:
			wait(kind, tools.ReasonExpired)
			r.Recorder.Eventf(s.run, preq, corev1.EventTypeWarning, EventRequestExpired, actionAnswer,
				"PendingRequest %s was answered after it expired; the call does not run with that answer", e.Name)
		case state.EffectDeleted:
			r.Recorder.Eventf(s.run, nil, corev1.EventTypeWarning, EventRequestDeleted, actionAnswer,
				"PendingRequest %s was deleted before it was answered; the model is told the call was declined", e.Name)
		case state.EffectInvalidAnswer:
			if preq != nil {
				r.Recorder.Eventf(preq, s.run, corev1.EventTypeWarning, EventInvalidAnswer, actionAnswer, "The answer cannot be used: %s", e.Message)
			}
		}
	})
}

// liveRequest reads a request around the cache; nil when it does not exist.
func (r *Reconciler) liveRequest(ctx context.Context, namespace, name string) (*toolnexusv1alpha1.PendingRequest, error) {
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
func (r *Reconciler) expire(ctx context.Context, preq *toolnexusv1alpha1.PendingRequest, now time.Time) (bool, error) {
	if preq == nil {
		return false, nil // not the run's own request: Settle ended the run instead
	}
	expired := preq.DeepCopy()
	expired.Status.Answer = &toolnexusv1alpha1.Answer{OK: false, Reason: tools.ReasonExpired}
	expired.Status.AnsweredBy = toolnexusv1alpha1.ExpiredAnswerer
	expired.Status.AnsweredAt = &metav1.Time{Time: now}
	if _, err := kube.PatchStatus(ctx, r.Client, expired, preq); err != nil {
		if apierrors.IsInvalid(err) {
			return false, nil
		}
		return false, fmt.Errorf("expiring PendingRequest %s: %w", preq.Name, err)
	}
	expired.DeepCopyInto(preq)
	return true, nil
}

// announce creates the PendingRequest of every request of a suspended call that has none yet
// (one per request: a round has several) and marks the call with it. It runs after the record
// that holds the suspension was saved, so a crash in between re-creates the same request
// (deterministic name and spec). A request that already exists is adopted only when this run
// controls it and its spec is the one the run would create; anything else ends the run closed,
// naming the object.
func (r *Reconciler) announce(ctx context.Context, s *scope) error {
	st := s.rec.State
	for i := range st.Calls {
		if st.Calls[i].Phase != loop.PhaseSuspended {
			continue
		}
		for _, ask := range st.Calls[i].Asks() {
			if ask.Announced != nil {
				continue
			}
			if err := r.announceAsk(ctx, s, &st.Calls[i], ask); err != nil || st.Ended() {
				return err
			}
		}
	}
	return nil
}

// announceAsk creates the PendingRequest of the request ask of call (see announce).
func (r *Reconciler) announceAsk(ctx context.Context, s *scope, call *loop.Call, ask state.Ask) error {
	st := s.rec.State
	preq, err := newPendingRequest(s.run, s.spec.Suspension, st.Turn, *call, ask, r.Audit)
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
			if !metav1.IsControlledBy(preq, s.run) && preq.DeletionTimestamp != nil {
				// A previous run of this name left it, deleted but kept until its audit events
				// are delivered: this request waits for the name (its deletion wakes the run).
				s.progress.reason = toolnexusv1alpha1.ReasonRequestNameInUse
				s.progress.message = fmt.Sprintf("PendingRequest %s of a previous run named %s is being deleted (its audit events "+
					"are still being delivered); this run's request is created once it is gone", preq.Name, s.run.Name)
				return nil
			}
			if !metav1.IsControlledBy(preq, s.run) || !equality.Semantic.DeepEqual(preq.Spec, want) {
				st.End(toolnexusv1alpha1.ReasonStateMismatch, fmt.Sprintf(
					"PendingRequest %s exists but is not the request this run would create for call %s; delete it or rename the run", preq.Name, call.ID))
				s.dirty = true
				return nil
			}
		}
	}
	if err != nil {
		return fmt.Errorf("creating PendingRequest %s: %w", preq.Name, err)
	}
	s.requests[preq.Name] = preq
	call.Announce(ask.Index, loop.Announcement{Name: preq.Name, UID: string(preq.UID)})
	s.dirty = true
	name, tool, kind := preq.Name, call.Name, ask.Request.Kind
	s.event(func() {
		r.Recorder.Eventf(s.run, preq, corev1.EventTypeNormal, EventToolSuspended, actionStep,
			"Tool %s suspended (%s); answer PendingRequest %s", tool, kind, name)
	})
	return nil
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
	// requestTaken: the state holds its answer, and its call has not run with it yet.
	requestTaken
	// requestPassed: it approved a gate of its call, which now waits on a later gate.
	requestPassed
	// requestWithdrawn: its call moved on without its answer while the run goes on (another
	// request of the call's round was refused, the work that asked it ended).
	requestWithdrawn
)

// syncRequests projects the saved state onto the run's requests: a request is open while the
// call it was created for still waits on it; once the saved state holds its answer (or the turn
// moved on) it is Resolved, and when the run ended first it is Resolved with reason RunGone.
func (r *Reconciler) syncRequests(ctx context.Context, s *scope) error {
	waiting, taken, passing := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, c := range s.rec.State.Calls {
		for _, a := range c.Asks() {
			if a.Announced == nil {
				continue
			}
			key := a.Announced.Name + "/" + a.Announced.UID
			switch {
			case c.Phase == loop.PhaseSuspended && a.Answer == nil:
				waiting[key] = true
				if c.Gated && len(c.Passed) > 0 {
					passing[c.ID] = true // its earlier gates' requests passed it on
				}
			case c.Phase == loop.PhaseSuspended, c.Phase == loop.PhaseAnswered:
				// Taken in; its call runs once every request of its round is answered.
				taken[key] = true
			}
		}
	}
	for name, preq := range s.requests {
		fate, key := requestDone, name+"/"+string(preq.UID)
		switch {
		case waiting[key] || taken[key]:
			fate = requestOpen
			if taken[key] {
				fate = requestTaken
			}
			if s.rec.State.Ended() {
				fate = requestDropped
			}
		case passing[preq.Spec.ToolCall.ID] && preq.Status.Answer != nil && preq.Status.Answer.OK:
			fate = requestPassed
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
			if preq.Status.Answer == nil && !s.rec.State.Ended() {
				fate = requestWithdrawn
			}
		}
		before := preq.DeepCopy()
		setRequestStatus(preq, fate, s.now)
		if _, err := kube.PatchStatus(ctx, r.Client, preq, before); err != nil && !apierrors.IsNotFound(err) {
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
func setRequestStatus(preq *toolnexusv1alpha1.PendingRequest, fate requestFate, now time.Time) {
	cancelled := fate != requestOpen && preq.Status.Answer == nil
	preq.Status.Phase = requestPhase(preq, cancelled)
	preq.Status.ObservedGeneration = preq.Generation
	setAnswered(preq, fate, cancelled, now)
	setResolved(preq, fate, cancelled, now)
}

// setAnswered is True once an answer is there, with a reason saying which.
func setAnswered(preq *toolnexusv1alpha1.PendingRequest, fate requestFate, cancelled bool, now time.Time) {
	a := preq.Status.Answer
	switch {
	case a != nil && a.OK && (preq.Spec.Request.Kind == tools.KindApproval || preq.Spec.Request.Kind == tools.KindAuthorization):
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionAnswered, metav1.ConditionTrue, toolnexusv1alpha1.ReasonApproved, "Approved by "+answererOf(preq))
	case a != nil && a.OK:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionAnswered, metav1.ConditionTrue, toolnexusv1alpha1.ReasonAnswered, "Answered by "+answererOf(preq))
	case a != nil && preq.Status.Phase == toolnexusv1alpha1.RequestPhaseExpired:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionAnswered, metav1.ConditionTrue, toolnexusv1alpha1.ReasonExpired, "Expired unanswered")
	case a != nil:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionAnswered, metav1.ConditionTrue, toolnexusv1alpha1.ReasonDeclined, "Declined by "+answererOf(preq))
	case cancelled && fate == requestWithdrawn:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionAnswered, metav1.ConditionFalse, toolnexusv1alpha1.ReasonRunGone, "Its call moved on before an answer came")
	case cancelled:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionAnswered, metav1.ConditionFalse, toolnexusv1alpha1.ReasonRunGone, "The run ended before an answer came")
	default:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionAnswered, metav1.ConditionFalse, toolnexusv1alpha1.ReasonAwaitingAnswer, "Waiting for status.answer")
	}
}

// setResolved is True once the saved state no longer waits on the request: AnswerConsumed once its
// call ran with the answer (the tool, or the tool's own suspension after its gates), GatePassed
// when the answer approved a gate and the call went on to a later one (it stays so, whatever the
// later gate decides).
func setResolved(preq *toolnexusv1alpha1.PendingRequest, fate requestFate, cancelled bool, now time.Time) {
	if c := meta.FindStatusCondition(preq.Status.Conditions, toolnexusv1alpha1.ConditionResolved); c != nil &&
		c.Status == metav1.ConditionTrue && c.Reason == toolnexusv1alpha1.ReasonGatePassed {
		return
	}
	switch {
	case fate == requestTaken:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionResolved, metav1.ConditionFalse, toolnexusv1alpha1.ReasonAnswerTaken, "The run took the answer in; its call runs next")
	case fate == requestPassed:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionResolved, metav1.ConditionTrue, toolnexusv1alpha1.ReasonGatePassed, "The call passed this gate; it waits on its next one")
	case fate == requestOpen:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionResolved, metav1.ConditionFalse, toolnexusv1alpha1.ReasonAnswerNotConsumed, "The run has not consumed an answer yet")
	case cancelled && fate == requestWithdrawn:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionResolved, metav1.ConditionTrue, toolnexusv1alpha1.ReasonRunGone,
			"Its call no longer waits on it (another request of the call was refused, or its work ended); the request was cancelled")
	case cancelled:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionResolved, metav1.ConditionTrue, toolnexusv1alpha1.ReasonRunGone, "The run ended; the request was cancelled")
	case fate == requestDropped:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionResolved, metav1.ConditionTrue, toolnexusv1alpha1.ReasonRunGone, "The run ended before it consumed the answer")
	default:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionResolved, metav1.ConditionTrue, toolnexusv1alpha1.ReasonAnswerConsumed, "The run has consumed the answer")
	}
}

// openSummaries lists the run's open requests for status.pending, in call order.
func openSummaries(s *scope) []toolnexusv1alpha1.PendingSummary {
	if s.rec.State.Ended() {
		return nil
	}
	var out []toolnexusv1alpha1.PendingSummary
	for _, o := range s.rec.State.Open() {
		a := o.Ask
		if a.Announced == nil {
			continue
		}
		out = append(out, toolnexusv1alpha1.PendingSummary{
			Name: a.Announced.Name, Kind: a.Request.Kind, Prompt: clip.Marked(a.Request.Prompt, maxStatusPrompt), URL: a.Request.URL, ToolCallID: o.Call.ID,
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

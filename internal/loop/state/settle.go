package state

import (
	"fmt"
	"strings"
	"time"

	"github.com/toolnexus/operator/internal/backoff"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// The decisions a host takes about a run between its steps, in one pure function: which answers
// are consumed, what a decline, a deletion, an expiry or a cancellation does, when the run fails,
// how a failed step backs off and when the run must be woken next. The host (the operator's
// AgentRun controller) lists what it sees, calls Settle, carries out the effects, saves the state
// once and projects it. Nothing here does I/O or reads a clock.

// Reasons a host-decided end carries (Outcome.Reason). They are the AgentRun condition reasons of
// the same names (api/v1alpha1), which a test keeps equal.
const (
	ReasonCancelled      = "Cancelled"
	ReasonRequestExpired = "RequestExpired"
	ReasonStateMismatch  = "StateMismatch"
	ReasonModelError     = "ModelError"
	ReasonInvalidSpec    = "InvalidSpec"
)

// Seen is one request of the run as the host saw it now: the object it published a suspension as
// (Call.Announced), or the fact that it is gone.
type Seen struct {
	// Name and UID identify the object; a UID other than the announced one is another object.
	Name, UID string
	// Gone says the object does not exist (the host checked around any cache).
	Gone bool
	// What the object shows of its call: what its answerer saw.
	CallID, CallName, Args string
	RequestID, Kind        string
	// Answer is the answer it holds; nil while unanswered. AnswerError says the stored answer could
	// not be decoded (it is immutable, so the call must not wait for a better one).
	Answer      *wire.Answer
	AnswerError string
	// AnsweredBy is who answered; ByExpiry says the answer is the host's own expiry record.
	AnsweredBy string
	ByExpiry   bool
	// AnsweredAt is when the answer was stamped; zero when unknown.
	AnsweredAt time.Time
}

// Policy is what the run's spec says about its requests and its model.
type Policy struct {
	// Cancel ends the run (spec.cancel).
	Cancel bool
	// OnTimeoutFail ends the run when a request expires; otherwise the model is told.
	OnTimeoutFail bool
	// Retries is how many consecutive transient model failures are retried, RetryBase the first
	// backoff delay.
	Retries   int
	RetryBase time.Duration
}

// StepEnd is what a finished step left: the state it reached and how it failed, if it did.
type StepEnd struct {
	State   *State
	Failure *Failure
}

// Failure is why a step stopped before it finished, as the host classified it.
type Failure struct {
	// Canceled: the step was stopped (a cancellation, a lost leadership); what it finished is
	// kept and the rest is taken again.
	Canceled bool
	// InvalidSpec: the run's spec cannot run (a tool set that does not build, a gate prompt that
	// cannot render); the run ends.
	InvalidSpec bool
	// Transient: the model request may succeed if asked again, after RetryAfter when the endpoint
	// named one.
	Transient  bool
	RetryAfter time.Duration
	// Message is the redacted error.
	Message string
}

// EffectKind names what the host must do.
type EffectKind string

// Effects.
const (
	// EffectExpire: write the expiry answer {ok: false, reason: expired} to request Name (UID).
	// Once written, the host settles again with it seen.
	EffectExpire EffectKind = "Expire"
	// EffectConsumed: the answer of request Name was recorded (report it).
	EffectConsumed EffectKind = "Consumed"
	// EffectExpired: the expiry of request Name was recorded (report it).
	EffectExpired EffectKind = "Expired"
	// EffectDeleted: request Name was deleted unanswered; the call was declined (report it).
	EffectDeleted EffectKind = "Deleted"
	// EffectInvalidAnswer: the answer of request Name could not be used; the call was declined
	// (report Message).
	EffectInvalidAnswer EffectKind = "InvalidAnswer"
	// EffectLateAnswer: the answer of request Name was stamped after the request expired; the call
	// was told it expired (report it).
	EffectLateAnswer EffectKind = "LateAnswer"
	// EffectCancelStep: abort the run's step in flight; what it left must not be applied.
	EffectCancelStep EffectKind = "CancelStep"
	// EffectRetry: the model failed transiently; take the next step at At (report Message).
	EffectRetry EffectKind = "Retry"
	// EffectCancelWait: call CallID no longer waits on the external work Wait (the run ended, the
	// call was declined, or the wait outlived its deadline): tell the work's holder to stop it.
	EffectCancelWait EffectKind = "CancelWait"
)

// Effect is one thing the host must do or report, in the order Settle decided it.
type Effect struct {
	Kind EffectKind
	// Name and UID are the request's, CallID its call's.
	Name, UID, CallID string
	// Answer is the answer consumed (EffectConsumed).
	Answer *wire.Answer
	// At is when (EffectRetry).
	At time.Time
	// Message says why (EffectInvalidAnswer, EffectRetry, EffectCancelWait).
	Message string
	// Wait is the work to stop (EffectCancelWait).
	Wait *wire.Wait
}

// Settlement is what Settle decided.
type Settlement struct {
	// Changed says the state changed: the host saves it before it reports anything.
	Changed bool
	Effects []Effect
	// WakeAt is when the run must be looked at again with nothing else happening: the nearest
	// expiry of an open request, or the end of a backoff. Zero when nothing is due.
	WakeAt time.Time
}

// Settle takes into st what happened since it was saved: the end of its last step (end, nil when
// none ended), a cancellation, and the answers, deletions and expiries of its requests as seen,
// and says what the host must do. It changes st in place (the host saves it when Changed). A
// request shows the call the state holds or nothing runs: any difference ends the run closed.
func Settle(st *State, end *StepEnd, seen []Seen, now time.Time, p Policy) Settlement {
	var out Settlement
	if end != nil {
		*st = *end.State
		out.Changed = true
		settleFailure(st, end.Failure, now, p, &out)
	}
	if p.Cancel && !st.Ended() {
		st.End(ReasonCancelled, "The run was cancelled (spec.cancel)")
		out.Changed = true
		out.Effects = append(out.Effects, Effect{Kind: EffectCancelStep})
	}
	for i := range st.Abandoned {
		out.Effects = append(out.Effects, Effect{Kind: EffectCancelWait, Wait: &st.Abandoned[i], Message: "the call stopped waiting on it"})
	}
	if st.Abandoned != nil {
		st.Abandoned, out.Changed = nil, true
	}
	if st.Ended() {
		endWaits(st, "the run ended", &out)
		out.WakeAt = time.Time{}
		return out
	}
	byName := make(map[string]*Seen, len(seen))
	for i := range seen {
		byName[seen[i].Name] = &seen[i]
	}
	for _, call := range st.Suspended() {
		for _, ask := range call.Asks() {
			if ask.Announced == nil || ask.Answer != nil {
				continue
			}
			s := byName[ask.Announced.Name]
			if s == nil {
				// Not seen yet (a cache that lags behind the create): its answer wakes the run.
				continue
			}
			if st.call(call.ID).Phase != PhaseSuspended {
				break // a refusal of an earlier request of the call finished it
			}
			if settleAsk(st, call, ask, s, now, p, &out); st.Ended() {
				endWaits(st, "the run ended", &out)
				out.WakeAt = time.Time{}
				return out
			}
		}
	}
	endWaits(st, "the request it asked was not answered", &out)
	out.WakeAt = earliest(out.WakeAt, nearestExpiry(st))
	out.WakeAt = earliest(out.WakeAt, settleWaits(st, now, &out))
	return out
}

// settleWaits decides, for the calls waiting on external work, which are due for a look now and
// which outlived their deadline (the call ends with an error result and the work is stopped). It
// returns when the next look is due; zero when none is.
func settleWaits(st *State, now time.Time, out *Settlement) time.Time {
	var wake time.Time
	for i := range st.Calls {
		call := &st.Calls[i]
		if call.Phase != PhaseWaiting || call.Wait == nil {
			continue
		}
		w := call.Wait
		if deadline, err := time.Parse(time.RFC3339Nano, w.Deadline); err == nil && !now.Before(deadline) {
			since, _ := time.Parse(time.RFC3339Nano, w.Since)
			msg := fmt.Sprintf("%s %s on %s did not finish within %s (last status: %s); it was cancelled",
				w.Kind, w.ID, w.Server, deadline.Sub(since).Round(time.Second), lastStatus(w))
			finishWait(call, msg, out)
			out.Changed = true
			continue
		}
		next, err := time.Parse(time.RFC3339Nano, w.NextPoll)
		switch {
		case w.Due:
		case err != nil || !now.Before(next):
			w.Due = true
			out.Changed = true
		default:
			wake = earliest(wake, next)
		}
	}
	return wake
}

// endWaits stops the external work of every call that still holds some but no longer waits on it:
// every such call when the run ended, else a call whose request (asked by the work) was declined,
// expired or deleted.
func endWaits(st *State, why string, out *Settlement) {
	for i := range st.Calls {
		call := &st.Calls[i]
		if call.Wait == nil || (!st.Ended() && call.Phase != PhaseDone) {
			continue
		}
		w := call.Wait.Wait
		out.Effects = append(out.Effects, Effect{Kind: EffectCancelWait, CallID: call.ID, Wait: &w, Message: why})
		if call.Phase != PhaseDone {
			call.Phase, call.Result = PhaseDone, &wire.ToolResult{Output: fmt.Sprintf("cancelled: %s", why), IsError: true}
		}
		call.Wait = nil
		out.Changed = true
	}
}

// finishWait ends a waiting call with the error result msg and stops its work.
func finishWait(call *Call, msg string, out *Settlement) {
	w := call.Wait.Wait
	out.Effects = append(out.Effects, Effect{Kind: EffectCancelWait, CallID: call.ID, Wait: &w, Message: msg})
	call.Phase, call.Result, call.Wait = PhaseDone, &wire.ToolResult{Output: msg, IsError: true}, nil
}

func lastStatus(w *Wait) string {
	switch {
	case w.PollError != "":
		return "unknown, the last look failed: " + w.PollError
	case w.Status == "":
		return "unknown"
	}
	return w.Status
}

// settleAsk decides what request s means for the request ask of call.
func settleAsk(st *State, call Call, ask Ask, s *Seen, now time.Time, p Policy, out *Settlement) {
	name := ask.Announced.Name
	decline := func(kind EffectKind, reason, message string) {
		if st.AnswerAsk(call.ID, ask.Index, wire.AnswerDeclined(ask.Request.ID, reason)) == nil {
			out.Changed = true
		}
		out.Effects = append(out.Effects, Effect{Kind: kind, Name: name, UID: s.UID, CallID: call.ID, Message: message})
	}
	if s.Gone {
		decline(EffectDeleted, "the PendingRequest was deleted", "")
		return
	}
	if err := mismatch(call, ask, s); err != "" {
		st.End(ReasonStateMismatch, err)
		out.Changed = true
		return
	}
	exp, hasExpiry := expiry(ask.Request)
	fail, rule := p.OnTimeoutFail, "spec.suspension.onTimeout is Fail"
	if g := call.Gate; g != nil && g.OnTimeout != "" {
		// A gate's own rule (a platform's policy) decides for its request, whatever the run says.
		fail, rule = g.OnTimeout == OnTimeoutFail, "the onTimeout of gate "+g.Key+" is Fail"
	}
	switch {
	case s.Answer == nil && s.AnswerError == "":
		if hasExpiry && !now.Before(exp) {
			out.Effects = append(out.Effects, Effect{Kind: EffectExpire, Name: name, UID: s.UID, CallID: call.ID})
		}
	case s.AnswerError != "":
		decline(EffectInvalidAnswer, "invalid answer: "+s.AnswerError, s.AnswerError)
	case s.ByExpiry:
		decline(EffectExpired, wire.ReasonExpired, "")
		if fail {
			// Decided from the saved state and the request as it is, whoever wrote the expiry: a
			// reconcile whose save failed after writing it must not let the run go on.
			st.End(ReasonRequestExpired, fmt.Sprintf("PendingRequest %s expired unanswered and %s", name, rule))
		}
	case hasExpiry && !s.AnsweredAt.IsZero() && s.AnsweredAt.After(exp):
		// The API server refuses an answer stamped after the expiry; a cluster without the
		// admission policies must not run a call on one either.
		decline(EffectLateAnswer, wire.ReasonExpired, "")
		if fail {
			st.End(ReasonRequestExpired, fmt.Sprintf("PendingRequest %s was answered after it expired and %s", name, rule))
		}
	default:
		a := *s.Answer
		if err := st.AnswerAsk(call.ID, ask.Index, a); err != nil {
			// Admission should have refused it; it is immutable now, so the model is told.
			decline(EffectInvalidAnswer, "invalid answer: "+err.Error(), err.Error())
			return
		}
		out.Changed = true
		out.Effects = append(out.Effects, Effect{Kind: EffectConsumed, Name: name, UID: s.UID, CallID: call.ID, Answer: &a})
	}
}

// mismatch says how request s differs from the request ask the state holds for call: another
// object, another call, another request, or other arguments than the retry would run with.
func mismatch(call Call, ask Ask, s *Seen) string {
	switch {
	case s.UID != ask.Announced.UID:
		return fmt.Sprintf("PendingRequest %s is not the request this run created for call %s (it was replaced)", s.Name, call.ID)
	case s.CallID != call.ID || s.CallName != call.Name:
		return fmt.Sprintf("PendingRequest %s shows call %s of %s, the run's record holds call %s of %s", s.Name, s.CallID, s.CallName, call.ID, call.Name)
	case s.RequestID != ask.Request.ID || s.Kind != ask.Request.Kind:
		return fmt.Sprintf("PendingRequest %s shows request %s (%s), the run's record holds request %s (%s)", s.Name, s.RequestID, s.Kind, ask.Request.ID, ask.Request.Kind)
	case s.Args != call.Args:
		return fmt.Sprintf("PendingRequest %s shows other arguments for call %s than the run's record holds; the call does not run", s.Name, call.ID)
	}
	return ""
}

// settleFailure decides what a failed step means: a transient model failure within the retries
// backs off, any other failure ends the run.
func settleFailure(st *State, f *Failure, now time.Time, p Policy, out *Settlement) {
	switch {
	case f == nil || f.Canceled:
		// Stopped by a cancellation or a lost leadership: what it finished is kept.
	case f.InvalidSpec:
		st.End(ReasonInvalidSpec, f.Message)
	case f.Transient && st.ModelFailures < p.Retries:
		st.ModelFailures++
		at := now.Add(backoff.Delay(p.RetryBase, st.ModelFailures, f.RetryAfter))
		out.WakeAt = at
		out.Effects = append(out.Effects, Effect{Kind: EffectRetry, At: at, Message: fmt.Sprintf(
			"Model request failed (attempt %d of %d), retrying in %s: %s", st.ModelFailures, p.Retries+1, at.Sub(now), f.Message)})
	case f.Transient:
		st.End(ReasonModelError, fmt.Sprintf("model request failed %d times in a row: %s", st.ModelFailures+1, f.Message))
	default:
		st.End(ReasonModelError, f.Message)
	}
}

// expiry is when req expires, from the saved state.
func expiry(req wire.Request) (time.Time, bool) {
	if req.ExpiresAt == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339, req.ExpiresAt)
	return t, err == nil
}

// nearestExpiry is when the first of the open, announced requests expires; zero when none does.
func nearestExpiry(st *State) time.Time {
	var wake time.Time
	for _, call := range st.Suspended() {
		for _, ask := range call.Asks() {
			if ask.Announced == nil || ask.Answer != nil {
				continue
			}
			if exp, ok := expiry(ask.Request); ok {
				wake = earliest(wake, exp)
			}
		}
	}
	return wake
}

// earliest is the earlier of two times, the zero time meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// Answer records the answer to a suspended call. A refusal (OK false) finishes the call at once
// with the error result "declined/expired: <prompt>" (plus "\nreason: <reason>"), so the tool
// never runs again; an approval makes the call runnable: the next Step re-executes it once with
// the answer. An answer that does not fit its request is refused and st is left unchanged.
//
// A call that asked a round (Call.Round) takes the answer for the request a.ID names, or without
// an id for the first it still waits on (AnswerAsk); it runs once every request is answered.
func (st *State) Answer(callID string, a wire.Answer) error {
	call := st.call(callID)
	if call == nil || call.Round == nil {
		return st.AnswerAsk(callID, 0, a)
	}
	for _, ask := range call.Asks() {
		if ask.Answer == nil && (a.ID == "" || a.ID == ask.Request.ID) {
			return st.AnswerAsk(callID, ask.Index, a)
		}
	}
	return fmt.Errorf("state: answer id %q names none of the requests tool call %q still waits on", a.ID, callID)
}

// AnswerAsk records the answer to the request index (Ask.Index) of a suspended call, as Answer
// does: a refusal of any request of a round finishes the call with that request's prompt, and the
// call runs again once every request of its round is answered ok.
func (st *State) AnswerAsk(callID string, index int, a wire.Answer) error {
	call := st.call(callID)
	if call == nil {
		return fmt.Errorf("state: no tool call %q in the current turn", callID)
	}
	var req *wire.Request
	var slot **wire.Answer
	switch {
	case index == 0:
		req, slot = call.Request, &call.Answer
	case call.Round != nil && index > 0 && index <= len(call.Round.More):
		in := &call.Round.More[index-1]
		req, slot = &in.Request, &in.Answer
	default:
		return fmt.Errorf("state: tool call %q has no request %d", callID, index)
	}
	switch {
	case *slot != nil:
		return fmt.Errorf("state: tool call %q is already answered", callID)
	case call.Phase != PhaseSuspended:
		return fmt.Errorf("state: tool call %q is not waiting for an answer (phase %s)", callID, call.Phase)
	}
	if err := ValidateAnswer(*req, a); err != nil {
		return err
	}
	ans := a
	if ans.ID == "" {
		// The id is optional for the answerer; the tool sees the answer as addressed to its request.
		ans.ID = req.ID
	}
	*slot = &ans
	if a.OK {
		if call.Answer != nil && call.roundAnswered() {
			call.Phase = PhaseAnswered
		}
		return nil
	}
	out := "declined/expired: " + req.Prompt
	if a.Reason != "" {
		// A timeout must never read as a refusal, so the reason travels with the result.
		out += "\nreason: " + a.Reason
	}
	call.Phase, call.Result = PhaseDone, &wire.ToolResult{Output: out, IsError: true}
	return nil
}

// call is the call callID of the current turn, or nil.
func (st *State) call(callID string) *Call {
	for i := range st.Calls {
		if st.Calls[i].ID == callID {
			return &st.Calls[i]
		}
	}
	return nil
}

// ValidateAnswer checks that a fits req: the id, when given, echoes the request's, and an OK
// answer to an input, question or tool_call request carries a result the tool can use, so an
// empty "success" never fabricates a tool result. Errors name what is missing and never echo
// values.
func ValidateAnswer(req wire.Request, a wire.Answer) error {
	if a.ID != "" && a.ID != req.ID {
		return fmt.Errorf("state: answer id %q does not echo the pending request id %q", a.ID, req.ID)
	}
	if !a.OK {
		return nil
	}
	if a.Reason != "" {
		return fmt.Errorf("state: answer to request %q has ok: true and a reason; a reason is only for ok: false", req.ID)
	}
	switch req.Kind {
	case wire.KindInput:
		return validateInput(req, a)
	case wire.KindQuestion:
		if len(a.Data) == 0 {
			return fmt.Errorf("state: answer to question request %q has no data: ok: true needs a non-empty data object holding the answers", req.ID)
		}
	case wire.KindToolCall:
		_, results := a.Data[wire.ResultsKey].([]any)
		_, output := a.Data[wire.OutputKey].(string)
		if !results && !output {
			return fmt.Errorf("state: answer to tool_call request %q carries no result: ok: true needs data.%s (an array) or data.%s (a string) (keys seen: %v)",
				req.ID, wire.ResultsKey, wire.OutputKey, a.DataKeys())
		}
	}
	return nil
}

// validateInput accepts data.output as a string or, for a form (data.schema), a data object with
// the schema's required fields.
func validateInput(req wire.Request, a wire.Answer) error {
	if v, ok := a.Data[wire.OutputKey]; ok {
		if _, isString := v.(string); isString {
			return nil
		}
		return fmt.Errorf("state: answer to input request %q has data.output of type %T; it must be a string", req.ID, v)
	}
	schema, hasSchema := req.Data["schema"].(map[string]any)
	if !hasSchema {
		return fmt.Errorf("state: answer to input request %q carries no result: ok: true needs data.output (a string) (keys seen: %v)", req.ID, a.DataKeys())
	}
	var missing []string
	for _, f := range StringList(schema["required"]) {
		if _, ok := a.Data[f]; !ok {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("state: answer to input request %q lacks required field(s) %s of data.schema (or give data.output as a string)",
			req.ID, strings.Join(missing, ", "))
	}
	return nil
}

// StringList reads a JSON array of strings (as decoded into any), skipping what is not a string.
func StringList(v any) []string {
	switch l := v.(type) {
	case []string:
		return l
	case []any:
		out := make([]string, 0, len(l))
		for _, s := range l {
			if str, ok := s.(string); ok {
				out = append(out, str)
			}
		}
		return out
	}
	return nil
}

package state

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/toolnexus/operator/internal/tools/wire"
)

// Every decision Settle takes, on plain values: what the host saw, what the state becomes and
// what the host is told to do.

var settleNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const settleArgs = `{"dryRun":false,"env":"prod"}`

// parked is call id of the tool deploy, suspended on an input request and announced as
// deploy-1-<id> with UID uid-<id>; expires, when given, is its request's expiry.
func parked(id string, expires ...time.Time) Call {
	c := Call{ID: id, Name: "deploy", Arguments: `{"env":"prod"}`, Args: settleArgs, Phase: PhaseSuspended,
		Request:   &wire.Request{ID: "req-" + id, Kind: wire.KindInput, Prompt: "Which region?"},
		Announced: &Announcement{Name: "deploy-1-" + id, UID: "uid-" + id}}
	if len(expires) > 0 {
		c.Request.ExpiresAt = expires[0].Format(time.RFC3339)
	}
	return c
}

// gated is call parked on the gate policy/prod, whose requests expire with onTimeout.
func gated(call Call, onTimeout string) Call {
	call.Gated, call.Gate = true, &Gate{Key: "policy/prod", OnTimeout: onTimeout}
	return call
}

func turn(calls ...Call) *State {
	return &State{Messages: []Message{{Role: RoleUser, Content: "ship it"}}, Turn: 1, Calls: calls}
}

// seen is the request of call as the host sees it, with edits.
func seen(call Call, edits ...func(*Seen)) Seen {
	s := Seen{Name: call.Announced.Name, UID: call.Announced.UID, CallID: call.ID, CallName: call.Name, Args: call.Args,
		RequestID: call.Request.ID, Kind: call.Request.Kind}
	for _, e := range edits {
		e(&s)
	}
	return s
}

func answered(a wire.Answer, by string) func(*Seen) {
	return func(s *Seen) { s.Answer, s.AnsweredBy, s.AnsweredAt = &a, by, settleNow.Add(-time.Minute) }
}

func expiredAnswer(s *Seen) {
	a := wire.AnswerDeclined("", wire.ReasonExpired)
	s.Answer, s.AnsweredBy, s.ByExpiry = &a, "system:expired", true
}

var region = wire.Answer{OK: true, Data: map[string]any{wire.OutputKey: "eu-west-1"}}

func TestSettle(t *testing.T) {
	soon, past := settleNow.Add(time.Hour), settleNow.Add(-time.Second)
	declined := func(call Call, reason string) Call {
		call.Answer = &wire.Answer{ID: call.Request.ID, OK: false, Reason: reason}
		call.Phase = PhaseDone
		call.Result = &wire.ToolResult{IsError: true, Output: "declined/expired: Which region?\nreason: " + reason}
		return call
	}
	approved := func(call Call, a wire.Answer) Call {
		a.ID = call.Request.ID
		call.Answer, call.Phase = &a, PhaseAnswered
		return call
	}
	ended := func(st *State, reason, message string) *State {
		st.Outcome = &Outcome{Reason: reason, Message: message}
		return st
	}
	cases := []struct {
		name   string
		state  *State
		end    *StepEnd
		seen   []Seen
		policy Policy
		// want is the state after; wantEffects what the host is told; wantWake when to look again.
		want        *State
		wantEffects []Effect
		wantWake    time.Time
		changed     bool
	}{{
		name:  "an answer is consumed: the call runs again once with it",
		state: turn(parked("a")), seen: []Seen{seen(parked("a"), answered(region, "alice"))},
		want:        turn(approved(parked("a"), region)),
		wantEffects: []Effect{{Kind: EffectConsumed, Name: "deploy-1-a", UID: "uid-a", CallID: "a", Answer: &region}},
		changed:     true,
	}, {
		name:  "a decline finishes the call with the reason: the tool never runs",
		state: turn(parked("a")), seen: []Seen{seen(parked("a"), answered(wire.AnswerDeclined("", "too risky"), "alice"))},
		want:        turn(declined(parked("a"), "too risky")),
		wantEffects: []Effect{{Kind: EffectConsumed, Name: "deploy-1-a", UID: "uid-a", CallID: "a", Answer: &wire.Answer{Reason: "too risky"}}},
		changed:     true,
	}, {
		name:        "two calls are answered independently; an open one keeps its expiry as the wake",
		state:       turn(parked("a"), parked("b", soon)),
		seen:        []Seen{seen(parked("a"), answered(region, "alice")), seen(parked("b", soon))},
		want:        turn(approved(parked("a"), region), parked("b", soon)),
		wantEffects: []Effect{{Kind: EffectConsumed, Name: "deploy-1-a", UID: "uid-a", CallID: "a", Answer: &region}},
		wantWake:    soon.Truncate(time.Second), changed: true,
	}, {
		name:  "a request not seen yet (the cache lags behind its create) waits",
		state: turn(parked("a", soon)), seen: nil,
		want: turn(parked("a", soon)), wantWake: soon.Truncate(time.Second),
	}, {
		name:  "an open request past its expiry is expired by the host: nothing changes until that is seen",
		state: turn(parked("a", past)), seen: []Seen{seen(parked("a", past))},
		want:        turn(parked("a", past)),
		wantEffects: []Effect{{Kind: EffectExpire, Name: "deploy-1-a", UID: "uid-a", CallID: "a"}},
		wantWake:    past.Truncate(time.Second),
	}, {
		name:  "the expiry, once seen, declines the call with reason expired (onTimeout: Decline)",
		state: turn(parked("a", past)), seen: []Seen{seen(parked("a", past), expiredAnswer)},
		want:        turn(declined(parked("a", past), wire.ReasonExpired)),
		wantEffects: []Effect{{Kind: EffectExpired, Name: "deploy-1-a", UID: "uid-a", CallID: "a"}},
		changed:     true,
	}, {
		name:  "the expiry, once seen, fails the run with onTimeout: Fail, whoever wrote it and whenever",
		state: turn(parked("a", past)), seen: []Seen{seen(parked("a", past), expiredAnswer)},
		policy: Policy{OnTimeoutFail: true},
		want: ended(turn(declined(parked("a", past), wire.ReasonExpired)), ReasonRequestExpired,
			"PendingRequest deploy-1-a expired unanswered and spec.suspension.onTimeout is Fail"),
		wantEffects: []Effect{{Kind: EffectExpired, Name: "deploy-1-a", UID: "uid-a", CallID: "a"}},
		changed:     true,
	}, {
		name:  "a gate's own onTimeout decides for its request, whatever the run's (a platform's Fail)",
		state: turn(gated(parked("a", past), "Fail")), seen: []Seen{seen(parked("a", past), expiredAnswer)},
		want: ended(turn(declined(gated(parked("a", past), "Fail"), wire.ReasonExpired)), ReasonRequestExpired,
			"PendingRequest deploy-1-a expired unanswered and the onTimeout of gate policy/prod is Fail"),
		wantEffects: []Effect{{Kind: EffectExpired, Name: "deploy-1-a", UID: "uid-a", CallID: "a"}},
		changed:     true,
	}, {
		name:  "a gate's Decline declines its request though the run says Fail",
		state: turn(gated(parked("a", past), "Decline")), seen: []Seen{seen(parked("a", past), expiredAnswer)},
		policy:      Policy{OnTimeoutFail: true},
		want:        turn(declined(gated(parked("a", past), "Decline"), wire.ReasonExpired)),
		wantEffects: []Effect{{Kind: EffectExpired, Name: "deploy-1-a", UID: "uid-a", CallID: "a"}},
		changed:     true,
	}, {
		name:  "an answer stamped before the expiry stands, however late it is consumed",
		state: turn(parked("a", past)), seen: []Seen{seen(parked("a", past), answered(region, "alice"), func(s *Seen) { s.AnsweredAt = past.Add(-time.Minute) })},
		want:        turn(approved(parked("a", past), region)),
		wantEffects: []Effect{{Kind: EffectConsumed, Name: "deploy-1-a", UID: "uid-a", CallID: "a", Answer: &region}},
		changed:     true,
	}, {
		name:  "an answer stamped after the expiry is not run (a cluster without the admission policies)",
		state: turn(parked("a", past)), seen: []Seen{seen(parked("a", past), answered(region, "alice"), func(s *Seen) { s.AnsweredAt = settleNow })},
		want:        turn(declined(parked("a", past), wire.ReasonExpired)),
		wantEffects: []Effect{{Kind: EffectLateAnswer, Name: "deploy-1-a", UID: "uid-a", CallID: "a"}},
		changed:     true,
	}, {
		name:  "an answer stamped after the expiry fails the run with onTimeout: Fail",
		state: turn(parked("a", past)), seen: []Seen{seen(parked("a", past), answered(region, "alice"), func(s *Seen) { s.AnsweredAt = settleNow })},
		policy: Policy{OnTimeoutFail: true},
		want: ended(turn(declined(parked("a", past), wire.ReasonExpired)), ReasonRequestExpired,
			"PendingRequest deploy-1-a was answered after it expired and spec.suspension.onTimeout is Fail"),
		wantEffects: []Effect{{Kind: EffectLateAnswer, Name: "deploy-1-a", UID: "uid-a", CallID: "a"}},
		changed:     true,
	}, {
		name:  "a request deleted unanswered declines its call: no run waits forever",
		state: turn(parked("a")), seen: []Seen{{Name: "deploy-1-a", Gone: true}},
		want:        turn(declined(parked("a"), "the PendingRequest was deleted")),
		wantEffects: []Effect{{Kind: EffectDeleted, Name: "deploy-1-a", CallID: "a"}},
		changed:     true,
	}, {
		name:  "an answer that cannot be decoded declines the call, naming why",
		state: turn(parked("a")), seen: []Seen{seen(parked("a"), func(s *Seen) { s.AnswerError = "answer.data is not a JSON object" })},
		want:        turn(declined(parked("a"), "invalid answer: answer.data is not a JSON object")),
		wantEffects: []Effect{{Kind: EffectInvalidAnswer, Name: "deploy-1-a", UID: "uid-a", CallID: "a", Message: "answer.data is not a JSON object"}},
		changed:     true,
	}, {
		name:  "an answer the request cannot use (no output for an input) declines the call",
		state: turn(parked("a")), seen: []Seen{seen(parked("a"), answered(wire.Answer{OK: true}, "alice"))},
		want: turn(declined(parked("a"), `invalid answer: state: answer to input request "req-a" carries no result: ok: true needs data.output (a string) (keys seen: [])`)),
		wantEffects: []Effect{{Kind: EffectInvalidAnswer, Name: "deploy-1-a", UID: "uid-a", CallID: "a",
			Message: `state: answer to input request "req-a" carries no result: ok: true needs data.output (a string) (keys seen: [])`}},
		changed: true,
	}, {
		name:  "another object under the request's name ends the run closed",
		state: turn(parked("a")), seen: []Seen{seen(parked("a"), answered(region, "alice"), func(s *Seen) { s.UID = "uid-other" })},
		want: ended(turn(parked("a")), ReasonStateMismatch,
			"PendingRequest deploy-1-a is not the request this run created for call a (it was replaced)"),
		changed: true,
	}, {
		name:  "a request showing another call ends the run closed",
		state: turn(parked("a")), seen: []Seen{seen(parked("a"), answered(region, "alice"), func(s *Seen) { s.CallName = "drop_db" })},
		want: ended(turn(parked("a")), ReasonStateMismatch,
			"PendingRequest deploy-1-a shows call a of drop_db, the run's record holds call a of deploy"),
		changed: true,
	}, {
		name:  "a request showing another call id ends the run closed",
		state: turn(parked("a")), seen: []Seen{seen(parked("a"), func(s *Seen) { s.CallID = "b" })},
		want: ended(turn(parked("a")), ReasonStateMismatch,
			"PendingRequest deploy-1-a shows call b of deploy, the run's record holds call a of deploy"),
		changed: true,
	}, {
		name:  "a request showing another request id ends the run closed",
		state: turn(parked("a")), seen: []Seen{seen(parked("a"), func(s *Seen) { s.RequestID = "req-other" })},
		want: ended(turn(parked("a")), ReasonStateMismatch,
			"PendingRequest deploy-1-a shows request req-other (input), the run's record holds request req-a (input)"),
		changed: true,
	}, {
		name:  "a request showing another request ends the run closed",
		state: turn(parked("a")), seen: []Seen{seen(parked("a"), func(s *Seen) { s.Kind = wire.KindApproval })},
		want: ended(turn(parked("a")), ReasonStateMismatch,
			"PendingRequest deploy-1-a shows request req-a (approval), the run's record holds request req-a (input)"),
		changed: true,
	}, {
		name:  "a request showing other arguments than the retry would run with ends the run closed",
		state: turn(parked("a")), seen: []Seen{seen(parked("a"), answered(region, "alice"), func(s *Seen) { s.Args = `{"env":"staging"}` })},
		want: ended(turn(parked("a")), ReasonStateMismatch,
			"PendingRequest deploy-1-a shows other arguments for call a than the run's record holds; the call does not run"),
		changed: true,
	}, {
		name:  "a call not announced yet is left to the host's announcement",
		state: turn(func() Call { c := parked("a"); c.Announced = nil; return c }()),
		want:  turn(func() Call { c := parked("a"); c.Announced = nil; return c }()),
	}, {
		name:  "cancelling ends the run and aborts its step; its requests are not consumed",
		state: turn(parked("a")), seen: []Seen{seen(parked("a"), answered(region, "alice"))},
		policy:      Policy{Cancel: true},
		want:        ended(turn(parked("a")), ReasonCancelled, "The run was cancelled (spec.cancel)"),
		wantEffects: []Effect{{Kind: EffectCancelStep}},
		changed:     true,
	}, {
		name:  "a run that ended is left as it is, cancelled or not",
		state: ended(turn(parked("a")), ReasonModelError, "boom"), seen: []Seen{seen(parked("a"), answered(region, "alice"))},
		policy: Policy{Cancel: true},
		want:   ended(turn(parked("a")), ReasonModelError, "boom"),
	}, {
		name:  "a step that ended replaces the state it started from",
		state: turn(parked("a")),
		end:   &StepEnd{State: &State{Messages: []Message{{Role: RoleUser, Content: "ship it"}}, Turn: 2}},
		want:  &State{Messages: []Message{{Role: RoleUser, Content: "ship it"}}, Turn: 2}, changed: true,
	}, {
		name:  "a transient model failure backs off: base, counted in the state",
		state: turn(), end: &StepEnd{State: turn(), Failure: &Failure{Transient: true, Message: "HTTP 503: busy"}},
		policy: Policy{Retries: 2, RetryBase: 500 * time.Millisecond},
		want:   func() *State { st := turn(); st.ModelFailures = 1; return st }(),
		wantEffects: []Effect{{Kind: EffectRetry, At: settleNow.Add(500 * time.Millisecond),
			Message: "Model request failed (attempt 1 of 3), retrying in 500ms: HTTP 503: busy"}},
		wantWake: settleNow.Add(500 * time.Millisecond), changed: true,
	}, {
		name:  "the model's Retry-After wins over the backoff",
		state: turn(), end: &StepEnd{State: func() *State { st := turn(); st.ModelFailures = 1; return st }(),
			Failure: &Failure{Transient: true, RetryAfter: 7 * time.Second, Message: "HTTP 429"}},
		policy: Policy{Retries: 2, RetryBase: 500 * time.Millisecond},
		want:   func() *State { st := turn(); st.ModelFailures = 2; return st }(),
		wantEffects: []Effect{{Kind: EffectRetry, At: settleNow.Add(7 * time.Second),
			Message: "Model request failed (attempt 2 of 3), retrying in 7s: HTTP 429"}},
		wantWake: settleNow.Add(7 * time.Second), changed: true,
	}, {
		name:  "past its retries the run fails ModelError",
		state: turn(), end: &StepEnd{State: func() *State { st := turn(); st.ModelFailures = 2; return st }(),
			Failure: &Failure{Transient: true, Message: "HTTP 503: busy"}},
		policy: Policy{Retries: 2, RetryBase: 500 * time.Millisecond},
		want: ended(func() *State { st := turn(); st.ModelFailures = 2; return st }(), ReasonModelError,
			"model request failed 3 times in a row: HTTP 503: busy"),
		changed: true,
	}, {
		name:  "a failure that asking again cannot mend fails the run at once",
		state: turn(), end: &StepEnd{State: turn(), Failure: &Failure{Message: "HTTP 400: bad model"}},
		policy: Policy{Retries: 2},
		want:   ended(turn(), ReasonModelError, "HTTP 400: bad model"), changed: true,
	}, {
		name:  "a spec that cannot run fails the run InvalidSpec",
		state: turn(), end: &StepEnd{State: turn(), Failure: &Failure{InvalidSpec: true, Message: "spec.tools: duplicate tool deploy"}},
		want: ended(turn(), ReasonInvalidSpec, "spec.tools: duplicate tool deploy"), changed: true,
	}, {
		name:  "a cancelled step keeps what it finished and decides nothing else",
		state: turn(), end: &StepEnd{State: &State{Turn: 3}, Failure: &Failure{Canceled: true, Message: "context canceled"}},
		want: &State{Turn: 3}, changed: true,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Settle(tc.state, tc.end, tc.seen, settleNow, tc.policy)
			if diff := cmp.Diff(tc.want, tc.state, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("state (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantEffects, got.Effects, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("effects (-want +got):\n%s", diff)
			}
			if !got.WakeAt.Equal(tc.wantWake) {
				t.Errorf("WakeAt %s, want %s", got.WakeAt, tc.wantWake)
			}
			if got.Changed != tc.changed {
				t.Errorf("Changed %t, want %t", got.Changed, tc.changed)
			}
		})
	}
}

// TestSettleOnTimeoutFailAfterAFailedSave: the reconcile that wrote the expiry may fail to save
// what it decided; the next one sees the expiry answer and still fails the run, rather than tell
// the model and go on.
func TestSettleOnTimeoutFailAfterAFailedSave(t *testing.T) {
	past := settleNow.Add(-time.Second)
	p := Policy{OnTimeoutFail: true}
	first := turn(parked("a", past))
	s := Settle(first, nil, []Seen{seen(parked("a", past))}, settleNow, p)
	if len(s.Effects) != 1 || s.Effects[0].Kind != EffectExpire {
		t.Fatalf("first reconcile: effects %+v, want one Expire", s.Effects)
	}
	// The expiry was written, the save was lost: the next reconcile starts from the saved state.
	again := turn(parked("a", past))
	Settle(again, nil, []Seen{seen(parked("a", past), expiredAnswer)}, settleNow.Add(time.Minute), p)
	if again.Outcome == nil || again.Outcome.Reason != ReasonRequestExpired {
		t.Fatalf("after the lost save: outcome %+v, want the run failed %s", again.Outcome, ReasonRequestExpired)
	}
}

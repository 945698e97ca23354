package loop

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/tools"
)

// modelFailure is what state.Settle made of a failed step's Classify: the retry it scheduled
// (zero when none), the end it decided, and the failure count it left.
type modelFailure struct {
	Delay    time.Duration
	Ended    string
	Failures int
}

func modelFailed(st *State, err error, retries int, base time.Duration) modelFailure {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := state.Settle(st, &state.StepEnd{State: st, Failure: Classify(err)}, nil, now, state.Policy{Retries: retries, RetryBase: base})
	out := modelFailure{Failures: st.ModelFailures}
	if !s.WakeAt.IsZero() {
		out.Delay = s.WakeAt.Sub(now)
	}
	if st.Outcome != nil {
		out.Ended = st.Outcome.Reason + ": " + st.Outcome.Message
	}
	return out
}

func TestClassifiedModelFailures(t *testing.T) {
	const base = 500 * time.Millisecond
	unavailable := &ProviderError{Status: http.StatusServiceUnavailable, Body: "busy"}
	cases := []struct {
		name    string
		before  int // ModelFailures before the call
		err     error
		retries int
		want    modelFailure
	}{
		{"first transient failure waits base", 0, unavailable, 2,
			modelFailure{Delay: base, Failures: 1}},
		{"second doubles", 1, unavailable, 2,
			modelFailure{Delay: time.Second, Failures: 2}},
		{"retry-after wins", 1, &ProviderError{Status: http.StatusTooManyRequests, RetryAfter: 7 * time.Second}, 2,
			modelFailure{Delay: 7 * time.Second, Failures: 2}},
		{"invalid response is transient", 0, fmt.Errorf("decoding: %w", ErrInvalidResponse), 2,
			modelFailure{Delay: base, Failures: 1}},
		{"unreachable is transient", 0, &networkError{errors.New("connection refused")}, 2,
			modelFailure{Delay: base, Failures: 1}},
		{"deep in retries the delay is capped", 19, unavailable, 50,
			modelFailure{Delay: 5 * time.Minute, Failures: 20}},
		{"past retries ends", 2, unavailable, 2,
			modelFailure{Ended: "ModelError: model request failed 3 times in a row: model endpoint returned HTTP 503: busy", Failures: 2}},
		{"no retries ends at once", 0, unavailable, 0,
			modelFailure{Ended: "ModelError: model request failed 1 times in a row: model endpoint returned HTTP 503: busy"}},
		{"not transient ends with the error", 1, &ProviderError{Status: http.StatusBadRequest, Body: "bad model"}, 2,
			modelFailure{Ended: "ModelError: model endpoint returned HTTP 400: bad model", Failures: 1}},
		{"a cancellation keeps what the step finished", 1, context.Canceled, 2,
			modelFailure{Failures: 1}},
	}
	for _, tc := range cases {
		st := NewState("go")
		st.ModelFailures = tc.before
		if diff := cmp.Diff(tc.want, modelFailed(st, tc.err, tc.retries, base)); diff != "" {
			t.Errorf("%s: a failed step (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestModelFailuresAcrossSteps drives Steps against a failing model as a host that requeues does:
// each failed Step is counted by Settle, and the model turn that succeeds resets the count.
func TestModelFailuresAcrossSteps(t *testing.T) {
	unavailable := looptest.Reply{Status: http.StatusServiceUnavailable, Body: "busy"}
	limited := looptest.Reply{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"7"}}, Body: "slow down"}
	cases := []struct {
		name    string
		replies []looptest.Reply
		want    []modelFailure // one per failed Step
		done    bool           // the last Step succeeds
	}{
		{"a success resets the count", []looptest.Reply{unavailable, limited, looptest.OpenAIText("ok")}, []modelFailure{
			{Delay: DefaultRetryBase, Failures: 1},
			{Delay: 7 * time.Second, Failures: 2},
		}, true},
		{"past retries", []looptest.Reply{unavailable, unavailable, unavailable}, []modelFailure{
			{Delay: DefaultRetryBase, Failures: 1},
			{Delay: 2 * DefaultRetryBase, Failures: 2},
			{Ended: "ModelError: model request failed 3 times in a row: model endpoint returned HTTP 503: busy", Failures: 2},
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := looptest.New(t, tc.replies...)
			c, st, tk := newClient(t, srv.URL), NewState("go"), toolkit(t)
			var got []modelFailure
			for range tc.replies {
				st = roundTrip(t, st) // the count lives in the persisted state, not in the process
				if _, err := c.Step(context.Background(), st, tk); err != nil {
					got = append(got, modelFailed(st, err, DefaultRetries, DefaultRetryBase))
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("failed steps (-want +got):\n%s", diff)
			}
			if tc.done && (st.Status != StatusDone || st.ModelFailures != 0) {
				t.Errorf("after the successful turn: status %q, ModelFailures %d; want done, 0", st.Status, st.ModelFailures)
			}
		})
	}
}

// TestEnd: a run the host ended does nothing more, whatever it was waiting for, and keeps the
// first end it was given; the end and the failure count are part of the durable state.
func TestEnd(t *testing.T) {
	running := func(phase Phase) func() *State {
		return func() *State {
			st := suspendedState(tools.Request{ID: "r1", Kind: tools.KindApproval, Prompt: "ok?"})
			st.Calls[0].Phase = phase
			if phase == PhaseAnswered {
				st.Calls[0].Answer = &tools.Answer{ID: "r1", OK: true}
			}
			return st
		}
	}
	cases := []struct {
		name   string
		state  func() *State
		before Action
		want   *Outcome
	}{
		{"before the first model turn", func() *State { return NewState("go") }, ActionModelTurn,
			&Outcome{Reason: "Cancelled", Message: "first"}},
		{"with a queued call", running(PhaseQueued), ActionToolCalls, &Outcome{Reason: "Cancelled", Message: "first"}},
		{"with an answered call", running(PhaseAnswered), ActionToolCalls, &Outcome{Reason: "Cancelled", Message: "first"}},
		{"waiting for an answer", running(PhaseSuspended), ActionWaiting, &Outcome{Reason: "Cancelled", Message: "first"}},
		{"the model ended it first", func() *State { return &State{Status: StatusDone, Text: "bye"} }, ActionFinished, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := looptest.New(t) // any model request fails the test
			var ran counter
			c, tk, st := newClient(t, srv.URL), toolkit(t, ran.tool("act")), tc.state()
			if got := st.Next(); got != tc.before {
				t.Fatalf("before End: Next = %s, want %s", got, tc.before)
			}
			st.End("Cancelled", "first")
			st.End("ModelError", "second")
			if diff := cmp.Diff(tc.want, st.Outcome); diff != "" {
				t.Errorf("Outcome (-want +got):\n%s", diff)
			}
			if !st.Ended() || st.Next() != ActionFinished {
				t.Fatalf("after End: Ended %t, Next %s; want true, %s", st.Ended(), st.Next(), ActionFinished)
			}
			before := roundTrip(t, st)
			res := step(t, c, before, tk, ActionFinished)
			if len(res.Suspended) != 0 || ran.runs.Load() != 0 || len(srv.Requests()) != 0 {
				t.Errorf("Step on an ended run: suspended %d, tool runs %d, model requests %d; want none",
					len(res.Suspended), ran.runs.Load(), len(srv.Requests()))
			}
			if diff := cmp.Diff(roundTrip(t, st), before); diff != "" {
				t.Errorf("Step changed an ended state (-before +after):\n%s", diff)
			}
		})
	}
}

func TestLifecycleSurvivesPersistence(t *testing.T) {
	st := suspendedState(tools.Request{ID: "r1", Kind: tools.KindApproval, Prompt: "ok?"})
	st.ModelFailures = 2
	st.End("RequestExpired", "PendingRequest x expired unanswered")
	got := roundTrip(t, st)
	if diff := cmp.Diff(&Outcome{Reason: "RequestExpired", Message: "PendingRequest x expired unanswered"}, got.Outcome); diff != "" {
		t.Errorf("Outcome after a round trip (-want +got):\n%s", diff)
	}
	if got.ModelFailures != 2 || got.Next() != ActionFinished {
		t.Errorf("after a round trip: ModelFailures %d, Next %s; want 2, %s", got.ModelFailures, got.Next(), ActionFinished)
	}
}

package state

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/tools/wire"
)

// asking is call parked on a round: its Request (key region) and a URL consent, each announced
// as its own request; expires is both requests' expiry.
func asking(id string, expires time.Time) Call {
	c := parked(id, expires)
	c.Round = &Round{Number: 1, Resume: "opaque-state", Key: "region", More: []Input{{Key: "consent",
		Request:   wire.Request{ID: "req-" + id + "-consent", Kind: wire.KindAuthorization, Prompt: "Grant access", ExpiresAt: expires.Format(time.RFC3339)},
		Announced: &Announcement{Name: "deploy-1-" + id + "-consent", UID: "uid-" + id + "-consent"}}}}
	return c
}

// seenInput is request i of a round call as the host sees it.
func seenInput(call Call, i int, edits ...func(*Seen)) Seen {
	in := call.Round.More[i]
	s := Seen{Name: in.Announced.Name, UID: in.Announced.UID, CallID: call.ID, CallName: call.Name, Args: call.Args,
		RequestID: in.Request.ID, Kind: in.Request.Kind}
	for _, e := range edits {
		e(&s)
	}
	return s
}

// TestSettleRound: each request of a round is settled on its own; the call runs once all are
// answered, a refusal of one finishes it, each expires, and a replaced one ends the run closed.
func TestSettleRound(t *testing.T) {
	soon, past := settleNow.Add(time.Hour), settleNow.Add(-time.Second)
	consentOK := wire.Answer{OK: true}
	cases := []struct {
		name        string
		call        Call
		seen        func(Call) []Seen
		wantPhase   Phase
		wantResult  string
		wantEffects []EffectKind
		wantOpen    int
	}{
		{name: "one answered: the call still waits on the other", call: asking("c1", soon),
			seen:      func(c Call) []Seen { return []Seen{seen(c, answered(region, "alice")), seenInput(c, 0)} },
			wantPhase: PhaseSuspended, wantEffects: []EffectKind{EffectConsumed}, wantOpen: 1},
		{name: "the other answered first", call: asking("c1", soon),
			seen:      func(c Call) []Seen { return []Seen{seen(c), seenInput(c, 0, answered(consentOK, "bob"))} },
			wantPhase: PhaseSuspended, wantEffects: []EffectKind{EffectConsumed}, wantOpen: 1},
		{name: "both answered: the call runs", call: asking("c1", soon),
			seen: func(c Call) []Seen {
				return []Seen{seen(c, answered(region, "alice")), seenInput(c, 0, answered(consentOK, "bob"))}
			},
			wantPhase: PhaseAnswered, wantEffects: []EffectKind{EffectConsumed, EffectConsumed}},
		{name: "a refusal of one finishes the call", call: asking("c1", soon),
			seen: func(c Call) []Seen {
				return []Seen{seen(c, answered(region, "alice")), seenInput(c, 0, answered(wire.AnswerDeclined("", ""), "bob"))}
			},
			wantPhase: PhaseDone, wantResult: "declined/expired: Grant access\nreason: declined", wantEffects: []EffectKind{EffectConsumed, EffectConsumed}},
		{name: "a refusal of the first: the other is not settled", call: asking("c1", soon),
			seen: func(c Call) []Seen {
				return []Seen{seen(c, answered(wire.AnswerDeclined("", ""), "alice")), seenInput(c, 0, answered(consentOK, "bob"))}
			},
			wantPhase: PhaseDone, wantResult: "declined/expired: Which region?\nreason: declined", wantEffects: []EffectKind{EffectConsumed}},
		{name: "each request expires", call: asking("c1", past),
			seen:      func(c Call) []Seen { return []Seen{seen(c), seenInput(c, 0)} },
			wantPhase: PhaseSuspended, wantEffects: []EffectKind{EffectExpire, EffectExpire}, wantOpen: 2},
		{name: "a deleted one declines the call", call: asking("c1", soon),
			seen:      func(c Call) []Seen { return []Seen{seen(c), {Name: c.Round.More[0].Announced.Name, Gone: true}} },
			wantPhase: PhaseDone, wantResult: "declined/expired: Grant access\nreason: the PendingRequest was deleted", wantEffects: []EffectKind{EffectDeleted}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := turn(tc.call)
			out := Settle(st, nil, tc.seen(tc.call), settleNow, Policy{})
			var kinds []EffectKind
			for _, e := range out.Effects {
				kinds = append(kinds, e.Kind)
			}
			if diff := cmp.Diff(tc.wantEffects, kinds); diff != "" {
				t.Errorf("effects (-want +got):\n%s", diff)
			}
			call := st.Calls[0]
			if call.Phase != tc.wantPhase || len(st.Open()) != tc.wantOpen {
				t.Errorf("phase %s with %d open, want %s with %d", call.Phase, len(st.Open()), tc.wantPhase, tc.wantOpen)
			}
			got := ""
			if call.Result != nil {
				got = call.Result.Output
			}
			if got != tc.wantResult {
				t.Errorf("result %q, want %q", got, tc.wantResult)
			}
			if call.Round.Resume != "opaque-state" {
				t.Errorf("the round's resume changed to %q", call.Round.Resume)
			}
			// Whatever was decided survives the record.
			raw, err := json.Marshal(st)
			if err != nil {
				t.Fatal(err)
			}
			var back State
			if err := json.Unmarshal(raw, &back); err != nil {
				t.Fatalf("the settled state does not load: %v", err)
			}
			if diff := cmp.Diff(st.Calls, back.Calls); diff != "" {
				t.Errorf("the call after a save and load (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSettleRoundReplaced: a request of a round that is another object than the one announced
// ends the run closed, as any request's.
func TestSettleRoundReplaced(t *testing.T) {
	call := asking("c1", settleNow.Add(time.Hour))
	st := turn(call)
	Settle(st, nil, []Seen{seen(call), seenInput(call, 0, func(s *Seen) { s.UID = "someone-else" })}, settleNow, Policy{})
	if st.Outcome == nil || st.Outcome.Reason != ReasonStateMismatch {
		t.Fatalf("outcome %+v, want StateMismatch", st.Outcome)
	}
}

// TestAnswerRound: in process, an answer goes to the request its id names, or the first open.
func TestAnswerRound(t *testing.T) {
	st := turn(asking("c1", settleNow.Add(time.Hour)))
	if err := st.Answer("c1", wire.Answer{ID: "req-c1-consent", OK: true}); err != nil {
		t.Fatal(err)
	}
	if err := st.Answer("c1", wire.Answer{ID: "nope", OK: true}); err == nil {
		t.Errorf("an answer naming no open request was taken")
	}
	if err := st.Answer("c1", region); err != nil {
		t.Fatal(err)
	}
	if c := st.Calls[0]; c.Phase != PhaseAnswered || c.Answer.ID != "req-c1" || c.Round.More[0].Answer.ID != "req-c1-consent" {
		t.Errorf("call %+v, want both answered under their ids", c)
	}
}

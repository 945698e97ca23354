package agentrun

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/tools"
)

// roundCall is call_1 suspended on a round: its Request (the region) and a consent URL.
func roundCall() loop.Call {
	c := waitingCall("call_1")
	c.Round = &state.Round{Number: 1, Resume: "signed-state", Key: "region", More: []state.Input{{Key: "consent",
		Request: tools.Request{ID: "req-call_1-consent", Kind: tools.KindAuthorization, Prompt: "Grant access", URL: "https://consent.example.com/x"}}}}
	return c
}

// TestAnnounceRound: each request of a round gets a PendingRequest of its own, named by the call
// and the request's id, showing the same call; the call records both.
func TestAnnounceRound(t *testing.T) {
	ctx := context.Background()
	run := decisionRun("")
	e := newDecisionEnv(t)
	st := stateOf(roundCall())
	s := decisionScope(run, st, map[string]*toolnexusv1alpha1.PendingRequest{})
	if err := e.r.announce(ctx, s); err != nil {
		t.Fatalf("announce: %v", err)
	}
	asks := st.Calls[0].Asks()
	want := []string{requestName("deploy", 1, "call_1/req-call_1"), requestName("deploy", 1, "call_1/req-call_1-consent")}
	var got []string
	for i, a := range asks {
		if a.Announced == nil {
			t.Fatalf("request %d of the round was not announced", i)
		}
		got = append(got, a.Announced.Name)
		p := e.request(t, a.Announced.Name)
		if p == nil || p.Spec.Request.ID != a.Request.ID || p.Spec.Request.Kind != a.Request.Kind || p.Spec.ToolCall.Arguments != decisionArgs {
			t.Errorf("PendingRequest %s = %+v, want request %s of the call", a.Announced.Name, p, a.Request.ID)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	e.checkEvents(t, s, []string{"Normal " + EventToolSuspended, "Normal " + EventToolSuspended})
	if n := len(openSummaries(s)); n != 2 {
		t.Errorf("status lists %d open requests, want 2", n)
	}
}

// TestSyncRequestsOfARound: an answer taken in waits for the round's other request; when one is
// refused, the call is done and the request it no longer waits on is withdrawn, saying so, while
// the run goes on.
func TestSyncRequestsOfARound(t *testing.T) {
	ctx := context.Background()
	run := decisionRun("")
	call := roundCall()
	call.Announced = &loop.Announcement{Name: requestName("deploy", 1, "call_1/req-call_1"), UID: "uid-call_1"}
	call.Round.More[0].Announced = &loop.Announcement{Name: requestName("deploy", 1, "call_1/req-call_1-consent"), UID: "uid-consent"}
	names := []string{call.Announced.Name, call.Round.More[0].Announced.Name}
	// requests are the round's PendingRequests as the API holds them, the region's answered with
	// region when given, the consent's with consent.
	requests := func(region, consent *toolnexusv1alpha1.Answer) *decisionEnv {
		regionReq, consentReq := requestFor(t, run, call), requestFor(t, run, call)
		regionReq.Name = names[0]
		consentReq.Name, consentReq.UID = names[1], "uid-consent"
		consentReq.Spec.Request = toolnexusv1alpha1.Request{ID: "req-call_1-consent", Kind: tools.KindAuthorization, Prompt: "Grant access", URL: "https://consent.example.com/x"}
		if region != nil {
			answeredBy("alice", *region)(regionReq)
		}
		if consent != nil {
			answeredBy("bob", *consent)(consentReq)
		}
		return newDecisionEnv(t, regionReq, consentReq)
	}
	resolved := func(e *decisionEnv, name string) *metav1.Condition {
		return meta.FindStatusCondition(e.request(t, name).Status.Conditions, toolnexusv1alpha1.ConditionResolved)
	}

	e := requests(&regionAnswer, nil)
	st := stateOf(call)
	if err := st.AnswerAsk("call_1", 0, regionLoopAnswer); err != nil {
		t.Fatal(err)
	}
	if err := e.r.syncRequests(ctx, decisionScope(run, st, e.cached(t, names...))); err != nil {
		t.Fatalf("syncRequests: %v", err)
	}
	if c := resolved(e, names[0]); c == nil || c.Reason != toolnexusv1alpha1.ReasonAnswerTaken {
		t.Errorf("the answered request is Resolved %+v, want AnswerTaken", c)
	}
	if p := e.request(t, names[1]); p.Status.Phase != toolnexusv1alpha1.RequestPhaseWaiting {
		t.Errorf("the other request is %s, want Waiting", p.Status.Phase)
	}

	declined := toolnexusv1alpha1.Answer{OK: false, Reason: tools.ReasonDeclined}
	e = requests(nil, &declined)
	st = stateOf(call)
	if err := st.AnswerAsk("call_1", 1, tools.AnswerDeclined("", "")); err != nil {
		t.Fatal(err)
	}
	if err := e.r.syncRequests(ctx, decisionScope(run, st, e.cached(t, names...))); err != nil {
		t.Fatalf("syncRequests: %v", err)
	}
	p, c := e.request(t, names[0]), resolved(e, names[0])
	if p.Status.Phase != toolnexusv1alpha1.RequestPhaseCancelled || c == nil || c.Reason != toolnexusv1alpha1.ReasonRunGone ||
		c.Message != "Its call no longer waits on it (another request of the call was refused, or its work ended); the request was cancelled" {
		t.Errorf("the withdrawn request: phase %s, Resolved %+v", p.Status.Phase, c)
	}
	if c := resolved(e, names[1]); c == nil || c.Reason != toolnexusv1alpha1.ReasonAnswerConsumed {
		t.Errorf("the refused request is Resolved %+v, want AnswerConsumed", c)
	}
}

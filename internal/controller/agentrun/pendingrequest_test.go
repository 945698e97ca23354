package agentrun

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller/policy"
	"github.com/toolnexus/operator/internal/controller/runspec"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/tools"
)

// Every request of a run names who created the run, the gate's and the tool's own alike, and
// building it again (after a crash, to adopt what the first build created) gives the same spec.
func TestNewPendingRequestCopiesTheRequester(t *testing.T) {
	gated := waitingCall("call_2")
	gated.Approval = &tools.Answer{OK: true}
	for _, tc := range []struct {
		name        string
		requestedBy string
		call        loop.Call
	}{
		{"a person's run", "alice", waitingCall("call_1")},
		{"a CronJob's run", "system:serviceaccount:tenant:nightly", waitingCall("call_1")},
		{"the tool's own request after its gate", "alice", gated},
		{"a run stored before requesters were stamped", "", waitingCall("call_1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := decisionRun(toolnexusv1alpha1.OnTimeoutDecline)
			run.Spec.RequestedBy = tc.requestedBy
			preq, err := newPendingRequest(run, run.Spec.Suspension, 1, tc.call, tc.call.Asks()[0], false)
			if err != nil {
				t.Fatal(err)
			}
			if preq.Spec.RequestedBy != tc.requestedBy {
				t.Errorf("spec.requestedBy = %q, want the run's %q", preq.Spec.RequestedBy, tc.requestedBy)
			}
			again, err := newPendingRequest(run.DeepCopy(), run.Spec.Suspension, 1, tc.call, tc.call.Asks()[0], false)
			if err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(again.Spec, preq.Spec) {
				t.Errorf("a second build differs: %+v, first %+v", again.Spec, preq.Spec)
			}
		})
	}
}

// A policy's gate takes who decides from the policy's terms saved with the call, never from the
// run: the run's approvers do not widen it. A later gate over the same call gets a name of its
// own, and with auditing every request keeps the audit finalizer.
func TestNewPendingRequestOfAPolicyGate(t *testing.T) {
	terms := policy.Terms{
		Policy:    toolnexusv1alpha1.PolicyReference{Name: "prod-changes", Generation: 3},
		Approvers: toolnexusv1alpha1.Approvers{Groups: []string{"platform"}}, Required: 2, ExcludeRequester: true,
		Escalation: []toolnexusv1alpha1.EscalationStep{{Approvers: &toolnexusv1alpha1.Approvers{Groups: []string{"leads"}}}},
	}
	raw, err := json.Marshal(terms)
	if err != nil {
		t.Fatal(err)
	}
	call := waitingCall("call_1")
	call.Gated, call.Gate = true, &loop.Gate{Key: "policy/prod-changes", Terms: raw}
	run := decisionRun(toolnexusv1alpha1.OnTimeoutDecline)
	first, err := newPendingRequest(run, run.Spec.Suspension, 1, call, call.Asks()[0], true)
	if err != nil {
		t.Fatal(err)
	}
	want := toolnexusv1alpha1.PendingRequestSpec{
		RunRef: first.Spec.RunRef, ToolCall: first.Spec.ToolCall, Request: first.Spec.Request,
		Policy: &terms.Policy, Approvers: &terms.Approvers, Required: 2, ExcludeRequester: true, Escalation: terms.Escalation,
	}
	if !equality.Semantic.DeepEqual(first.Spec, want) {
		t.Errorf("spec = %+v, want the policy's terms %+v", first.Spec, want)
	}
	if first.Name != "deploy-1-call-1" || !slices.Equal(first.Finalizers, []string{toolnexusv1alpha1.AuditFinalizer}) {
		t.Errorf("name %s, finalizers %v; want deploy-1-call-1 with the audit finalizer", first.Name, first.Finalizers)
	}

	call.Passed = []string{"policy/a-first"}
	later, err := newPendingRequest(run, run.Spec.Suspension, 1, call, call.Asks()[0], false)
	if err != nil {
		t.Fatal(err)
	}
	if later.Name == first.Name || len(later.Finalizers) != 0 {
		t.Errorf("the second gate's request is named %s (the first's %s), finalizers %v", later.Name, first.Name, later.Finalizers)
	}

	call.Gate.Terms = []byte(`{"policy":{}}`)
	if _, err := newPendingRequest(run, run.Spec.Suspension, 1, call, call.Asks()[0], false); err == nil {
		t.Error("terms that name no policy built a request")
	}
}

// fixedPolicies answers every Check with its gates.
type fixedPolicies []policy.Gate

func (f fixedPolicies) Check(context.Context, policy.Call) ([]policy.Gate, error) { return f, nil }

// A policy that excludes the requester cannot be kept by a run that does not say who created it:
// its gate refuses the call instead of letting anyone approve.
func TestExcludeRequesterNeedsARequester(t *testing.T) {
	gate := policy.Gate{Policy: "four-eyes", Generation: 1, Request: &tools.Request{ID: "policy:four-eyes:call_1", Kind: tools.KindApproval},
		Terms: policy.Terms{Policy: toolnexusv1alpha1.PolicyReference{Name: "four-eyes", Generation: 1}, ExcludeRequester: true, Required: 1}}
	r := &Reconciler{Policies: fixedPolicies{gate}}
	for requestedBy, refused := range map[string]bool{"": true, "alice": false} {
		run := decisionRun(toolnexusv1alpha1.OnTimeoutDecline)
		run.Spec.RequestedBy = requestedBy
		gates, err := r.policyGates(run)(context.Background(), runspec.PolicyCall{Tool: "deploy", ID: "call_1"})
		if err != nil || len(gates) != 1 {
			t.Fatalf("requestedBy %q: gates %v, %v", requestedBy, gates, err)
		}
		if got := strings.Contains(gates[0].Refused, "excludes the requester"); got != refused {
			t.Errorf("requestedBy %q: refused %q, want refused %v", requestedBy, gates[0].Refused, refused)
		}
		if !refused && len(gates[0].Terms) == 0 {
			t.Errorf("requestedBy %q: the gate carries no terms", requestedBy)
		}
	}
}

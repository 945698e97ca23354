package agentrun

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
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
			preq, err := newPendingRequest(run, run.Spec.Suspension, 1, tc.call)
			if err != nil {
				t.Fatal(err)
			}
			if preq.Spec.RequestedBy != tc.requestedBy {
				t.Errorf("spec.requestedBy = %q, want the run's %q", preq.Spec.RequestedBy, tc.requestedBy)
			}
			again, err := newPendingRequest(run.DeepCopy(), run.Spec.Suspension, 1, tc.call)
			if err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(again.Spec, preq.Spec) {
				t.Errorf("a second build differs: %+v, first %+v", again.Spec, preq.Spec)
			}
		})
	}
}

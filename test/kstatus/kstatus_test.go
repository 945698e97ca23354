// Package kstatus_test checks that the status an AgentRun carries in each phase reads, through
// kstatus (sigs.k8s.io/cli-utils/pkg/kstatus, what Flux health checks, `kubectl wait`-style
// tooling and cli-utils appliers use), as a GitOps tool should see it: a succeeded run is Current,
// a failed or incomplete run Failed, and a run still going (pending, running or waiting on a
// person) InProgress.
//
// kstatus reads no domain conditions: for a custom resource it looks only at
// status.observedGeneration and at the conditions Reconciling (True: InProgress) and Stalled
// (True: Failed), else it reports Current. So besides Succeeded and Suspended, the AgentRun status
// carries Reconciling=True while Succeeded is Unknown (the run is active) and Stalled=True while
// Succeeded is False (failed, incomplete or cancelled), both with the reason of Succeeded. The
// statuses below are built by hand, as the controller writes them, so that this package does not
// depend on the controller.
package kstatus_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// The API's names for the kstatus condition types.
const (
	reconciling = toolnexusv1alpha1.ConditionReconciling
	stalled     = toolnexusv1alpha1.ConditionStalled
)

func TestConditionTypesAreKstatus(t *testing.T) {
	if reconciling != string(status.ConditionReconciling) || stalled != string(status.ConditionStalled) {
		t.Errorf("condition types %q and %q, kstatus reads %q and %q", reconciling, stalled,
			status.ConditionReconciling, status.ConditionStalled)
	}
}

func condition(typ string, s metav1.ConditionStatus, reason string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: s, Reason: reason, Message: reason, ObservedGeneration: 3,
		LastTransitionTime: metav1.Unix(1700000000, 0)}
}

// runStatus is the status of a run in phase: Succeeded (Unknown while active) with reason,
// Suspended, and the kstatus conditions.
func runStatus(phase toolnexusv1alpha1.RunPhase, succeeded metav1.ConditionStatus, reason string) toolnexusv1alpha1.AgentRunStatus {
	suspended := condition(toolnexusv1alpha1.ConditionSuspended, metav1.ConditionFalse, toolnexusv1alpha1.ReasonNoOpenRequests)
	if phase == toolnexusv1alpha1.RunPhaseSuspended {
		suspended = condition(toolnexusv1alpha1.ConditionSuspended, metav1.ConditionTrue, toolnexusv1alpha1.ReasonOpenRequests)
	}
	conds := []metav1.Condition{condition(toolnexusv1alpha1.ConditionSucceeded, succeeded, reason), suspended}
	switch succeeded {
	case metav1.ConditionUnknown:
		conds = append(conds, condition(reconciling, metav1.ConditionTrue, reason))
	case metav1.ConditionFalse:
		conds = append(conds, condition(stalled, metav1.ConditionTrue, reason))
	}
	return toolnexusv1alpha1.AgentRunStatus{Phase: phase, Conditions: conds, ObservedGeneration: 3}
}

func compute(t *testing.T, st toolnexusv1alpha1.AgentRunStatus, generation int64) *status.Result {
	t.Helper()
	run := &toolnexusv1alpha1.AgentRun{
		TypeMeta:   metav1.TypeMeta{APIVersion: toolnexusv1alpha1.GroupVersion.String(), Kind: "AgentRun"},
		ObjectMeta: metav1.ObjectMeta{Name: "buy-gpu", Namespace: "team-a", Generation: generation},
		Spec:       toolnexusv1alpha1.AgentRunSpec{Model: toolnexusv1alpha1.ModelSpec{Name: "m"}, Prompt: "p"},
		Status:     st,
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(run)
	if err != nil {
		t.Fatal(err)
	}
	res, err := status.Compute(&unstructured.Unstructured{Object: obj})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestAgentRunStatusReadsAsKstatus(t *testing.T) {
	tests := []struct {
		name      string
		phase     toolnexusv1alpha1.RunPhase
		succeeded metav1.ConditionStatus
		reason    string
		want      status.Status
	}{
		{"pending", toolnexusv1alpha1.RunPhasePending, metav1.ConditionUnknown, toolnexusv1alpha1.ReasonPending, status.InProgressStatus},
		{"running", toolnexusv1alpha1.RunPhaseRunning, metav1.ConditionUnknown, toolnexusv1alpha1.ReasonRunning, status.InProgressStatus},
		{"waiting for a Secret", toolnexusv1alpha1.RunPhasePending, metav1.ConditionUnknown, toolnexusv1alpha1.ReasonSecretNotFound, status.InProgressStatus},
		{"retrying the model", toolnexusv1alpha1.RunPhaseRunning, metav1.ConditionUnknown, toolnexusv1alpha1.ReasonModelRetrying, status.InProgressStatus},
		{"suspended", toolnexusv1alpha1.RunPhaseSuspended, metav1.ConditionUnknown, toolnexusv1alpha1.ReasonWaitingForAnswer, status.InProgressStatus},
		{"succeeded", toolnexusv1alpha1.RunPhaseSucceeded, metav1.ConditionTrue, toolnexusv1alpha1.ReasonCompleted, status.CurrentStatus},
		{"incomplete", toolnexusv1alpha1.RunPhaseIncomplete, metav1.ConditionFalse, toolnexusv1alpha1.ReasonMaxTurns, status.FailedStatus},
		{"failed", toolnexusv1alpha1.RunPhaseFailed, metav1.ConditionFalse, toolnexusv1alpha1.ReasonModelError, status.FailedStatus},
		{"failed on expiry", toolnexusv1alpha1.RunPhaseFailed, metav1.ConditionFalse, toolnexusv1alpha1.ReasonRequestExpired, status.FailedStatus},
		{"invalid spec", toolnexusv1alpha1.RunPhaseFailed, metav1.ConditionFalse, toolnexusv1alpha1.ReasonInvalidSpec, status.FailedStatus},
		{"cancelled", toolnexusv1alpha1.RunPhaseFailed, metav1.ConditionFalse, toolnexusv1alpha1.ReasonCancelled, status.FailedStatus},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := compute(t, runStatus(tt.phase, tt.succeeded, tt.reason), 3)
			if diff := cmp.Diff(tt.want, res.Status); diff != "" {
				t.Errorf("kstatus (-want +got):\n%s\nmessage: %s", diff, res.Message)
			}
		})
	}
}

func TestUnobservedGenerationIsInProgress(t *testing.T) {
	// spec.cancel was just set: the status still describes generation 3.
	res := compute(t, runStatus(toolnexusv1alpha1.RunPhaseSucceeded, metav1.ConditionTrue, toolnexusv1alpha1.ReasonCompleted), 4)
	if res.Status != status.InProgressStatus {
		t.Errorf("kstatus = %s, want %s (%s)", res.Status, status.InProgressStatus, res.Message)
	}
}

// Without Reconciling and Stalled, kstatus cannot tell an active or failed run from a finished
// one: Succeeded and Suspended mean nothing to it.
func TestSucceededAndSuspendedAloneReadAsCurrent(t *testing.T) {
	for _, st := range []toolnexusv1alpha1.AgentRunStatus{
		runStatus(toolnexusv1alpha1.RunPhaseRunning, metav1.ConditionUnknown, toolnexusv1alpha1.ReasonRunning),
		runStatus(toolnexusv1alpha1.RunPhaseFailed, metav1.ConditionFalse, toolnexusv1alpha1.ReasonModelError),
	} {
		st.Conditions = st.Conditions[:2]
		if res := compute(t, st, 3); res.Status != status.CurrentStatus {
			t.Errorf("%s without kstatus conditions: kstatus = %s, want %s", st.Phase, res.Status, status.CurrentStatus)
		}
	}
}

package agentrun

// How GitOps tools read the statuses the AgentRun controller writes. Every status here comes from
// the real setStatus and setRequestStatus, goes through JSON as it would through the API server,
// and is then read twice, by kstatus and by the Argo CD health scripts of docs/gitops.md
// (internal/testenv/gitopshealth).

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/runstore"
	"github.com/toolnexus/operator/internal/testenv/gitopshealth"
	"github.com/toolnexus/operator/internal/tools"
)

// runSituation is a run at one point of its life, as the reconcile that writes its status sees it.
type runSituation struct {
	name     string
	rec      func() runstore.Record
	progress progress
	kstatus  gitopshealth.Health
	argo     gitopshealth.Health
}

const (
	healthPrompt  = "Approve purchase of gpu?"
	healthRequest = "buy-gpu-1-call-1"
)

// suspendedOnApproval is a run parked on an approval whose PendingRequest has been created.
func suspendedOnApproval() *loop.State {
	return &loop.State{Turn: 1, Calls: []loop.Call{{
		ID: "call_1", Name: "buy", Arguments: `{"item":"gpu"}`, Args: `{"item":"gpu"}`, Phase: loop.PhaseSuspended,
		Request:   &tools.Request{ID: "approve-1", Kind: "approval", Prompt: healthPrompt},
		Announced: &loop.Announcement{Name: healthRequest, UID: "u-1"},
	}}}
}

// failedRun is a run its host ended with reason (a failure or a cancellation): kstatus reads it
// Failed and Argo CD Degraded, both with the reason's message.
func failedRun(name string, st *loop.State, head *toolnexusv1alpha1.AgentRunRecord, reason, message string) runSituation {
	return runSituation{
		name: name,
		rec: func() runstore.Record {
			st.End(reason, message)
			return runstore.Record{State: st, Head: head}
		},
		kstatus: gitopshealth.Health{Status: string(status.FailedStatus), Message: message},
		argo:    gitopshealth.Health{Status: "Degraded", Message: "Failed (" + reason + "): " + message},
	}
}

func runSituations() []runSituation {
	const (
		secretMsg   = `model.apiKeySecretRef: Secret "openai" has no key "api-key" (or does not exist) in the run's namespace`
		retryMsg    = "Model request failed (attempt 1 of 4), retrying in 2s: HTTP 503"
		modelErrMsg = "HTTP 400: unknown model gpt-9"
		cancelMsg   = "The run was cancelled (spec.cancel)"
		mismatchMsg = "PendingRequest buy-gpu-1-call-1 is not the request this run created for call call_1 (it was replaced)"
		expiredMsg  = "PendingRequest buy-gpu-1-call-1 expired without an answer"
		invalidMsg  = "approvals[0].when: undeclared reference to 'args'"
		maxTurnsMsg = "The run used all its model turns without a final answer"
	)
	inProgress := func(msg string) gitopshealth.Health {
		return gitopshealth.Health{Status: string(status.InProgressStatus), Message: msg}
	}
	progressing := func(msg string) gitopshealth.Health { return gitopshealth.Health{Status: "Progressing", Message: msg} }
	return []runSituation{{
		name:    "not started",
		rec:     func() runstore.Record { return runstore.Record{State: loop.NewState("buy a gpu")} },
		kstatus: inProgress("The run has not taken its first step"),
		argo:    progressing("The run has not taken its first step"),
	}, {
		name:     "waiting for a Secret",
		rec:      func() runstore.Record { return runstore.Record{State: loop.NewState("buy a gpu")} },
		progress: progress{reason: toolnexusv1alpha1.ReasonSecretNotFound, message: secretMsg},
		kstatus:  inProgress(secretMsg),
		argo:     progressing(secretMsg),
	}, {
		name:    "running",
		rec:     func() runstore.Record { return runstore.Record{State: &loop.State{Turn: 1}, Head: savedHead} },
		kstatus: inProgress("The run is taking steps"),
		argo:    progressing("The run is taking steps"),
	}, {
		name: "model retrying",
		rec: func() runstore.Record {
			return runstore.Record{State: &loop.State{Turn: 1, ModelFailures: 1}, Head: savedHead}
		},
		progress: progress{reason: toolnexusv1alpha1.ReasonModelRetrying, message: retryMsg},
		kstatus:  inProgress(retryMsg),
		argo:     progressing(retryMsg),
	}, {
		// The call suspended but its PendingRequest is not created yet: nothing to answer.
		name: "suspended, request not yet announced",
		rec: func() runstore.Record {
			st := suspendedOnApproval()
			st.Calls[0].Announced = nil
			return runstore.Record{State: st, Head: savedHead}
		},
		kstatus: inProgress("The run is taking steps"),
		argo:    progressing("The run is taking steps"),
	}, {
		name:    "suspended with an open request",
		rec:     func() runstore.Record { return runstore.Record{State: suspendedOnApproval(), Head: savedHead} },
		kstatus: inProgress("The run waits for an answer to its PendingRequests"),
		argo:    gitopshealth.Health{Status: "Suspended", Message: "Waiting on 1 PendingRequest(s): " + healthRequest + " (approval): " + healthPrompt},
	}, {
		name: "done",
		rec: func() runstore.Record {
			return runstore.Record{State: &loop.State{Turn: 2, Status: loop.StatusDone, Text: "Bought one GPU."}, Head: savedHead}
		},
		kstatus: gitopshealth.Health{Status: string(status.CurrentStatus), Message: "Resource is current"},
		argo:    gitopshealth.Health{Status: "Healthy", Message: "Bought one GPU."},
	}, {
		name: "done without text",
		rec: func() runstore.Record {
			return runstore.Record{State: &loop.State{Turn: 2, Status: loop.StatusDone}, Head: savedHead}
		},
		kstatus: gitopshealth.Health{Status: string(status.CurrentStatus), Message: "Resource is current"},
		argo:    gitopshealth.Health{Status: "Healthy", Message: "Succeeded"},
	}, {
		name: "incomplete after maxTurns",
		rec: func() runstore.Record {
			return runstore.Record{State: &loop.State{Turn: 10, Status: loop.StatusIncomplete, Limit: loop.LimitMaxTurns}, Head: savedHead}
		},
		kstatus: gitopshealth.Health{Status: string(status.FailedStatus), Message: maxTurnsMsg},
		argo:    gitopshealth.Health{Status: "Degraded", Message: "Incomplete (MaxTurns): " + maxTurnsMsg},
	},
		failedRun("failed with ModelError", &loop.State{Turn: 1}, savedHead, toolnexusv1alpha1.ReasonModelError, modelErrMsg),
		failedRun("failed with RequestExpired", suspendedOnApproval(), savedHead, toolnexusv1alpha1.ReasonRequestExpired, expiredMsg),
		failedRun("failed with InvalidSpec before starting", loop.NewState("buy a gpu"), nil, toolnexusv1alpha1.ReasonInvalidSpec, invalidMsg),
		failedRun("cancelled while suspended", suspendedOnApproval(), savedHead, toolnexusv1alpha1.ReasonCancelled, cancelMsg),
		failedRun("failed with StateMismatch", suspendedOnApproval(), savedHead, toolnexusv1alpha1.ReasonStateMismatch, mismatchMsg),
	}
}

func situation(t *testing.T, name string) runSituation {
	t.Helper()
	for _, s := range runSituations() {
		if s.name == name {
			return s
		}
	}
	t.Fatalf("no run situation %q", name)
	return runSituation{}
}

func newHealthRun() *toolnexusv1alpha1.AgentRun {
	return &toolnexusv1alpha1.AgentRun{
		TypeMeta:   metav1.TypeMeta{APIVersion: toolnexusv1alpha1.GroupVersion.String(), Kind: "AgentRun"},
		ObjectMeta: metav1.ObjectMeta{Name: "buy-gpu", Namespace: "team-a", UID: "run-uid", Generation: 1},
		Spec:       toolnexusv1alpha1.AgentRunSpec{AgentSpec: toolnexusv1alpha1.AgentSpec{Model: toolnexusv1alpha1.ModelSpec{Name: "gpt-4o"}}, Prompt: "buy a gpu"},
	}
}

// writeStatus writes the run's status for situation s as a reconcile does: open requests from the
// record, then the real setStatus.
func writeStatus(run *toolnexusv1alpha1.AgentRun, s runSituation, now time.Time) {
	rec := s.rec()
	setStatus(run, &rec, openSummaries(&scope{rec: &rec}), s.progress, now)
}

// TestHealthOfAgentRun reads each situation's status, written by setStatus on a new run, through
// kstatus and the Argo CD script of docs/gitops.md.
func TestHealthOfAgentRun(t *testing.T) {
	script := gitopshealth.ArgoScript(t, "AgentRun")
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, s := range runSituations() {
		t.Run(s.name, func(t *testing.T) {
			run := newHealthRun()
			writeStatus(run, s, now)
			checkRunHealth(t, script, run, s.kstatus, s.argo)
		})
	}
}

// TestHealthOverARunsLife writes one run's status over and over, as reconciles do, so conditions
// of earlier situations must be cleared (a Reconciling left True would keep a finished run
// InProgress, a Suspended phase would outlive its answer).
func TestHealthOverARunsLife(t *testing.T) {
	script := gitopshealth.ArgoScript(t, "AgentRun")
	lives := map[string][]string{
		"succeeds": {"not started", "waiting for a Secret", "running", "model retrying", "suspended, request not yet announced",
			"suspended with an open request", "running", "done"},
		"is cancelled while suspended": {"not started", "running", "suspended with an open request", "cancelled while suspended"},
		"fails after retries":          {"running", "model retrying", "failed with ModelError"},
		"runs out of turns":            {"running", "suspended with an open request", "running", "incomplete after maxTurns"},
	}
	for name, life := range lives {
		t.Run(name, func(t *testing.T) {
			run := newHealthRun()
			now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
			for i, step := range life {
				s := situation(t, step)
				writeStatus(run, s, now.Add(time.Duration(i)*time.Minute))
				t.Run(step, func(t *testing.T) { checkRunHealth(t, script, run, s.kstatus, s.argo) })
			}
		})
	}
}

// TestHealthOfUnobservedSpec: spec.cancel set on a run whose status still describes the previous
// generation reads as in progress until the controller has seen it.
func TestHealthOfUnobservedSpec(t *testing.T) {
	script := gitopshealth.ArgoScript(t, "AgentRun")
	done := situation(t, "done")
	run := newHealthRun()
	writeStatus(run, done, time.Unix(100, 0))
	run.Spec.Cancel, run.Generation = true, 2
	checkRunHealth(t, script, run,
		gitopshealth.Health{Status: string(status.InProgressStatus), Message: "AgentRun generation is 2, but latest observed generation is 1"},
		gitopshealth.Health{Status: "Progressing", Message: "The controller has not yet seen the latest spec"})
	// A finished run stays as it ended: cancelling it afterwards changes nothing but the generation.
	writeStatus(run, done, time.Unix(200, 0))
	checkRunHealth(t, script, run, done.kstatus, done.argo)
}

// TestKstatusNeedsReconcilingAndStalled shows the assertions above depend on setStatus writing the
// kstatus conditions: without them kstatus reads an active or failed run as Current.
func TestKstatusNeedsReconcilingAndStalled(t *testing.T) {
	if toolnexusv1alpha1.ConditionReconciling != string(status.ConditionReconciling) ||
		toolnexusv1alpha1.ConditionStalled != string(status.ConditionStalled) {
		t.Fatalf("condition types %q and %q, kstatus reads %q and %q", toolnexusv1alpha1.ConditionReconciling,
			toolnexusv1alpha1.ConditionStalled, status.ConditionReconciling, status.ConditionStalled)
	}
	for _, name := range []string{"running", "suspended with an open request", "failed with ModelError"} {
		run := newHealthRun()
		writeStatus(run, situation(t, name), time.Unix(100, 0))
		var kept []metav1.Condition
		for _, c := range run.Status.Conditions {
			if c.Type != toolnexusv1alpha1.ConditionReconciling && c.Type != toolnexusv1alpha1.ConditionStalled {
				kept = append(kept, c)
			}
		}
		if len(kept) == len(run.Status.Conditions) {
			t.Errorf("%s: setStatus wrote neither Reconciling nor Stalled", name)
		}
		run.Status.Conditions = kept
		if got := gitopshealth.Kstatus(t, gitopshealth.AsServed(t, run)); got.Status != string(status.CurrentStatus) {
			t.Errorf("%s without Reconciling and Stalled: kstatus = %s, want %s", name, got.Status, status.CurrentStatus)
		}
	}
}

// TestHealthOfPendingRequest runs the PendingRequest script of docs/gitops.md over statuses the
// real setRequestStatus writes.
func TestHealthOfPendingRequest(t *testing.T) {
	script := gitopshealth.ArgoScript(t, "PendingRequest")
	waiting := gitopshealth.Health{Status: "Suspended", Message: "Waiting for an answer: " + healthPrompt}
	cases := []struct {
		name       string
		answer     *toolnexusv1alpha1.Answer
		answeredBy string
		open       bool
		noStatus   bool
		want       gitopshealth.Health
	}{
		{name: "just created, no status yet", noStatus: true, want: waiting},
		{name: "waiting", open: true, want: waiting},
		{name: "approved, not yet consumed", answer: &toolnexusv1alpha1.Answer{OK: true}, answeredBy: "alice", open: true,
			want: gitopshealth.Health{Status: "Healthy", Message: "Answered by alice"}},
		{name: "approved and consumed", answer: &toolnexusv1alpha1.Answer{OK: true}, answeredBy: "alice",
			want: gitopshealth.Health{Status: "Healthy", Message: "Answered by alice"}},
		{name: "declined", answer: &toolnexusv1alpha1.Answer{OK: false, Reason: "over budget"}, answeredBy: "bob",
			want: gitopshealth.Health{Status: "Healthy", Message: "Answered by bob"}},
		{name: "expired", answer: &toolnexusv1alpha1.Answer{OK: false, Reason: tools.ReasonExpired}, answeredBy: toolnexusv1alpha1.ExpiredAnswerer,
			want: gitopshealth.Health{Status: "Degraded", Message: "Expired without an answer"}},
		{name: "cancelled with its run", want: gitopshealth.Health{Status: "Healthy", Message: "Cancelled with its run"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			preq := &toolnexusv1alpha1.PendingRequest{
				TypeMeta:   metav1.TypeMeta{APIVersion: toolnexusv1alpha1.GroupVersion.String(), Kind: "PendingRequest"},
				ObjectMeta: metav1.ObjectMeta{Name: healthRequest, Namespace: "team-a", Generation: 1},
				Spec: toolnexusv1alpha1.PendingRequestSpec{
					RunRef:   toolnexusv1alpha1.RunReference{Name: "buy-gpu"},
					ToolCall: toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "buy", Arguments: `{"item":"gpu"}`},
					Request:  toolnexusv1alpha1.Request{ID: "approve-1", Kind: "approval", Prompt: healthPrompt},
				},
				Status: toolnexusv1alpha1.PendingRequestStatus{Answer: tc.answer, AnsweredBy: tc.answeredBy},
			}
			if !tc.noStatus {
				fate := requestDone
				if tc.open {
					fate = requestOpen
				}
				setRequestStatus(preq, fate, time.Unix(100, 0))
			}
			if diff := cmp.Diff(tc.want, gitopshealth.RunArgo(t, script, gitopshealth.AsServed(t, preq))); diff != "" {
				t.Errorf("Argo CD health (-want +got):\n%s\nphase: %s", diff, preq.Status.Phase)
			}
		})
	}
}

func checkRunHealth(t *testing.T, script string, run *toolnexusv1alpha1.AgentRun, wantKstatus, wantArgo gitopshealth.Health) {
	t.Helper()
	u := gitopshealth.AsServed(t, run)
	if diff := cmp.Diff(wantKstatus, gitopshealth.Kstatus(t, u)); diff != "" {
		t.Errorf("kstatus (-want +got):\n%s\nconditions: %+v", diff, run.Status.Conditions)
	}
	if diff := cmp.Diff(wantArgo, gitopshealth.RunArgo(t, script, u)); diff != "" {
		t.Errorf("Argo CD health (-want +got):\n%s\nphase: %s", diff, run.Status.Phase)
	}
}

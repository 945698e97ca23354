package agentrun

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/runstore"
)

func TestSetStatus(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	open := []toolnexusv1alpha1.PendingSummary{{Name: "r-1-call-1", Kind: "approval", Prompt: "approve?"}}
	type want struct {
		phase      toolnexusv1alpha1.RunPhase
		result     string
		text       string
		conditions map[string]string // type → status/reason
	}
	cases := map[string]struct {
		rec      runstore.Record
		open     []toolnexusv1alpha1.PendingSummary
		progress progress
		want     want
	}{
		"not started": {
			rec: runstore.Record{State: loop.NewState("hi")},
			want: want{phase: toolnexusv1alpha1.RunPhasePending, conditions: map[string]string{
				"Succeeded": "Unknown/Pending", "Suspended": "False/NoOpenRequests", "Reconciling": "True/Pending"}},
		},
		"running": {
			rec: runstore.Record{State: &loop.State{Turn: 1}, Head: savedHead},
			want: want{phase: toolnexusv1alpha1.RunPhaseRunning, conditions: map[string]string{
				"Succeeded": "Unknown/Running", "Suspended": "False/NoOpenRequests", "Reconciling": "True/Running"}},
		},
		"suspended": {
			rec: runstore.Record{State: &loop.State{Turn: 1}, Head: savedHead}, open: open,
			want: want{phase: toolnexusv1alpha1.RunPhaseSuspended, result: "pending", text: "approve?", conditions: map[string]string{
				"Succeeded": "Unknown/WaitingForAnswer", "Suspended": "True/OpenRequests", "Reconciling": "True/WaitingForAnswer"}},
		},
		"waiting for a secret": {
			rec:      runstore.Record{State: loop.NewState("hi")},
			progress: progress{reason: toolnexusv1alpha1.ReasonSecretNotFound, message: "no secret"},
			want: want{phase: toolnexusv1alpha1.RunPhasePending, conditions: map[string]string{
				"Succeeded": "Unknown/SecretNotFound", "Suspended": "False/NoOpenRequests", "Reconciling": "True/SecretNotFound"}},
		},
		"done": {
			rec: runstore.Record{State: &loop.State{Turn: 2, Status: loop.StatusDone, Text: "bye"}, Head: savedHead},
			want: want{phase: toolnexusv1alpha1.RunPhaseSucceeded, result: "done", text: "bye", conditions: map[string]string{
				"Succeeded": "True/Completed", "Suspended": "False/NoOpenRequests"}},
		},
		"incomplete": {
			rec: runstore.Record{State: &loop.State{Turn: 10, Status: loop.StatusIncomplete, Limit: loop.LimitMaxTurns}, Head: savedHead},
			want: want{phase: toolnexusv1alpha1.RunPhaseIncomplete, result: "incomplete", conditions: map[string]string{
				"Succeeded": "False/MaxTurns", "Suspended": "False/NoOpenRequests", "Stalled": "True/MaxTurns"}},
		},
		"failed, open requests dropped": {
			rec: runstore.Record{State: &loop.State{Turn: 1, Outcome: &loop.Outcome{Reason: toolnexusv1alpha1.ReasonModelError, Message: "HTTP 400"}}, Head: savedHead},
			want: want{phase: toolnexusv1alpha1.RunPhaseFailed, conditions: map[string]string{
				"Succeeded": "False/ModelError", "Suspended": "False/NoOpenRequests", "Stalled": "True/ModelError"}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			run := &toolnexusv1alpha1.AgentRun{ObjectMeta: metav1.ObjectMeta{Name: "r", Generation: 1}}
			open := tc.open
			if tc.rec.State.Ended() {
				open = nil
			}
			setStatus(run, &tc.rec, open, tc.progress, now)
			got := want{phase: run.Status.Phase, result: run.Status.Result, text: run.Status.Text, conditions: map[string]string{}}
			for _, c := range run.Status.Conditions {
				got.conditions[c.Type] = string(c.Status) + "/" + c.Reason
				if c.ObservedGeneration != 1 {
					t.Errorf("condition %s has observedGeneration %d, want 1", c.Type, c.ObservedGeneration)
				}
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
			finishedAt := run.Status.CompletionTime != nil
			if finishedAt != finished(run) {
				t.Errorf("completionTime set = %t, finished = %t", finishedAt, finished(run))
			}
		})
	}
}

// A reconcile that changes nothing must not rewrite conditions (no empty patches).
func TestSetStatusIsStable(t *testing.T) {
	run := &toolnexusv1alpha1.AgentRun{ObjectMeta: metav1.ObjectMeta{Name: "r", Generation: 1}}
	rec := &runstore.Record{State: &loop.State{Turn: 1}, Head: savedHead}
	setStatus(run, rec, nil, progress{}, time.Unix(100, 0))
	first := run.Status.DeepCopy()
	setStatus(run, rec, nil, progress{}, time.Unix(200, 0))
	if diff := cmp.Diff(first, &run.Status); diff != "" {
		t.Errorf("second setStatus changed status (-first +second):\n%s", diff)
	}
}

func TestRequestName(t *testing.T) {
	cases := map[string]struct {
		run, callID string
		turn        int
		want        string
	}{
		"openai ids read as in the spec":  {run: "buy-gpu", turn: 1, callID: "call_1", want: "buy-gpu-1-call-1"},
		"upper case gets a hash suffix":   {run: "r", turn: 2, callID: "toolu_01ABC", want: "r-2-toolu-01abc-"},
		"empty id is still a valid name":  {run: "r", turn: 3, callID: "", want: "r-3-"},
		"two ids that clean alike differ": {run: "r", turn: 1, callID: "a.b", want: "r-1-a-b-"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := requestName(tc.run, tc.turn, tc.callID)
			if len(tc.want) > 0 && got[:min(len(got), len(tc.want))] != tc.want {
				t.Errorf("requestName = %q, want prefix %q", got, tc.want)
			}
			if len(got) > maxNameLen || got[len(got)-1] == '-' {
				t.Errorf("requestName = %q is not a valid object name", got)
			}
		})
	}
	long := requestName(strings.Repeat("a", 250), 1, "call_1")
	if len(long) > maxNameLen {
		t.Errorf("long name has %d characters", len(long))
	}
}

// savedHead stands for a record that has been saved once.
var savedHead = &toolnexusv1alpha1.AgentRunRecord{}

// A running run's status is patched on every transition at once, and when only its counters
// changed at most every statusInterval: the steps of a fast run do not each cost a status patch.
func TestProjectReportsProgressAtMostEveryInterval(t *testing.T) {
	run := decisionRun(toolnexusv1alpha1.OnTimeoutDecline)
	e := newDecisionEnv(t, run)
	ms := time.Millisecond
	steps := []struct {
		name     string
		at       time.Duration
		turn     int
		inflight bool
		progress progress
		done     bool
		patched  bool
	}{
		{name: "the first step started the run", at: 0, turn: 1, inflight: true, patched: true},
		{name: "a turn soon after", at: 500 * ms, turn: 2, inflight: true},
		{name: "another within the interval", at: statusInterval - 100*ms, turn: 3, inflight: true},
		{name: "a turn once the interval has passed", at: statusInterval + 100*ms, turn: 4, inflight: true, patched: true},
		{name: "a turn with no step in flight", at: statusInterval + 200*ms, turn: 5, patched: true},
		{name: "a turn whose model failed", at: statusInterval + 300*ms, turn: 6, inflight: true, patched: true,
			progress: progress{reason: toolnexusv1alpha1.ReasonModelRetrying, message: "retrying"}},
		{name: "the turn retried", at: statusInterval + 400*ms, turn: 6, inflight: true, patched: true},
		{name: "the end", at: statusInterval + 500*ms, turn: 7, done: true, patched: true},
	}
	for _, step := range steps {
		cur := &toolnexusv1alpha1.AgentRun{}
		if err := e.c.Get(context.Background(), client.ObjectKeyFromObject(run), cur); err != nil {
			t.Fatal(err)
		}
		st := &loop.State{Turn: step.turn}
		if step.done {
			st.Status = loop.StatusDone
		}
		s := &scope{run: cur, before: cur.DeepCopy(), rec: &runstore.Record{State: st, Head: savedHead}, spec: &cur.Spec,
			requests: map[string]*toolnexusv1alpha1.PendingRequest{}, now: decisionNow.Add(step.at),
			inflight: step.inflight, progress: step.progress}
		patches := e.statusPatches
		if err := e.r.project(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := e.statusPatches > patches; got != step.patched {
			t.Errorf("%s: status patched %v, want %v", step.name, got, step.patched)
		}
		if err := e.c.Get(context.Background(), client.ObjectKeyFromObject(run), cur); err != nil {
			t.Fatal(err)
		}
		if step.patched && cur.Status.Turns != int32(step.turn) {
			t.Errorf("%s: status.turns %d, want %d", step.name, cur.Status.Turns, step.turn)
		}
	}
}

// The run's start and end events are recorded once, by the reconcile whose status patch first shows
// what this process saved: not from the cache's copy of the status, which may not show the last
// patch yet (each step below starts from a copy without status), and not lost when a patch fails.
func TestStartAndEndReportedOnce(t *testing.T) {
	type step struct {
		name                              string
		ended, startedAtLoad, endedAtLoad bool
		failPatch                         bool
		// saveOnly saves the state and stops there, as a reconcile that fails between its save and
		// its status patch (a request's update, a Secret's read) does.
		saveOnly bool
		// cancel cancels the run (spec.cancel): advance ends it, and it is saved and projected.
		cancel bool
		want   []string
	}
	start, end, cancelled := "Normal "+EventRunStarted, "Normal "+EventRunSucceeded, "Normal "+EventRunCancelled
	sequences := map[string][]step{
		"a reconcile each": {
			{name: "the reconcile that created the record", want: []string{start}},
			{name: "a later one whose cache lacks the start", startedAtLoad: true},
			{name: "the reconcile that saved the end", ended: true, startedAtLoad: true, want: []string{end}},
			{name: "a later one whose cache lacks the end", ended: true, startedAtLoad: true, endedAtLoad: true},
		},
		"created and ended by one reconcile": {{name: "the fast path", ended: true, want: []string{start, end}}},
		"status patches failing": {
			{name: "the patch after the start fails", failPatch: true},
			{name: "the next one lands", startedAtLoad: true, want: []string{start}},
			{name: "the patch after the end fails", ended: true, startedAtLoad: true, failPatch: true},
			{name: "the next one lands", ended: true, startedAtLoad: true, endedAtLoad: true, want: []string{end}},
			{name: "and another", ended: true, startedAtLoad: true, endedAtLoad: true},
		},
		"failing between the save and the status patch": {
			{name: "the reconcile that created the record", saveOnly: true},
			{name: "the next one", startedAtLoad: true, want: []string{start}},
			{name: "the reconcile that saved the end", ended: true, startedAtLoad: true, saveOnly: true},
			{name: "the next one", ended: true, startedAtLoad: true, endedAtLoad: true, want: []string{end}},
		},
		"cancelled after a failed patch": {
			{name: "the patch after the start fails", failPatch: true},
			{name: "the run is cancelled", startedAtLoad: true, cancel: true, want: []string{start, cancelled}},
		},
	}
	for name, steps := range sequences {
		t.Run(name, func(t *testing.T) {
			base := decisionRun(toolnexusv1alpha1.OnTimeoutDecline)
			e := newDecisionEnv(t, base)
			var saved *toolnexusv1alpha1.AgentRunRecord
			for _, st := range steps {
				state := &loop.State{Turn: 1}
				if st.ended {
					state.Status = loop.StatusDone
				}
				s := decisionScope(base.DeepCopy(), state, nil)
				s.rec.Head, s.startedAtLoad, s.endedAtLoad = savedHead, st.startedAtLoad, st.endedAtLoad
				if st.saveOnly {
					s.rec.Head = saved
					if err := e.r.save(context.Background(), s); err != nil {
						t.Fatalf("%s: save = %v", st.name, err)
					}
					saved = s.rec.Head
					if got := e.recorded(); len(got) > 0 {
						t.Errorf("%s: events before a status patch showed them: %v", st.name, got)
					}
					continue
				}
				if st.cancel {
					s.run.Spec.Cancel = true
					s.rec.Head = saved
					if _, err := e.r.stepEndPhase(context.Background(), s); err != nil {
						t.Fatal(err)
					}
					if err := e.r.save(context.Background(), s); err != nil {
						t.Fatal(err)
					}
				}
				e.failPatches = 0
				if st.failPatch {
					e.failPatches = 1
				}
				if err := e.r.project(context.Background(), s); (err != nil) != st.failPatch {
					t.Fatalf("%s: project = %v", st.name, err)
				}
				if diff := cmp.Diff(st.want, e.recorded()); diff != "" {
					t.Errorf("%s: events (-want +got):\n%s", st.name, diff)
				}
			}
		})
	}
}

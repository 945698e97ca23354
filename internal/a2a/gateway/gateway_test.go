package gateway

import (
	"encoding/json"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/a2a"
)

func runWith(cancel bool, pending []toolnexusv1alpha1.PendingSummary, conds ...metav1.Condition) *toolnexusv1alpha1.AgentRun {
	return &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Name: "buyer-1", UID: "u1"},
		Spec:       toolnexusv1alpha1.AgentRunSpec{Cancel: cancel, Prompt: "buy"},
		Status:     toolnexusv1alpha1.AgentRunStatus{Conditions: conds, Pending: pending, Text: "bought"},
	}
}

func succeeded(status metav1.ConditionStatus, reason string) metav1.Condition {
	return metav1.Condition{Type: toolnexusv1alpha1.ConditionSucceeded, Status: status, Reason: reason, Message: "why"}
}

func TestStateOf(t *testing.T) {
	approval := []toolnexusv1alpha1.PendingSummary{{Name: "p", Kind: "approval"}}
	login := []toolnexusv1alpha1.PendingSummary{{Name: "p", Kind: "authorization"}, {Name: "q", Kind: "approval"}}
	for _, tt := range []struct {
		name string
		run  *toolnexusv1alpha1.AgentRun
		want a2a.TaskState
	}{
		{"not started", runWith(false, nil), a2a.TaskStateSubmitted},
		{"pending", runWith(false, nil, succeeded(metav1.ConditionUnknown, toolnexusv1alpha1.ReasonPending)), a2a.TaskStateSubmitted},
		{"running", runWith(false, nil, succeeded(metav1.ConditionUnknown, toolnexusv1alpha1.ReasonRunning)), a2a.TaskStateWorking},
		{"asks an approval", runWith(false, approval, succeeded(metav1.ConditionUnknown, toolnexusv1alpha1.ReasonWaitingForAnswer)), a2a.TaskStateInputRequired},
		{"asks a login first", runWith(false, login, succeeded(metav1.ConditionUnknown, toolnexusv1alpha1.ReasonWaitingForAnswer)), a2a.TaskStateAuthRequired},
		{"completed", runWith(false, nil, succeeded(metav1.ConditionTrue, toolnexusv1alpha1.ReasonCompleted)), a2a.TaskStateCompleted},
		{"failed", runWith(false, nil, succeeded(metav1.ConditionFalse, toolnexusv1alpha1.ReasonModelError)), a2a.TaskStateFailed},
		{"out of turns", runWith(false, nil, succeeded(metav1.ConditionFalse, toolnexusv1alpha1.ReasonMaxTurns)), a2a.TaskStateFailed},
		{"cancelled", runWith(true, nil, succeeded(metav1.ConditionFalse, toolnexusv1alpha1.ReasonCancelled)), a2a.TaskStateCanceled},
		{"cancel asked, not seen yet", runWith(true, approval, succeeded(metav1.ConditionUnknown, toolnexusv1alpha1.ReasonWaitingForAnswer)), a2a.TaskStateCanceled},
		{"completed before the cancel was seen", runWith(true, nil, succeeded(metav1.ConditionTrue, toolnexusv1alpha1.ReasonCompleted)), a2a.TaskStateCompleted},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got, _ := stateOf(tt.run); got != tt.want {
				t.Errorf("stateOf = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestTaskProjection(t *testing.T) {
	run := runWith(false, []toolnexusv1alpha1.PendingSummary{{Name: "buyer-1-1-call-1", Kind: "authorization", Prompt: "Sign in", URL: "https://idp/authorize"}},
		succeeded(metav1.ConditionUnknown, toolnexusv1alpha1.ReasonWaitingForAnswer))
	preq := &toolnexusv1alpha1.PendingRequest{ObjectMeta: metav1.ObjectMeta{Name: "buyer-1-1-call-1", UID: "preq-uid"},
		Spec: toolnexusv1alpha1.PendingRequestSpec{ToolCall: toolnexusv1alpha1.ToolCall{Name: "calendar", Arguments: `{}`},
			Request: toolnexusv1alpha1.Request{ID: "r1", Kind: "authorization", Prompt: "Sign in", URL: "https://idp/authorize",
				Data: &apiextensionsv1.JSON{Raw: []byte(`{"auth_id":"a1"}`)}}}}
	task := view{run: run, details: map[string]*toolnexusv1alpha1.PendingRequest{preq.Name: preq}}.task(nil, true)
	if task.Status.State != a2a.TaskStateAuthRequired || task.Status.Message.MessageID != "request/preq-uid" ||
		task.Status.Message.Text() != "Sign in\nhttps://idp/authorize" {
		t.Fatalf("status %+v", task.Status)
	}
	asked := task.Status.Message.Requests()
	if len(asked) != 1 || asked[0].UID != "preq-uid" || asked[0].Tool != "calendar" || asked[0].Data["auth_id"] != "a1" {
		t.Errorf("requests %+v", asked)
	}
	if len(task.History) != 1 || task.History[0].Text() != "buy" {
		t.Errorf("history %+v", task.History)
	}
	none := int32(0)
	if got := (view{run: run}).task(&none, false); got.History != nil {
		t.Errorf("historyLength 0 keeps history %+v", got.History)
	}
	done := view{run: runWith(false, nil, succeeded(metav1.ConditionTrue, toolnexusv1alpha1.ReasonCompleted))}
	if got := done.task(nil, true); got.ArtifactText() != "bought" || got.Status.Message != nil {
		t.Errorf("completed task %+v", got)
	}
	if got := done.task(nil, false); got.Artifacts != nil {
		t.Errorf("artifacts left in: %+v", got.Artifacts)
	}
}

func TestAnswerOf(t *testing.T) {
	ask := func(kind string) view {
		run := runWith(false, []toolnexusv1alpha1.PendingSummary{{Name: "p1", Kind: kind}})
		preq := &toolnexusv1alpha1.PendingRequest{ObjectMeta: metav1.ObjectMeta{Name: "p1", UID: "uid-1"},
			Spec: toolnexusv1alpha1.PendingRequestSpec{Request: toolnexusv1alpha1.Request{ID: "req-1", Kind: kind}}}
		return view{run: run, details: map[string]*toolnexusv1alpha1.PendingRequest{"p1": preq}}
	}
	text := func(s string) *a2a.Message { return &a2a.Message{Parts: []a2a.Part{{Text: s}}} }
	data := func(s string) *a2a.Message {
		return &a2a.Message{Parts: []a2a.Part{{Text: "ignored"}, {Data: json.RawMessage(s)}}}
	}
	for _, tt := range []struct {
		name, kind string
		msg        *a2a.Message
		want       string // the answer as JSON, or the error's start
	}{
		{"approve", "approval", text("Approve."), `{"id":"req-1","requestUID":"uid-1","ok":true}`},
		{"decline", "approval", text("no"), `{"id":"req-1","requestUID":"uid-1","ok":false,"reason":"declined"}`},
		{"an approval needs a yes or a no", "approval", text("maybe later"), "Invalid parameters: a request of kind approval is answered with"},
		{"a login done", "authorization", text("done"), `{"id":"req-1","requestUID":"uid-1","ok":true}`},
		{"input", "input", text("staging"), `{"id":"req-1","requestUID":"uid-1","ok":true,"data":{"output":"staging"}}`},
		{"a tool_call needs data", "tool_call", text("x"), "Invalid parameters: a request of kind tool_call is answered with a data part"},
		{"a data part wins", "approval", data(`{"ok":false,"reason":"too dear"}`), `{"id":"req-1","requestUID":"uid-1","ok":false,"reason":"too dear"}`},
		{"a data part binds to the uid the client saw", "input", data(`{"ok":true,"requestUID":"uid-1","data":{"output":"x"}}`),
			`{"id":"req-1","requestUID":"uid-1","ok":true,"data":{"output":"x"}}`},
		{"a uid the task does not wait on", "input", data(`{"ok":true,"requestUID":"uid-old"}`), "Invalid parameters: task buyer-1 waits on no request uid-old"},
		{"an empty message", "input", &a2a.Message{Parts: []a2a.Part{{Data: json.RawMessage(`[1]`)}}}, "Invalid parameters: answer with text"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, answer, rpcErr := answerOf(ask(tt.kind), tt.msg)
			if rpcErr != nil {
				if !strings.HasPrefix(rpcErr.Message, tt.want) {
					t.Errorf("error %q, want %q", rpcErr.Message, tt.want)
				}
				return
			}
			raw, _ := json.Marshal(answer)
			if string(raw) != tt.want {
				t.Errorf("answer %s, want %s", raw, tt.want)
			}
		})
	}
}

func TestNeverActsAsSystemIdentities(t *testing.T) {
	for _, user := range []string{"system:serviceaccount:toolnexus-system:toolnexus-controller-manager", "system:anonymous", "system:node:n1", "system:admin", ""} {
		if err := actsAs(user); err == nil {
			t.Errorf("the gateway would act as %q", user)
		}
	}
	if err := actsAs("alice"); err != nil {
		t.Errorf("alice refused: %v", err)
	}
	g := &Gateway{}
	if _, err := g.clientAs("alice", []string{"team", "system:masters"}); err == nil || !strings.Contains(err.Error(), "system:masters") {
		t.Errorf("clientAs with system:masters: %v", err)
	}
}

func TestRunName(t *testing.T) {
	a := runName("buyer", "alice", "team-a", "m-1")
	if a != runName("buyer", "alice", "team-a", "m-1") || a == runName("buyer", "bob", "team-a", "m-1") || !strings.HasPrefix(a, "buyer-") {
		t.Errorf("runName is not a stable per-caller digest: %s", a)
	}
	long := runName(strings.Repeat("a.b-", 60), "alice", "team-a", "m-1")
	if len(long) > 63 || strings.Contains(long, ".") {
		t.Errorf("runName %q is no label value", long)
	}
}

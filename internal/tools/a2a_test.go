package tools

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/a2a"
	"github.com/toolnexus/operator/internal/netguard"
)

// fakeAgent is a remote A2A agent with one task whose state a test sets, speaking the JSON-RPC
// binding over HTTP; it records what it was sent.
type fakeAgent struct {
	mu       sync.Mutex
	task     *a2a.Task
	received []received
}

type received struct {
	method string
	header http.Header
	params json.RawMessage
}

func (f *fakeAgent) set(state a2a.TaskState, msg *a2a.Message, artifact string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.task = &a2a.Task{ID: "t-1", ContextID: "c-1", Status: a2a.TaskStatus{State: state, Message: msg}}
	if artifact != "" {
		f.task.Artifacts = []a2a.Artifact{{ArtifactID: "result", Parts: []a2a.Part{{Text: artifact}}}}
	}
}

func (f *fakeAgent) calls() []received {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]received(nil), f.received...)
}

func (f *fakeAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req a2a.Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.received = append(f.received, received{method: req.Method, header: r.Header.Clone(), params: req.Params})
	task := f.task
	f.mu.Unlock()
	resp := a2a.Response{JSONRPC: "2.0", ID: req.ID}
	switch {
	case task == nil:
		resp.Error = a2a.Errorf(a2a.CodeTaskNotFound, "", "Task not found: t-1")
	case req.Method == a2a.MethodSendMessage:
		resp.Result, _ = json.Marshal(a2a.SendMessageResponse{Task: task})
	default:
		resp.Result, _ = json.Marshal(task)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

func newA2AFake(t *testing.T, spec A2AToolSpec) (*fakeAgent, *httptest.Server, Tool) {
	t.Helper()
	agent := &fakeAgent{}
	srv := httptest.NewServer(agent)
	t.Cleanup(srv.Close)
	spec.Name, spec.URL = "buyer", srv.URL+"/agents/team-b/buyer/"
	tool, err := A2ATool(spec)
	if err != nil {
		t.Fatalf("A2ATool: %v", err)
	}
	return agent, srv, tool
}

// call executes tool; an Execute error fails the test (an A2A tool reports failures as results).
func call(t *testing.T, tool Tool, ctx context.Context, args map[string]any, tc *ToolContext) ToolResult {
	t.Helper()
	r, err := tool.Execute(ctx, args, tc)
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	return r
}

const agentToken = "Bearer a2a-s3cret-token"

func TestA2AToolWaitsAsksAndRelaysTheAnswer(t *testing.T) {
	agent, _, tool := newA2AFake(t, A2AToolSpec{Headers: []Header{{Name: "Authorization", Value: agentToken}}})
	ctx := context.Background()
	agent.set(a2a.TaskStateWorking, nil, "")

	started := call(t, tool, ctx, map[string]any{"message": "buy a gpu"}, &ToolContext{CallID: "call_1", IdempotencyKey: "run-uid/call_1"})
	w := WaitOf(started)
	if w == nil {
		t.Fatalf("the call does not wait on the task: %+v", started)
	}
	if diff := cmp.Diff(Wait{Kind: WaitKindA2ATask, Server: "buyer", ID: "t-1", PollIntervalMs: 2000, Status: "working"}, *w); diff != "" {
		t.Errorf("the handle (-want +got):\n%s", diff)
	}
	first := agent.calls()[0]
	var sent a2a.SendMessageRequest
	if err := json.Unmarshal(first.params, &sent); err != nil {
		t.Fatal(err)
	}
	if first.method != a2a.MethodSendMessage || first.header.Get("Authorization") != agentToken || first.header.Get(a2a.VersionHeader) != "1.0" {
		t.Errorf("sent %s with Authorization %q and A2A-Version %q", first.method, first.header.Get("Authorization"), first.header.Get(a2a.VersionHeader))
	}
	if sent.Message.MessageID != "run-uid/call_1" || sent.Message.Text() != "buy a gpu" || sent.Message.Role != a2a.RoleUser ||
		!sent.Configuration.ReturnImmediately {
		t.Errorf("the message: %+v, configuration %+v", sent.Message, sent.Configuration)
	}

	// The task asks for input: a suspension of the call, its id tied to the question.
	agent.set(a2a.TaskStateInputRequired, &a2a.Message{MessageID: "q-1", Role: a2a.RoleAgent, Parts: []a2a.Part{{Text: "Which colour?"}}}, "")
	asked := PendingOf(call(t, tool, ctx, map[string]any{"message": "buy a gpu"}, &ToolContext{CallID: "call_1", Wait: w}))
	if asked == nil || asked.Kind != KindInput || asked.Prompt != "Which colour?" || !strings.HasPrefix(asked.ID, "a2a-") {
		t.Fatalf("input-required is not an input request: %+v", asked)
	}
	if got := asked.Data["a2a"]; !cmp.Equal(got, map[string]any{"task": "t-1"}) {
		t.Errorf("data.a2a = %v", got)
	}

	// The answer goes to the task as the follow-up message; the task works on it.
	answer := AnswerOutput(asked.ID, "red")
	waiting := call(t, tool, ctx, map[string]any{"message": "buy a gpu"},
		&ToolContext{CallID: "call_1", IdempotencyKey: "run-uid/call_1/answer", Wait: w, Answer: &answer})
	if WaitOf(waiting) == nil {
		t.Fatalf("the answered call does not wait: %+v", waiting)
	}
	calls := agent.calls()
	last := calls[len(calls)-1]
	if err := json.Unmarshal(last.params, &sent); err != nil {
		t.Fatal(err)
	}
	part, ok := sent.Message.Answer()
	if last.method != a2a.MethodSendMessage || sent.Message.TaskID != "t-1" || sent.Message.Text() != "red" || !ok || !part.OK ||
		sent.Message.MessageID != "run-uid/call_1/answer/"+asked.ID {
		t.Errorf("the follow-up: %s %+v (answer part %+v)", last.method, sent.Message, part)
	}

	// The same question, seen again before the agent moved on, is not asked twice.
	stillAsking := call(t, tool, ctx, nil, &ToolContext{CallID: "call_1", Wait: w, Answer: &answer})
	if PendingOf(stillAsking) != nil {
		t.Errorf("the answered question is asked again: %+v", stillAsking)
	}

	// Done: the artifact is the output, the header's value never in it.
	agent.set(a2a.TaskStateCompleted, nil, "a red gpu, paid with "+agentToken)
	done := call(t, tool, ctx, nil, &ToolContext{CallID: "call_1", Wait: w})
	if done.IsError || done.Output != "a red gpu, paid with [redacted]" || WaitOf(done) != nil {
		t.Errorf("the result: %+v", done)
	}
}

func TestA2AToolStates(t *testing.T) {
	remote := a2a.RequestPart{Name: "buyer-1-call-1", UID: "uid-9", ID: "toolguard:call_1", Kind: "approval",
		Prompt: "Approve the call to purchase?", Tool: "purchase", Arguments: `{"item":"gpu"}`, Data: map[string]any{"tool": "purchase"}}
	raw, _ := json.Marshal(remote)
	toolnexusAsks := &a2a.Message{MessageID: "request/uid-9", Role: a2a.RoleAgent, Parts: []a2a.Part{{Text: remote.Prompt},
		{Data: raw, Metadata: map[string]any{a2a.RequestMetadataKey: remote.Name}}}}
	tests := []struct {
		name  string
		state a2a.TaskState
		msg   *a2a.Message
		check func(t *testing.T, r ToolResult)
	}{
		{name: "a toolnexus agent's request keeps its kind, and names its origin", state: a2a.TaskStateInputRequired, msg: toolnexusAsks,
			check: func(t *testing.T, r ToolResult) {
				req := PendingOf(r)
				if req == nil || req.Kind != KindApproval || req.Prompt != remote.Prompt || req.Data["tool"] != "purchase" {
					t.Fatalf("request %+v", req)
				}
				want := map[string]any{"task": "t-1", "request": remote.Name, "requestUID": "uid-9", "tool": "purchase", "arguments": `{"item":"gpu"}`}
				if diff := cmp.Diff(want, req.Data["a2a"]); diff != "" {
					t.Errorf("data.a2a (-want +got):\n%s", diff)
				}
			}},
		{name: "auth-required is a login", state: a2a.TaskStateAuthRequired,
			msg: &a2a.Message{MessageID: "a-1", Role: a2a.RoleAgent, Parts: []a2a.Part{{Text: "Sign in at the bank"}}},
			check: func(t *testing.T, r ToolResult) {
				if req := PendingOf(r); req == nil || req.Kind != KindAuthorization || req.Prompt != "Sign in at the bank" {
					t.Errorf("request %+v", req)
				}
			}},
		{name: "failed", state: a2a.TaskStateFailed, msg: &a2a.Message{Parts: []a2a.Part{{Text: "out of stock"}}},
			check: func(t *testing.T, r ToolResult) {
				if !r.IsError || r.Output != "A2A tool buyer: task t-1 failed: out of stock" {
					t.Errorf("result %+v", r)
				}
			}},
		{name: "canceled", state: a2a.TaskStateCanceled, check: func(t *testing.T, r ToolResult) {
			if !r.IsError || !strings.Contains(r.Output, "task t-1 was canceled") {
				t.Errorf("result %+v", r)
			}
		}},
		{name: "a task the agent forgot", check: func(t *testing.T, r ToolResult) {
			if !r.IsError || !strings.Contains(r.Output, "task t-1 is not known to the agent any more") {
				t.Errorf("result %+v", r)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			agent, _, tool := newA2AFake(t, A2AToolSpec{})
			if tt.state != "" {
				agent.set(tt.state, tt.msg, "")
			}
			w := Wait{Kind: WaitKindA2ATask, Server: "buyer", ID: "t-1"}
			tt.check(t, call(t, tool, context.Background(), nil, &ToolContext{CallID: "call_1", Wait: &w}))
		})
	}
}

func TestA2AToolAnswerBindsTheRemoteRequest(t *testing.T) {
	agent, _, tool := newA2AFake(t, A2AToolSpec{})
	raw, _ := json.Marshal(a2a.RequestPart{Name: "buyer-1-call-1", UID: "uid-9", Kind: "approval", Prompt: "Approve?"})
	agent.set(a2a.TaskStateInputRequired, &a2a.Message{MessageID: "m", Role: a2a.RoleAgent,
		Parts: []a2a.Part{{Data: raw, Metadata: map[string]any{a2a.RequestMetadataKey: "buyer-1-call-1"}}}}, "")
	w := Wait{Kind: WaitKindA2ATask, Server: "buyer", ID: "t-1"}
	req := PendingOf(call(t, tool, context.Background(), nil, &ToolContext{CallID: "c", Wait: &w}))
	if req == nil {
		t.Fatal("no request")
	}
	decline := AnswerDeclined(req.ID, "too expensive")
	_ = call(t, tool, context.Background(), nil, &ToolContext{CallID: "c", Wait: &w, Answer: &decline})
	calls := agent.calls()
	var sent a2a.SendMessageRequest
	if err := json.Unmarshal(calls[len(calls)-1].params, &sent); err != nil {
		t.Fatal(err)
	}
	part, ok := sent.Message.Answer()
	want := &a2a.AnswerPart{Request: "buyer-1-call-1", RequestUID: "uid-9", OK: false, Reason: "too expensive"}
	if !ok || !cmp.Equal(want, part) || sent.Message.Text() != "decline" {
		t.Errorf("the follow-up answers %+v with text %q", part, sent.Message.Text())
	}

	// An answer to another question than the one asked now is not sent.
	before := len(agent.calls())
	stale := AnswerOutput("a2a-0000000000000000", "x")
	_ = call(t, tool, context.Background(), nil, &ToolContext{CallID: "c", Wait: &w, Answer: &stale})
	for _, c := range agent.calls()[before:] {
		if c.method == a2a.MethodSendMessage {
			t.Errorf("an answer to another question was sent")
		}
	}
}

func TestA2AToolDirectMessageAndCancel(t *testing.T) {
	agent, srv, tool := newA2AFake(t, A2AToolSpec{})
	// A task that is already done when the message is taken is the result at once.
	agent.set(a2a.TaskStateCompleted, nil, "done at once")
	if r := call(t, tool, context.Background(), map[string]any{"message": "hi", "budget": 3}, &ToolContext{CallID: "c"}); r.Output != "done at once" {
		t.Errorf("result %+v", r)
	}
	var sent a2a.SendMessageRequest
	if err := json.Unmarshal(agent.calls()[0].params, &sent); err != nil {
		t.Fatal(err)
	}
	if len(sent.Message.Parts) != 2 || sent.Message.Parts[0].Text != "hi" || string(sent.Message.Parts[1].Data) != `{"budget":3,"message":"hi"}` {
		t.Errorf("the message's parts: %+v", sent.Message.Parts)
	}

	agent.set(a2a.TaskStateWorking, nil, "")
	if err := CancelA2ATask(context.Background(), A2AToolSpec{Name: "buyer", URL: srv.URL + "/"}, Wait{Kind: WaitKindA2ATask, Server: "buyer", ID: "t-1"}); err != nil {
		t.Fatalf("CancelA2ATask: %v", err)
	}
	calls := agent.calls()
	if got := calls[len(calls)-1]; got.method != a2a.MethodCancelTask || string(got.params) != `{"id":"t-1"}` {
		t.Errorf("cancel sent %s %s", got.method, got.params)
	}
}

func TestA2AToolNetworkGuard(t *testing.T) {
	guard := netguard.Config{Deny: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}.Client()
	agent, _, tool := newA2AFake(t, A2AToolSpec{Client: guard})
	agent.set(a2a.TaskStateWorking, nil, "")
	r := call(t, tool, context.Background(), map[string]any{"message": "hi"}, &ToolContext{CallID: "c"})
	if !r.IsError || !strings.Contains(r.Output, "is denied (deny list)") || len(agent.calls()) != 0 {
		t.Errorf("a denied address was reached: %+v", r)
	}
}

package tools_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

var nameSchema = map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string"}}, "required": []any{"name"}}

func taskServer(t *testing.T) (*toolstest.TaskServer, *tools.Toolkit, *tools.MCPServer) {
	t.Helper()
	ts := toolstest.ServeTasks(t, map[string]toolstest.TaskSpec{
		"build": {Polls: 2},
		"greet": {Polls: 1, Ask: map[string]*mcp.ElicitParams{"name": {Mode: "form", Message: "Your name?", RequestedSchema: nameSchema}}},
		"pair": {Ask: map[string]*mcp.ElicitParams{
			"a": {Mode: "form", Message: "First?", RequestedSchema: nameSchema},
			"b": {Mode: "url", Message: "Sign in", URL: "https://idp.example.com/consent"},
		}},
		"crash": {Fail: "out of disk"},
	})
	spec := tools.MCPServerSpec{Name: "ci", URL: ts.URL, Timeout: 5 * time.Second}
	srv, err := tools.ConnectMCP(context.Background(), spec)
	if err != nil {
		t.Fatalf("ConnectMCP: %v", err)
	}
	tk, err := tools.NewToolkit(srv.Tools()...)
	if err != nil {
		t.Fatal(err)
	}
	return ts, tk, srv
}

// run executes tool as the loop would: with the handle and the answer it holds.
func run(tk *tools.Toolkit, tool string, w *tools.Wait, a *tools.Answer) tools.ToolResult {
	return tk.Execute(context.Background(), "ci_"+tool, map[string]any{"ref": "main"}, &tools.ToolContext{CallID: "call_1", Wait: w, Answer: a})
}

func mustWait(t *testing.T, r tools.ToolResult) *tools.Wait {
	t.Helper()
	w := tools.WaitOf(r)
	if w == nil {
		t.Fatalf("result %+v, want a wait on a task", r)
	}
	return w
}

// TestMCPTaskCallWaitsAndCompletes: the server makes the call a task; the call returns its handle
// at once, each look is one tasks/get, and the task's result is the tool's. tools/call is sent
// once, with the span's traceparent in _meta.
func TestMCPTaskCallWaitsAndCompletes(t *testing.T) {
	ts, tk, srv := taskServer(t)
	if got := srv.Revision(); got != tools.RevisionStateless {
		t.Errorf("Revision = %q, want %q", got, tools.RevisionStateless)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	w := mustWait(t, tk.Execute(ctx, "ci_build", map[string]any{"ref": "main"}, &tools.ToolContext{CallID: "call_1"}))
	if w.Kind != tools.WaitKindMCPTask || w.Server != "ci" || w.ID == "" || w.Status != "working" {
		t.Fatalf("handle %+v, want a working MCP task on ci", w)
	}
	for range 2 {
		w = mustWait(t, run(tk, "build", w, nil))
	}
	res := run(tk, "build", w, nil)
	if res.IsError || res.Output != `build done with {"ref":"main"}` {
		t.Errorf("result %+v, want the task's result", res)
	}
	if ts.Calls("build") != 1 || ts.Polls() != 3 {
		t.Errorf("tools/call %d, tasks/get %d; want 1 and 3", ts.Calls("build"), ts.Polls())
	}
	if tp := ts.Traceparents(); len(tp) != 1 || !strings.HasPrefix(tp[0], "00-01000000000000000000000000000000-0200000000000000-01") {
		t.Errorf("traceparents %q, want the span's in _meta", tp)
	}
	// A plain tool of the same server is an ordinary call.
	if res := tk.Execute(context.Background(), "ci_echo", map[string]any{"x": 1}, nil); res.Output != `echo {"x":1}` {
		t.Errorf("echo = %+v", res)
	}
}

// TestMCPTaskAsksForInput: a task in input_required becomes one request per input request, in
// turn; each answer goes back with tasks/update, and the task's result carries both answers.
func TestMCPTaskAsksForInput(t *testing.T) {
	ts, tk, _ := taskServer(t)
	w := mustWait(t, run(tk, "pair", nil, nil))
	first := tools.PendingOf(run(tk, "pair", w, nil))
	if first == nil || first.Kind != tools.KindInput || first.Prompt != "First?" || first.Data["schema"] == nil {
		t.Fatalf("first request %+v, want the form as an input request", first)
	}
	second := tools.PendingOf(run(tk, "pair", w, &tools.Answer{ID: first.ID, OK: true, Data: map[string]any{"name": "Ada"}}))
	if second == nil || second.Kind != tools.KindAuthorization || second.URL != "https://idp.example.com/consent" || second.ID == first.ID {
		t.Fatalf("second request %+v, want the URL as an authorization request of its own id", second)
	}
	res := run(tk, "pair", w, &tools.Answer{ID: second.ID, OK: true})
	if res.IsError || res.Output != `pair done with {"ref":"main"}; a={"action":"accept","content":{"name":"Ada"}}; b={"action":"accept"}` {
		t.Errorf("result %+v, want both answers handed over", res)
	}
	if ts.Calls("pair") != 1 || ts.Updates() != 2 {
		t.Errorf("tools/call %d, tasks/update %d; want 1 and 2", ts.Calls("pair"), ts.Updates())
	}
}

// TestMCPTaskEnds: a failed task, a task the server forgot and a cancelled task are error results
// naming the task; CancelMCPTask sends tasks/cancel with the routing header.
func TestMCPTaskEnds(t *testing.T) {
	ts, tk, _ := taskServer(t)
	w := mustWait(t, run(tk, "crash", nil, nil))
	if res := run(tk, "crash", w, nil); !res.IsError || !strings.Contains(res.Output, "task "+w.ID+" failed: out of disk") {
		t.Errorf("failed task = %+v", res)
	}

	w = mustWait(t, run(tk, "build", nil, nil))
	spec := tools.MCPServerSpec{Name: "ci", URL: ts.URL, Timeout: 5 * time.Second}
	if err := tools.CancelMCPTask(context.Background(), spec, *w); err != nil {
		t.Fatalf("CancelMCPTask: %v", err)
	}
	if got := ts.Cancelled(); len(got) != 1 || got[0] != w.ID || ts.Status(w.ID) != "cancelled" {
		t.Errorf("cancelled %v (status %q), want %s", got, ts.Status(w.ID), w.ID)
	}
	if res := run(tk, "build", w, nil); !res.IsError || !strings.Contains(res.Output, "was cancelled by the server") {
		t.Errorf("cancelled task = %+v", res)
	}

	ts.Forget()
	res := run(tk, "build", w, nil)
	if !res.IsError || !strings.Contains(res.Output, "task "+w.ID+" is not known to the server any more") {
		t.Errorf("forgotten task = %+v, want an error naming it", res)
	}
	if err := tools.CancelMCPTask(context.Background(), spec, *w); err == nil || !strings.Contains(err.Error(), "Task not found") {
		t.Errorf("cancelling a forgotten task: %v, want the server's refusal", err)
	}
}

// TestMCPTaskServerRound: a plain tool of a server that declares the tasks extension may answer
// input_required too (the calls go through taskRPC there): a round, whose retry carries the
// answer and the requestState.
func TestMCPTaskServerRound(t *testing.T) {
	ts, tk, _ := taskServer(t)
	res := run(tk, "confirm", nil, nil)
	round := tools.RoundOf(res)
	if round == nil || round.Resume != "confirm-1" || len(round.Asks) != 1 || round.Asks[0].Key != "ok" || round.Asks[0].Request.Prompt != "Go ahead?" {
		t.Fatalf("result %+v, want a round asking ok with requestState confirm-1", res)
	}
	round.Asks[0].Answer = &tools.Answer{ID: round.Asks[0].Request.ID, OK: true, Data: map[string]any{}}
	got := tk.Execute(context.Background(), "ci_confirm", nil, &tools.ToolContext{CallID: "call_1", Round: round})
	if got.IsError || got.Output != "confirmed: accept (requestState confirm-1)" {
		t.Errorf("retry = %+v, want the answer and the requestState handed back", got)
	}
	if n := ts.Calls("confirm"); n != 2 {
		t.Errorf("tools/call reached confirm %d times, want 2", n)
	}
}

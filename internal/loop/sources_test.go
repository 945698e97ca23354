package loop

// A loop-level test per tool source of internal/tools: the model calls the tool, the durable
// path suspends, the state moves to a new process (JSON, a new Client), the answer is recorded
// and the run resumes to the end with the tool's answered result in front of the model.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
)

// ignoreGeneratedID ignores a Request id the tool source generates (pnd-…, elc-…).
var ignoreGeneratedID = cmpopts.IgnoreFields(tools.Request{}, "ID")

// sourceRun is one suspend → persist → answer → resume cycle of a run over a single tool call.
type sourceRun struct {
	Pending RunResult // what the first process's run returned
	Done    RunResult // what the second process's resume returned
}

// suspendAndResume runs prompt against srv until it waits (no WaitFor, so the run returns
// StatusPending; Run is Resume on NewState, which keeps the state in hand), round-trips the state
// through JSON into a new Client built with the same options, answers callID with
// answer(pending request) and resumes to the end. tk builds the toolkit of each process.
func suspendAndResume(t *testing.T, srv *looptest.Server, tk func() *tools.Toolkit, callID string,
	answer func(tools.Request) tools.Answer, mut ...func(*Options)) sourceRun {
	t.Helper()
	ctx := context.Background()

	st := NewState("go")
	pending, err := newClient(t, srv.URL, mut...).Resume(ctx, st, tk())
	if err != nil {
		t.Fatalf("first run: %v", err)
	}
	if pending.Status != StatusPending || pending.Pending == nil {
		t.Fatalf("first run ended %q with pending %+v, want a pending Request", pending.Status, pending.Pending)
	}
	if pending.Text != pending.Pending.Prompt {
		t.Errorf("pending text %q, want the prompt %q", pending.Text, pending.Pending.Prompt)
	}

	// A new process: fresh state from JSON, new client, new toolkit.
	st = roundTrip(t, st)
	second := newClient(t, srv.URL, mut...)
	open := st.Suspended()
	if len(open) != 1 || open[0].ID != callID {
		t.Fatalf("suspended calls after the round trip: %+v, want %s", open, callID)
	}
	if diff := cmp.Diff(pending.Pending, open[0].Request); diff != "" {
		t.Errorf("persisted request differs from the pending one (-run +state):\n%s", diff)
	}
	if err := st.Answer(callID, answer(*open[0].Request)); err != nil {
		t.Fatalf("Answer: %v", err)
	}
	done, err := second.Resume(ctx, st, tk())
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	if done.Status != StatusDone || done.Pending != nil {
		t.Fatalf("resume ended %q (pending %+v), want done", done.Status, done.Pending)
	}
	if n := len(srv.Requests()); n != 2 {
		t.Errorf("model requests: %d, want 2", n)
	}
	return sourceRun{Pending: pending, Done: done}
}

// lastToolResults are the tool results the model's last request carried.
func lastToolResults(t *testing.T, srv *looptest.Server) []toolResult {
	t.Helper()
	reqs := srv.Requests()
	if len(reqs) == 0 {
		t.Fatal("the model was never called")
	}
	return sentToolResults(t, reqs[len(reqs)-1])
}

// httpCall is one request an HTTP tool server received.
type httpCall struct {
	IdempotencyKey string
	Answer         *tools.Answer
	Body           map[string]any
}

// httpToolServer serves an HTTP tool: first answers every call without Toolnexus-Answer, answered
// every call with one. It records the calls.
type httpToolServer struct {
	URL   string
	mu    sync.Mutex
	calls []httpCall
}

func startHTTPTool(t *testing.T, first string, answered func(a tools.Answer, body map[string]any) string) *httpToolServer {
	t.Helper()
	s := &httpToolServer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		call := httpCall{IdempotencyKey: r.Header.Get(tools.IdempotencyKeyHeader)}
		if err := json.Unmarshal(raw, &call.Body); err != nil {
			t.Errorf("tool request body is not a JSON object: %v\n%s", err, raw)
		}
		reply := first
		if h := r.Header.Get(tools.AnswerHeader); h != "" {
			dec, err := base64.RawURLEncoding.DecodeString(h)
			if err != nil {
				t.Errorf("%s is not base64url without padding: %v", tools.AnswerHeader, err)
			}
			call.Answer = new(tools.Answer)
			if err := json.Unmarshal(dec, call.Answer); err != nil {
				t.Errorf("%s is not an Answer: %v\n%s", tools.AnswerHeader, err, dec)
			}
			reply = answered(*call.Answer, call.Body)
		}
		s.mu.Lock()
		s.calls = append(s.calls, call)
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, reply)
	}))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

func (s *httpToolServer) Calls() []httpCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]httpCall(nil), s.calls...)
}

func httpToolkit(t *testing.T, spec tools.HTTPToolSpec) func() *tools.Toolkit {
	return func() *tools.Toolkit {
		tool, err := tools.HTTPTool(spec)
		if err != nil {
			t.Fatalf("HTTPTool: %v", err)
		}
		return toolkit(t, tool)
	}
}

// TestSourceHTTPApproval: an HTTP tool answers with a toolnexus ToolResult that is pending an
// approval; the retry carries the Answer in Toolnexus-Answer and an idempotency key of its own.
func TestSourceHTTPApproval(t *testing.T) {
	const pendingBody = `{"output":"Approve purchase of gpu?","isError":true,` +
		`"metadata":{"pending":{"id":"req-gpu","kind":"approval","prompt":"Approve purchase of gpu?"}}}`
	tool := startHTTPTool(t, pendingBody, func(a tools.Answer, body map[string]any) string {
		if !a.OK {
			return "not approved"
		}
		return fmt.Sprintf("approved %v", body["item"])
	})
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve_purchase", Arguments: `{"item":"gpu"}`}),
		looptest.OpenAIText("bought"))

	run := suspendAndResume(t, srv,
		httpToolkit(t, tools.HTTPToolSpec{Name: "approve_purchase", Description: "buys an item after approval", URL: tool.URL}),
		"call_1", func(tools.Request) tools.Answer { return tools.Answer{OK: true} },
		func(o *Options) { o.IdempotencyPrefix = "run-uid" })

	wantReq := &tools.Request{ID: "req-gpu", Kind: tools.KindApproval, Prompt: "Approve purchase of gpu?"}
	if diff := cmp.Diff(wantReq, run.Pending.Pending); diff != "" {
		t.Errorf("pending request (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]toolResult{{ID: "call_1", Content: "approved gpu"}}, lastToolResults(t, srv)); diff != "" {
		t.Errorf("tool results sent to the model (-want +got):\n%s", diff)
	}
	if run.Done.Text != "bought" {
		t.Errorf("text %q, want bought", run.Done.Text)
	}
	// The answer travels with the id the loop filled in from the request.
	want := []httpCall{
		{IdempotencyKey: "run-uid/call_1", Body: map[string]any{"item": "gpu"}},
		{IdempotencyKey: "run-uid/call_1/answer", Body: map[string]any{"item": "gpu"}, Answer: &tools.Answer{ID: "req-gpu", OK: true}},
	}
	if diff := cmp.Diff(want, tool.Calls()); diff != "" {
		t.Errorf("calls the tool server received (-want +got):\n%s", diff)
	}
	if calls := tool.Calls(); len(calls) == 2 && !strings.HasSuffix(calls[1].IdempotencyKey, "/answer") {
		t.Errorf("retry idempotency key %q does not end with /answer", calls[1].IdempotencyKey)
	}
}

// TestSourceHTTPAuthRequired: the LangSmith Fleet auth-required object suspends as an
// authorization with its URL and auth_id; the login completed, the retry returns the data.
func TestSourceHTTPAuthRequired(t *testing.T) {
	const authBody = `{"auth_required":true,"auth_url":"https://auth.example.com/oauth?state=s1","auth_id":"auth-123"}`
	tool := startHTTPTool(t, authBody, func(a tools.Answer, _ map[string]any) string {
		if !a.OK {
			return authBody
		}
		return "09:00 standup, 14:00 1:1"
	})
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "read_calendar", Arguments: `{"day":"today"}`}),
		looptest.OpenAIText("You have a standup and a 1:1."))

	run := suspendAndResume(t, srv,
		httpToolkit(t, tools.HTTPToolSpec{Name: "read_calendar", Description: "reads the calendar", URL: tool.URL}),
		"call_1", func(tools.Request) tools.Answer { return tools.Answer{OK: true} })

	wantReq := &tools.Request{Kind: tools.KindAuthorization, Prompt: tools.DefaultAuthPrompt,
		URL: "https://auth.example.com/oauth?state=s1", Data: map[string]any{"auth_id": "auth-123"}}
	if diff := cmp.Diff(wantReq, run.Pending.Pending, ignoreGeneratedID); diff != "" {
		t.Errorf("pending request (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]toolResult{{ID: "call_1", Content: "09:00 standup, 14:00 1:1"}}, lastToolResults(t, srv)); diff != "" {
		t.Errorf("tool results sent to the model (-want +got):\n%s", diff)
	}
	calls := tool.Calls()
	if len(calls) != 2 {
		t.Fatalf("tool server calls: %d, want 2", len(calls))
	}
	if calls[0].Answer != nil {
		t.Errorf("first call carried an answer: %+v", calls[0].Answer)
	}
	if want := (&tools.Answer{ID: run.Pending.Pending.ID, OK: true}); !cmp.Equal(want, calls[1].Answer) {
		t.Errorf("retry answer %+v, want %+v", calls[1].Answer, want)
	}
	// No IdempotencyPrefix: the keys are the call id and the call id with /answer.
	if calls[0].IdempotencyKey != "call_1" || calls[1].IdempotencyKey != "call_1/answer" {
		t.Errorf("idempotency keys %q, %q; want call_1, call_1/answer", calls[0].IdempotencyKey, calls[1].IdempotencyKey)
	}
}

// actionLog is the elicitation action each run of an MCP tool handler received.
type actionLog struct {
	mu      sync.Mutex
	actions []string
}

func (l *actionLog) add(a string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.actions = append(l.actions, a)
}

func (l *actionLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.actions...)
}

var envSchema = map[string]any{
	"type":       "object",
	"properties": map[string]any{"env": map[string]any{"type": "string", "enum": []any{"staging", "prod"}}},
	"required":   []any{"env"},
}

// startDeployMCP serves an MCP server (Go SDK, streamable HTTP) with one tool, deploy, that asks
// for the environment through an input request and deploys to the one it is given. It records,
// per handler run, the action of the env response it got ("" for none).
func startDeployMCP(t *testing.T, versions []string, runs *actionLog) string {
	t.Helper()
	server := mcp.NewServer(&mcp.Implementation{Name: "ops", Version: "v0"}, &mcp.ServerOptions{SupportedProtocolVersions: versions})
	server.AddTool(&mcp.Tool{Name: "deploy", Description: "deploys the service", InputSchema: map[string]any{"type": "object"}},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			r, ok := req.Params.InputResponses["env"].(*mcp.ElicitResult)
			if ok {
				runs.add(r.Action)
			} else {
				runs.add("")
			}
			if ok {
				out := r.Action
				if r.Action == "accept" {
					out = fmt.Sprintf("deployed to %v", r.Content["env"])
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: out}}}, nil
			}
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{
				"env": &mcp.ElicitParams{Message: "Which environment?", RequestedSchema: envSchema}}}, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestSourceMCPElicitation: an MCP tool's form elicitation suspends as an input request with the
// requested schema; the form answer is replayed to the server on the retry.
func TestSourceMCPElicitation(t *testing.T) {
	modes := []struct {
		name     string
		versions []string
	}{
		{name: "stateless 2026-07-28"},
		{name: "legacy 2025-11-25", versions: []string{"2025-11-25"}},
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			var runs actionLog
			url := startDeployMCP(t, mode.versions, &runs)
			srv := looptest.New(t,
				looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "ops_deploy", Arguments: `{}`}),
				looptest.OpenAIText("deployed"))
			tk := func() *tools.Toolkit {
				// Each process connects anew, as a manager does after a restart.
				s, err := tools.ConnectMCP(context.Background(), tools.MCPServerSpec{Name: "ops", URL: url})
				if err != nil {
					t.Fatalf("ConnectMCP: %v", err)
				}
				return toolkit(t, s.Tools()...)
			}

			run := suspendAndResume(t, srv, tk, "call_1", func(tools.Request) tools.Answer {
				return tools.Answer{OK: true, Data: map[string]any{"env": "staging"}}
			})

			wantReq := &tools.Request{Kind: tools.KindInput, Prompt: "Which environment?", Data: map[string]any{"schema": envSchema}}
			if diff := cmp.Diff(wantReq, run.Pending.Pending, ignoreGeneratedID); diff != "" {
				t.Errorf("pending request (-want +got):\n%s", diff)
			}
			if id := run.Pending.Pending.ID; !strings.HasPrefix(id, "elc-") {
				t.Errorf("request id %q, want an elicitation id (elc-…)", id)
			}
			if diff := cmp.Diff([]toolResult{{ID: "call_1", Content: "deployed to staging"}}, lastToolResults(t, srv)); diff != "" {
				t.Errorf("tool results sent to the model (-want +got):\n%s", diff)
			}
			// The first execution elicits and the bridge dismisses it ("cancel") so the call ends; the
			// answered retry runs the tool from the start and the bridge replays the answer.
			if diff := cmp.Diff([]string{"", "cancel", "", "accept"}, runs.get()); diff != "" {
				t.Errorf("env responses per handler run (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSourceQuestionBuiltin: the question built-in parks the call on the user and the answer's
// data becomes its output.
func TestSourceQuestionBuiltin(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: tools.QuestionToolName,
			Arguments: `{"questions":[{"question":"Pick a color?","options":["red","green"]}]}`}),
		looptest.OpenAIText("red it is"))

	run := suspendAndResume(t, srv, func() *tools.Toolkit { return toolkit(t, tools.QuestionTool()) }, "call_1",
		func(tools.Request) tools.Answer {
			return tools.Answer{OK: true, Data: map[string]any{"answers": []any{"red"}}}
		})

	wantReq := &tools.Request{ID: "question:call_1", Kind: tools.KindQuestion, Prompt: "Pick a color? (options: red, green)",
		Data: map[string]any{"questions": []any{map[string]any{"question": "Pick a color?", "options": []any{"red", "green"}}}}}
	if diff := cmp.Diff(wantReq, run.Pending.Pending); diff != "" {
		t.Errorf("pending request (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]toolResult{{ID: "call_1", Content: `{"answers":["red"]}`}}, lastToolResults(t, srv)); diff != "" {
		t.Errorf("tool results sent to the model (-want +got):\n%s", diff)
	}
	if run.Done.Text != "red it is" {
		t.Errorf("text %q", run.Done.Text)
	}
}

// gatedDelete is the delete_user tool behind the approval gate (spec.approvals), wired as a BeforeTool
// hook the way a controller wires it.
type gatedDelete struct {
	runs    atomic.Int32
	answers chan *tools.Answer // the Answer each execution saw
}

func newGatedDelete(t *testing.T) (*gatedDelete, func(*Options)) {
	t.Helper()
	gates, err := tools.NewGates([]tools.GateSpec{{Tools: []string{"delete_*"}, When: "args.count > 1"}})
	if err != nil {
		t.Fatalf("NewGates: %v", err)
	}
	g := &gatedDelete{answers: make(chan *tools.Answer, 4)}
	hook := func(_ context.Context, ev BeforeToolEvent) (*ToolOverride, error) {
		if len(ev.Passed) > 0 {
			return nil, nil // the one gate approved
		}
		raw, err := json.Marshal(ev.Args)
		if err != nil {
			return nil, err
		}
		req, err := gates.Check(ev.Name, ev.Args, ev.ID, string(raw))
		if err != nil {
			t.Errorf("gate check: %v", err) // the request still gates the call
		}
		if req == nil {
			return nil, nil
		}
		res := tools.Pending(*req)
		return &ToolOverride{Result: &res}, nil
	}
	return g, func(o *Options) { o.Hooks.BeforeTool = hook }
}

func (g *gatedDelete) toolkit(t *testing.T) func() *tools.Toolkit {
	return func() *tools.Toolkit {
		return toolkit(t, tools.NativeTool("delete_user", "deletes users", nil,
			func(_ context.Context, args map[string]any, tc *tools.ToolContext) (any, error) {
				g.runs.Add(1)
				g.answers <- tc.Answer
				return fmt.Sprintf("deleted %v users", args["count"]), nil
			}))
	}
}

var wantGateRequest = &tools.Request{ID: tools.ApprovalIDPrefix + "call_1", Kind: tools.KindApproval,
	Prompt: "Approve the call to delete_user?",
	Data:   map[string]any{"tool": "delete_user", "arguments": map[string]any{"count": float64(3)}}}

// TestSourceGateApproved: the gate parks the call before the tool runs; approved, the tool runs
// exactly once, with the approval as its Answer.
func TestSourceGateApproved(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "delete_user", Arguments: `{"count":3}`}),
		looptest.OpenAIText("deleted"))
	del, gated := newGatedDelete(t)

	// suspendAndResume answers only after the first run returned, so no run before that shows up.
	run := suspendAndResume(t, srv, del.toolkit(t), "call_1", func(r tools.Request) tools.Answer {
		if n := del.runs.Load(); n != 0 {
			t.Errorf("the gated tool ran %d times before the approval", n)
		}
		return tools.Answer{OK: true}
	}, gated)

	if diff := cmp.Diff(wantGateRequest, run.Pending.Pending); diff != "" {
		t.Errorf("pending request (-want +got):\n%s", diff)
	}
	if n := del.runs.Load(); n != 1 {
		t.Fatalf("the tool ran %d times, want exactly 1", n)
	}
	if diff := cmp.Diff(&tools.Answer{ID: tools.ApprovalIDPrefix + "call_1", OK: true}, <-del.answers); diff != "" {
		t.Errorf("the tool's tc.Answer (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]toolResult{{ID: "call_1", Content: "deleted 3 users"}}, lastToolResults(t, srv)); diff != "" {
		t.Errorf("tool results sent to the model (-want +got):\n%s", diff)
	}
}

// TestSourceGateDeclined: declined, the gated tool never runs and the model is told why.
func TestSourceGateDeclined(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "delete_user", Arguments: `{"count":3}`}),
		looptest.OpenAIText("not deleted"))
	del, gated := newGatedDelete(t)

	run := suspendAndResume(t, srv, del.toolkit(t), "call_1", func(tools.Request) tools.Answer {
		return tools.AnswerDeclined("", tools.ReasonDeclined)
	}, gated)

	if diff := cmp.Diff(wantGateRequest, run.Pending.Pending); diff != "" {
		t.Errorf("pending request (-want +got):\n%s", diff)
	}
	if n := del.runs.Load(); n != 0 {
		t.Errorf("the declined tool ran %d times", n)
	}
	want := "declined/expired: Approve the call to delete_user?\nreason: declined"
	if diff := cmp.Diff([]toolResult{{ID: "call_1", Content: want}}, lastToolResults(t, srv)); diff != "" {
		t.Errorf("tool results sent to the model (-want +got):\n%s", diff)
	}
	if calls := run.Done.ToolCalls; len(calls) != 1 || !calls[0].IsError || calls[0].Output != want {
		t.Errorf("history: %+v, want one error call with %q", calls, want)
	}
}

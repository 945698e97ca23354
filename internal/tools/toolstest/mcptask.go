package toolstest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TaskServer is an MCP server of the stateless revision (2026-07-28) whose task tools run as tasks
// of the io.modelcontextprotocol/tasks extension. The server is the Go SDK's; the SDK does not
// speak the extension, so a handler in front of it answers a tools/call of a task tool from a
// client that declares the extension with a task (resultType "task"), and serves tasks/get,
// tasks/update and tasks/cancel as the extension says, Mcp-Name header included. Everything else
// (server/discover, tools/list, other tools) is the SDK's.
type TaskServer struct {
	URL string

	mu    sync.Mutex
	specs map[string]TaskSpec
	tasks map[string]*fakeTask
	// PollIntervalMs is what every task says about polling; set it before the calls.
	pollIntervalMs int64
	calls          map[string]int
	polls, updates int
	cancelled      []string
	traceparents   []string
	// refusing makes every request fail with 503, as a server that is down.
	refusing bool
}

// TaskSpec is the course of a task tool's tasks.
type TaskSpec struct {
	// Polls is how many tasks/get find the task working before it goes on.
	Polls int
	// Ask are the input requests the task then makes, all at once; each is answered by a
	// tasks/update, and the task completes once all are.
	Ask map[string]*mcp.ElicitParams
	// Fail ends the task failed with this message instead of completed.
	Fail string
}

type fakeTask struct {
	id, tool  string
	args      json.RawMessage
	spec      TaskSpec
	polls     int
	status    string
	responses map[string]json.RawMessage
}

// ServeTasks starts a task server with the task tools specs and two plain tools: "echo", and
// "confirm", which asks for a confirmation (input_required, requestState "confirm-1") and answers
// "confirmed: <action> (requestState <what came back>)". It closes when the test ends.
func ServeTasks(t interface {
	Cleanup(func())
}, specs map[string]TaskSpec) *TaskServer {
	ts := &TaskServer{specs: specs, tasks: map[string]*fakeTask{}, calls: map[string]int{}}
	caps := &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}}
	caps.AddExtension("io.modelcontextprotocol/tasks", nil)
	server := mcp.NewServer(&mcp.Implementation{Name: "tasks", Version: "v0"}, &mcp.ServerOptions{Capabilities: caps})
	object := map[string]any{"type": "object"}
	for name := range specs {
		server.AddTool(&mcp.Tool{Name: name, Description: "runs as a task", InputSchema: object},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				ts.count(name)
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ran without a task"}}}, nil
			})
	}
	server.AddTool(&mcp.Tool{Name: "confirm", InputSchema: object}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ts.count("confirm")
		if r, ok := req.Params.InputResponses["ok"].(*mcp.ElicitResult); ok {
			text := fmt.Sprintf("confirmed: %s (requestState %s)", r.Action, req.Params.RequestState)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil
		}
		return &mcp.CallToolResult{RequestState: "confirm-1", InputRequests: mcp.InputRequestMap{"ok": &mcp.ElicitParams{
			Mode: "form", Message: "Go ahead?", RequestedSchema: map[string]any{"type": "object"}}}}, nil
	})
	server.AddTool(&mcp.Tool{Name: "echo", InputSchema: object}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ts.count("echo")
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo " + string(req.Params.Arguments)}}}, nil
	})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ts.mu.Lock()
		refusing := ts.refusing
		ts.mu.Unlock()
		if refusing {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		if r.Method != http.MethodPost {
			sdk.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if !ts.serve(w, r, body) {
			r.Body = io.NopCloser(bytes.NewReader(body))
			sdk.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	ts.URL = srv.URL
	return ts
}

type rpcRequest struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		Meta           map[string]json.RawMessage `json:"_meta"`
		Name           string                     `json:"name"`
		Arguments      json.RawMessage            `json:"arguments"`
		TaskID         string                     `json:"taskId"`
		InputResponses map[string]json.RawMessage `json:"inputResponses"`
	} `json:"params"`
}

// serve answers what the SDK does not speak, and reports whether it did.
func (ts *TaskServer) serve(w http.ResponseWriter, r *http.Request, body []byte) bool {
	var req rpcRequest
	if json.Unmarshal(body, &req) != nil {
		return false
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	reply := func(result any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": result})
	}
	fail := func(status, code int, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{"code": code, "message": msg}})
	}
	if strings.HasPrefix(req.Method, "tasks/") {
		if got := r.Header.Get("Mcp-Name"); got != req.Params.TaskID {
			fail(http.StatusBadRequest, -32020, fmt.Sprintf("Mcp-Name %q does not match taskId %q", got, req.Params.TaskID))
			return true
		}
		t := ts.tasks[req.Params.TaskID]
		if t == nil {
			fail(http.StatusOK, -32602, "Failed to retrieve task: Task not found")
			return true
		}
		switch req.Method {
		case "tasks/get":
			ts.polls++
			ts.advance(t)
			reply(ts.view(t))
		case "tasks/update":
			ts.updates++
			for k, v := range req.Params.InputResponses {
				if _, asked := t.spec.Ask[k]; asked && t.status == "input_required" && t.responses[k] == nil {
					t.responses[k] = v
				}
			}
			reply(map[string]any{"resultType": "complete"})
		case "tasks/cancel":
			ts.cancelled = append(ts.cancelled, t.id)
			if t.status == "working" || t.status == "input_required" {
				t.status = "cancelled"
			}
			reply(map[string]any{"resultType": "complete"})
		default:
			fail(http.StatusOK, -32601, "unknown method "+req.Method)
		}
		return true
	}
	spec, isTask := ts.specs[req.Params.Name]
	if req.Method != "tools/call" || !isTask {
		return false
	}
	var caps struct {
		Extensions map[string]any `json:"extensions"`
	}
	_ = json.Unmarshal(req.Params.Meta["io.modelcontextprotocol/clientCapabilities"], &caps)
	if _, declared := caps.Extensions["io.modelcontextprotocol/tasks"]; !declared {
		return false // the SDK runs it without a task
	}
	ts.calls[req.Params.Name]++
	var tp string
	_ = json.Unmarshal(req.Params.Meta["traceparent"], &tp)
	ts.traceparents = append(ts.traceparents, tp)
	t := &fakeTask{id: fmt.Sprintf("task-%d", len(ts.tasks)+1), tool: req.Params.Name, args: req.Params.Arguments,
		spec: spec, status: "working", responses: map[string]json.RawMessage{}}
	ts.tasks[t.id] = t
	view := ts.view(t)
	view["resultType"] = "task"
	reply(view)
	return true
}

// advance moves a task on by one look.
func (ts *TaskServer) advance(t *fakeTask) {
	switch t.status {
	case "working":
		t.polls++
		if t.polls <= t.spec.Polls {
			return
		}
		if len(t.spec.Ask) > 0 {
			t.status = "input_required"
			return
		}
		t.status = ts.end(t)
	case "input_required":
		if len(t.responses) == len(t.spec.Ask) {
			t.status = ts.end(t)
		}
	}
}

func (ts *TaskServer) end(t *fakeTask) string {
	if t.spec.Fail != "" {
		return "failed"
	}
	return "completed"
}

// view is the task as tasks/get shows it.
func (ts *TaskServer) view(t *fakeTask) map[string]any {
	v := map[string]any{"resultType": "complete", "taskId": t.id, "status": t.status, "createdAt": "2026-12-01T00:00:00Z",
		"lastUpdatedAt": "2026-12-01T00:00:00Z", "ttlMs": nil, "pollIntervalMs": ts.pollIntervalMs}
	switch t.status {
	case "input_required":
		open := map[string]any{}
		for k, p := range t.spec.Ask {
			if t.responses[k] == nil {
				open[k] = map[string]any{"method": "elicitation/create", "params": p}
			}
		}
		v["inputRequests"] = open
	case "completed":
		keys := make([]string, 0, len(t.responses))
		for k := range t.responses {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var answers []string
		for _, k := range keys {
			answers = append(answers, k+"="+string(t.responses[k]))
		}
		text := fmt.Sprintf("%s done with %s", t.tool, t.args)
		if len(answers) > 0 {
			text += "; " + strings.Join(answers, "; ")
		}
		v["result"] = map[string]any{"content": []any{map[string]any{"type": "text", "text": text}}, "isError": false}
	case "failed":
		v["error"] = map[string]any{"code": -32603, "message": t.spec.Fail}
	}
	return v
}

func (ts *TaskServer) count(tool string) {
	ts.mu.Lock()
	ts.calls[tool]++
	ts.mu.Unlock()
}

// SetPollInterval sets the pollIntervalMs every task reports from now on.
func (ts *TaskServer) SetPollInterval(ms int64) {
	ts.mu.Lock()
	ts.pollIntervalMs = ms
	ts.mu.Unlock()
}

// Refuse makes the server answer every request from now on with 503 (refuse true), or serve
// again (false).
func (ts *TaskServer) Refuse(refuse bool) {
	ts.mu.Lock()
	ts.refusing = refuse
	ts.mu.Unlock()
}

// Forget drops every task, as a server that purged them.
func (ts *TaskServer) Forget() {
	ts.mu.Lock()
	ts.tasks = map[string]*fakeTask{}
	ts.mu.Unlock()
}

// Calls is how many tools/call reached the tool (as a task or not).
func (ts *TaskServer) Calls(tool string) int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.calls[tool]
}

// Polls is how many tasks/get the server answered for a known task, Updates how many tasks/update.
func (ts *TaskServer) Polls() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.polls
}

// Updates is how many tasks/update the server answered for a known task.
func (ts *TaskServer) Updates() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.updates
}

// Cancelled lists the tasks a tasks/cancel named, in order.
func (ts *TaskServer) Cancelled() []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return append([]string(nil), ts.cancelled...)
}

// Traceparents lists the _meta traceparent of each task tool call, in order ("" when absent).
func (ts *TaskServer) Traceparents() []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return append([]string(nil), ts.traceparents...)
}

// Status is the task's status now; "" for a task the server does not know.
func (ts *TaskServer) Status(id string) string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if t := ts.tasks[id]; t != nil {
		return t.status
	}
	return ""
}

package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/propagation"
)

// Tasks: the io.modelcontextprotocol/tasks extension of MCP 2026-07-28.
//
// A server that declares the extension may answer a tools/call with a task handle
// (resultType "task") instead of a result. The call then returns Waiting with the handle: the
// loop parks the run holding no connection and no executor slot, and asks the tool again with the
// handle when a look is due. A look is one tasks/get; a task asking for input (status
// input_required) becomes a suspension per input request, whose answer goes back with
// tasks/update; a task that ends gives the call its result. The Go SDK (v1.8.0) speaks neither the
// methods nor the result type, so for a server that declares the extension these requests go as
// plain JSON-RPC over the SDK's own streamable transport (taskRPC), with the per-request _meta of
// the stateless revision, and the SDK session is used only to negotiate.

const (
	tasksExtension = "io.modelcontextprotocol/tasks"
	// RevisionStateless is the MCP revision without initialize or sessions; RevisionLegacy the one
	// before it, whose servers keep the elicitation path.
	RevisionStateless = "2026-07-28"
	RevisionLegacy    = "2025-11-25"
)

// Task statuses.
const (
	taskWorking       = "working"
	taskInputRequired = "input_required"
	taskCompleted     = "completed"
	taskFailed        = "failed"
	taskCancelled     = "cancelled"
)

// task is the Task shape of tasks/get and of a CreateTaskResult.
type task struct {
	ResultType     string                     `json:"resultType"`
	TaskID         string                     `json:"taskId"`
	Status         string                     `json:"status"`
	StatusMessage  string                     `json:"statusMessage"`
	PollIntervalMs int64                      `json:"pollIntervalMs"`
	InputRequests  map[string]json.RawMessage `json:"inputRequests"`
	Result         json.RawMessage            `json:"result"`
	Error          *jsonrpc.Error             `json:"error"`
}

// callResult is a tools/call result of any result type.
type callResult struct {
	task
	RequestState string `json:"requestState"`
}

// inputRequest is one entry of inputRequests.
type inputRequest struct {
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

// tasksDeclared reports whether the session's server speaks the stateless revision and declares
// the tasks extension: only then may a call become a task, and only then does it go through
// taskRPC.
func tasksDeclared(session *mcp.ClientSession) bool {
	res := session.InitializeResult()
	if res == nil || res.ProtocolVersion < RevisionStateless || res.Capabilities == nil {
		return false
	}
	_, ok := res.Capabilities.Extensions[tasksExtension]
	return ok
}

// Revision is the protocol revision negotiated with the server when its tools were listed.
func (s *MCPServer) Revision() string { return s.revision }

// taskRPC sends JSON-RPC requests on the SDK's streamable transport, one response per request.
type taskRPC struct {
	conn mcp.Connection
	next atomic.Int64
}

type mcpNameKey struct{}

// nameRouting sets the Mcp-Name header of a tasks/* request to the task id, as the extension
// requires (the SDK sets it only for the methods it knows).
type nameRouting struct{ base http.RoundTripper }

func (n nameRouting) RoundTrip(req *http.Request) (*http.Response, error) {
	if name, ok := req.Context().Value(mcpNameKey{}).(string); ok && name != "" {
		req = req.Clone(req.Context())
		req.Header.Set("Mcp-Name", name)
	}
	return n.base.RoundTrip(req)
}

// dialTasks opens a taskRPC with the spec's headers. Nothing is negotiated: tasks exist only in
// the stateless revision, whose requests each carry their revision.
func (s *MCPServer) dialTasks(ctx context.Context) (*taskRPC, *mcpSession, error) {
	hdrs, err := resolveHeaders(ctx, s.spec.Headers)
	if err != nil {
		return nil, nil, err
	}
	httpClient, bodies, hdrs := s.httpClient(ctx, hdrs)
	httpClient.Transport = nameRouting{base: httpClient.Transport}
	transport := &mcp.StreamableClientTransport{Endpoint: s.spec.URL, HTTPClient: httpClient, MaxRetries: -1}
	conn, err := transport.Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	return &taskRPC{conn: conn}, &mcpSession{hdrs: hdrs, bodies: bodies}, nil
}

func (r *taskRPC) close() { go func() { _ = r.conn.Close() }() }

// call sends method with params (their _meta filled in) and returns the result, or the error the
// server answered with (*jsonrpc.Error) or the transport's.
func (r *taskRPC) call(ctx context.Context, method string, params map[string]any, name string) (json.RawMessage, error) {
	meta, _ := params["_meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["io.modelcontextprotocol/protocolVersion"] = RevisionStateless
	meta["io.modelcontextprotocol/clientInfo"] = clientInfo
	meta["io.modelcontextprotocol/clientCapabilities"] = clientCapabilities()
	traceparent(ctx, meta)
	params["_meta"] = meta
	raw, err := json.Marshal(params)
	if err != nil {
		return nil, err
	}
	id, err := jsonrpc.MakeID(fmt.Sprintf("tn-%d", r.next.Add(1)))
	if err != nil {
		return nil, err
	}
	if err := r.conn.Write(context.WithValue(ctx, mcpNameKey{}, name), &jsonrpc.Request{ID: id, Method: method, Params: raw}); err != nil {
		return nil, err
	}
	for {
		msg, err := r.conn.Read(ctx)
		if err != nil {
			return nil, err
		}
		if resp, ok := msg.(*jsonrpc.Response); ok && resp.ID == id {
			if resp.Error != nil {
				return nil, resp.Error
			}
			return resp.Result, nil
		}
		// Notifications (progress, logs) and anything else are not for this client.
	}
}

// traceparent puts the W3C traceparent of ctx's span in a request's _meta.
func traceparent(ctx context.Context, meta map[string]any) {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	if tp := carrier.Get("traceparent"); tp != "" {
		meta["traceparent"] = tp
	}
}

// callAsTask runs a tools/call on a server that declares the tasks extension: the result is the
// tool's, a wait on the task the server made of it, or the round of input it asked for (Asking);
// the retry of that round (tc.Round) carries the answers and the requestState.
func (s *MCPServer) callAsTask(ctx context.Context, name string, args map[string]any, tc *ToolContext, fail func(string) ToolResult) ToolResult {
	rpc, session, err := s.dialTasks(ctx)
	if err != nil {
		return fail(err.Error())
	}
	defer rpc.close()
	params := map[string]any{"name": name, "arguments": args}
	if r := tc.Round; r != nil {
		params["inputResponses"], params["requestState"] = inputResponses(r), r.Resume
	}
	raw, err := rpc.call(ctx, "tools/call", params, name)
	if err != nil {
		return fail(session.explain(err))
	}
	var res callResult
	if err := json.Unmarshal(raw, &res); err != nil {
		return fail(fmt.Sprintf("the result is not a tools/call result: %v", err))
	}
	switch res.ResultType {
	case "task":
		return s.taskHandle(&res.task, fail)
	case "input_required":
		asked, err := elicitations(res.InputRequests)
		if err != nil {
			return fail(err.Error())
		}
		return asking(tc.CallID, asked, res.RequestState, session.hdrs, fail)
	}
	var out mcp.CallToolResult
	if err := json.Unmarshal(raw, &out); err != nil {
		return fail(fmt.Sprintf("the result is not a tools/call result: %v", err))
	}
	r := mcpResult(&out)
	r.Output = capOutput(session.hdrs.redact(r.Output), s.spec.MaxOutputBytes, false, -1)
	return r
}

// elicitation reads an input request the client can answer: an elicitation. Sampling and roots
// are not declared, so a server must not ask for them.
func elicitation(raw json.RawMessage) (*mcp.ElicitParams, error) {
	var ir inputRequest
	if err := json.Unmarshal(raw, &ir); err != nil {
		return nil, err
	}
	if ir.Method != "elicitation/create" {
		return nil, fmt.Errorf("method %q is not one this client declared (only elicitation/create)", ir.Method)
	}
	var p mcp.ElicitParams
	if err := json.Unmarshal(ir.Params, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// taskHandle is the wait on a task the server created.
func (s *MCPServer) taskHandle(t *task, fail func(string) ToolResult) ToolResult {
	if err := checkTaskID(t.TaskID); err != nil {
		return fail(err.Error())
	}
	return Waiting(Wait{Kind: WaitKindMCPTask, Server: s.spec.Name, ID: t.TaskID, PollIntervalMs: t.PollIntervalMs,
		Status: t.Status, Message: t.StatusMessage})
}

// checkTaskID refuses an id the Mcp-Name header cannot carry; its length is the loop's to bound.
func checkTaskID(id string) error {
	if id == "" {
		return errors.New("the server answered with a task without a taskId")
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return fmt.Errorf("the task id has byte 0x%02x at %d; only visible ASCII can be routed (Mcp-Name)", id[i], i)
		}
	}
	return nil
}

// pollTask looks at the task tc.Wait names, after handing it tc.Answer when there is one.
func (s *MCPServer) pollTask(ctx context.Context, tc *ToolContext, fail func(string) ToolResult) ToolResult {
	h := *tc.Wait
	rpc, session, err := s.dialTasks(ctx)
	if err != nil {
		h.PollError = err.Error()
		return Waiting(h)
	}
	defer rpc.close()
	get := func() (*task, ToolResult, bool) {
		raw, err := rpc.call(ctx, "tasks/get", map[string]any{"taskId": h.ID}, h.ID)
		var rpcErr *jsonrpc.Error
		switch {
		case errors.As(err, &rpcErr) && rpcErr.Code == jsonrpc.CodeInvalidParams:
			return nil, fail(fmt.Sprintf("task %s is not known to the server any more (it expired or was purged): %s", h.ID, session.explain(err))), false
		case err != nil:
			h.PollError = session.explain(err)
			return nil, Waiting(h), false
		}
		var t task
		if err := json.Unmarshal(raw, &t); err != nil {
			h.PollError = fmt.Sprintf("tasks/get answered what is not a task: %v", err)
			return nil, Waiting(h), false
		}
		return &t, ToolResult{}, true
	}
	t, res, ok := get()
	if !ok {
		return res
	}
	answered := ""
	if a := tc.Answer; a != nil && t.Status == taskInputRequired {
		if key, req, found := taskInput(tc.CallID, h.ID, t.InputRequests, a.ID, ""); found {
			responses := map[string]any{key: elicitResult(*a, req.Kind == KindInput)}
			if _, err := rpc.call(ctx, "tasks/update", map[string]any{"taskId": h.ID, "inputResponses": responses}, h.ID); err != nil {
				// Not handed over: the request stays open on the server, and a person is asked again.
				return fail(fmt.Sprintf("task %s: handing over the answer failed: %s", h.ID, session.explain(err)))
			}
			answered = key
			if t, res, ok = get(); !ok {
				return res
			}
		}
	}
	h.Status, h.Message, h.PollIntervalMs = t.Status, t.StatusMessage, t.PollIntervalMs
	switch t.Status {
	case taskWorking:
		return Waiting(h)
	case taskInputRequired:
		// An update is eventually consistent: the request just answered may still be listed.
		if _, req, found := taskInput(tc.CallID, h.ID, t.InputRequests, "", answered); found {
			return Pending(req)
		}
		if answered != "" {
			return Waiting(h)
		}
		return fail(fmt.Sprintf("task %s asks for input without an input request the client can answer", h.ID))
	case taskCompleted:
		var out mcp.CallToolResult
		if err := json.Unmarshal(t.Result, &out); err != nil {
			return fail(fmt.Sprintf("task %s completed with what is not a tools/call result: %v", h.ID, err))
		}
		r := mcpResult(&out)
		r.Output = capOutput(session.hdrs.redact(r.Output), s.spec.MaxOutputBytes, false, -1)
		return r
	case taskFailed:
		msg := t.StatusMessage
		if t.Error != nil {
			msg = t.Error.Message
		}
		return fail(fmt.Sprintf("task %s failed: %s", h.ID, session.hdrs.redact(msg)))
	case taskCancelled:
		return fail(fmt.Sprintf("task %s was cancelled by the server: %s", h.ID, session.hdrs.redact(t.StatusMessage)))
	}
	h.PollError = fmt.Sprintf("tasks/get answered the unknown status %q", t.Status)
	return Waiting(h)
}

// taskInput finds, among a task's input requests in key order, the one whose Request id is id
// (any, when id is empty) and whose key is not skip; it returns the key and the Request.
func taskInput(callID, taskID string, requests map[string]json.RawMessage, id, skip string) (string, Request, bool) {
	keys := make([]string, 0, len(requests))
	for k := range requests {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, key := range keys {
		if key == skip {
			continue
		}
		p, err := elicitation(requests[key])
		if err != nil {
			continue
		}
		req := elicitationRequest(callID, p)
		req.ID = taskInputID(taskID, key)
		if id == "" || req.ID == id {
			return key, req, true
		}
	}
	return "", Request{}, false
}

// taskInputID is "tin-" and a digest of the task and the input request's key: the key is unique
// over the task's life, so another key is another question.
func taskInputID(taskID, key string) string {
	sum := sha256.Sum256([]byte(taskID + "\x00" + key))
	return "tin-" + hex.EncodeToString(sum[:8])
}

// CancelMCPTask asks the server of spec to stop the task w (tasks/cancel). Cancellation is
// cooperative: the server acknowledges and may still finish the work.
func CancelMCPTask(ctx context.Context, spec MCPServerSpec, w Wait) error {
	if w.Kind != WaitKindMCPTask {
		return fmt.Errorf("mcp server %s: %s %s is not an MCP task", spec.Name, w.Kind, w.ID)
	}
	s, err := newMCPServer(spec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.spec.Timeout)
	defer cancel()
	if s.spec.OAuth != nil {
		// The task is the login's: cancelling it is signed in too, and never begins a login.
		token, err := s.spec.OAuth.Token(ctx, s.spec.URL, "")
		if err != nil {
			return fmt.Errorf("mcp server %s: reading the login's token: %w", spec.Name, err)
		}
		ctx = withLogin(ctx, token, &challenges{})
	}
	rpc, session, err := s.dialTasks(ctx)
	if err != nil {
		return fmt.Errorf("mcp server %s: %w", spec.Name, err)
	}
	defer rpc.close()
	if _, err := rpc.call(ctx, "tasks/cancel", map[string]any{"taskId": w.ID}, w.ID); err != nil {
		return fmt.Errorf("mcp server %s: cancelling task %s: %s", spec.Name, w.ID, session.explain(err))
	}
	return nil
}

package toolnexustest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"github.com/toolnexus/operator/internal/tools/toolstest"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// Request is what a tool suspends its call with (toolnexus Request): Kind is approval, input,
// question, authorization, tool_call or any; an empty ID is generated.
type Request = wire.Request

// ToolAnswer is a person's answer as the tool receives it when the call is retried after it (the
// Toolnexus-Answer header), without answer.requestUID.
type ToolAnswer = wire.Answer

// Call is one call a ToolServer received.
type Call struct {
	Method, Path string
	// Args is the JSON body, the call's arguments; nil when the body is not a JSON object.
	Args map[string]any
	Body []byte
	// IdempotencyKey is <run uid>/<tool call id>, with /answer on the retry after an answer.
	IdempotencyKey string
	// Answer is the answer the call was retried with; nil on a first call.
	Answer *ToolAnswer
	Header http.Header
	// Reply is what the server answered.
	Reply ToolReply
}

// ToolReply is a ToolServer's response to a call: a non-2xx status is the error result
// "HTTP <status>: <body>", a 2xx body is the output unless it is a suspension.
type ToolReply struct {
	Status int
	Body   string
}

// OK is a 200 reply whose body is the call's output.
func OK(body string) ToolReply { return ToolReply{Status: http.StatusOK, Body: body} }

// HTTPError is a reply with a non-2xx status: the model sees "HTTP <status>: <body>".
func HTTPError(status int, body string) ToolReply { return ToolReply{Status: status, Body: body} }

// Suspend is a reply that parks the run on a PendingRequest holding req (a toolnexus ToolResult
// whose metadata.pending is req); the call is retried with the answer.
func Suspend(req Request) ToolReply {
	raw, err := json.Marshal(wire.Pending(req))
	if err != nil {
		panic(fmt.Sprintf("toolnexustest: a Request that is not JSON: %v", err))
	}
	return OK(string(raw))
}

// NeedsApproval suspends the call with an approval request.
func NeedsApproval(prompt string) ToolReply {
	return Suspend(Request{Kind: wire.KindApproval, Prompt: prompt})
}

// NeedsInput suspends the call with an input request: the answer carries data.output.
func NeedsInput(prompt string) ToolReply {
	return Suspend(Request{Kind: wire.KindInput, Prompt: prompt})
}

// AuthRequired is the LangSmith Fleet reply {"auth_required": true, "auth_url": url, "auth_id":
// id}: an authorization request with url and data.auth_id.
func AuthRequired(url, id string) ToolReply {
	raw, err := json.Marshal(map[string]any{"auth_required": true, "auth_url": url, "auth_id": id})
	if err != nil {
		panic(err)
	}
	return OK(string(raw))
}

// ToolHandler decides the reply to one call. It may be called concurrently; to answer slowly, it
// sleeps.
type ToolHandler func(Call) ToolReply

// ToolServer is a fake HTTP tool server for one test; a tool's spec.tools[].http.url is
// URL() + "/" + a path of the handler's choosing.
type ToolServer struct {
	server *toolstest.Server

	mu    sync.Mutex
	calls []Call
}

// NewToolServer starts a tool server answering every call with handler; it is closed when t ends.
// A call whose Toolnexus-Answer header is malformed fails t and gets a 400.
func NewToolServer(t T, handler ToolHandler) *ToolServer {
	t.Helper()
	s := &ToolServer{}
	s.server = toolstest.Serve(t, func(c toolstest.Call) (int, string) {
		call := Call{Method: c.Method, Path: c.Path, Args: c.Args, Body: c.Body, IdempotencyKey: c.IdempotencyKey, Answer: c.Answer, Header: c.Header}
		call.Reply = handler(call)
		s.mu.Lock()
		s.calls = append(s.calls, call)
		s.mu.Unlock()
		return call.Reply.Status, call.Reply.Body
	})
	return s
}

// URL is the server's base URL.
func (s *ToolServer) URL() string { return s.server.URL }

// Calls returns the calls the server answered so far, in the order it answered them.
func (s *ToolServer) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

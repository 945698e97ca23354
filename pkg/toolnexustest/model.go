package toolnexustest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/toolnexus/operator/internal/loop/looptest"
)

// T is what the kit needs of a test: *testing.T and Ginkgo's GinkgoT() have it. What the kit
// starts is stopped by T's cleanup, so a Ginkgo suite starts its Env with the GinkgoT() of its
// BeforeSuite, and a plain test with its own T.
type T interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// Reply is one scripted response of a Model.
type Reply struct {
	reply   looptest.Reply
	compute func(ModelRequest) Reply
}

// Text is a completion that answers with text: a run whose model answers so ends.
func Text(text string) Reply { return Reply{reply: looptest.OpenAIText(text)} }

// ToolCall is one call of a ToolCalls reply. Arguments is the JSON text of the arguments object,
// as a model sends it.
type ToolCall struct {
	ID, Name, Arguments string
}

// ToolCalls is a completion that calls tools.
func ToolCalls(calls ...ToolCall) Reply {
	scripted := make([]looptest.ToolCall, len(calls))
	for i, c := range calls {
		scripted[i] = looptest.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments}
	}
	return Reply{reply: looptest.OpenAIToolCalls(scripted...)}
}

// Failure is an OpenAI error response with status: the operator retries a 429 or a 5xx as a
// transient failure (spec.model.retries) and fails the run on any other.
func Failure(status int, message string) Reply {
	return Reply{reply: looptest.OpenAIError(status, message)}
}

// Computed is a reply computed from the request it answers, for a model whose answer depends on
// what it is told (a tool's output, a declined approval).
func Computed(compute func(ModelRequest) Reply) Reply { return Reply{compute: compute} }

// After delays the reply by d, as a slow model would; a request the operator gives up meanwhile
// (spec.model.requestTimeout) gets no answer.
func (r Reply) After(d time.Duration) Reply {
	if r.compute != nil {
		compute := r.compute
		r.compute = func(req ModelRequest) Reply { return compute(req).After(d) }
		return r
	}
	r.reply.Delay = d
	return r
}

// ModelRequest is one request a Model received.
type ModelRequest struct {
	Path   string
	Header http.Header
	// Body is the chat-completions request as JSON.
	Body []byte
}

// Message is one message of a chat-completions request.
type Message struct {
	Role string
	// Text is the content, a string or the text of its parts.
	Text string
	// ToolCalls are the calls of an assistant message; ToolCallID is what a tool message answers.
	ToolCalls  []ToolCall
	ToolCallID string
}

// Messages decodes the request's messages.
func (r ModelRequest) Messages() ([]Message, error) {
	chat, err := looptest.Request{Path: r.Path, Header: r.Header, Body: r.Body}.Chat()
	if err != nil {
		return nil, fmt.Errorf("the model request is not a chat-completions request: %w", err)
	}
	messages := make([]Message, len(chat.Messages))
	for i, m := range chat.Messages {
		messages[i] = Message{Role: m.Role, Text: m.Text(), ToolCallID: m.ToolCallID}
		for _, c := range m.ToolCalls {
			messages[i].ToolCalls = append(messages[i].ToolCalls, ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
		}
	}
	return messages, nil
}

// Model is a scripted OpenAI-compatible model endpoint for one test.
type Model struct {
	server *looptest.Server
}

// NewModel starts a model answering its requests with replies, in order; it is closed when t
// ends. A request beyond the script fails t and gets a 500.
func NewModel(t T, replies ...Reply) *Model {
	t.Helper()
	var mu sync.Mutex
	n := 0
	var respond looptest.Responder = func(r looptest.Request) looptest.Reply {
		mu.Lock()
		n++
		if len(replies) == 0 {
			mu.Unlock()
			t.Errorf("toolnexustest: model request %d is beyond the script of the model", n)
			return looptest.OpenAIError(http.StatusInternalServerError, "toolnexustest: no scripted reply")
		}
		next := replies[0]
		replies = replies[1:]
		mu.Unlock()
		for next.compute != nil {
			next = next.compute(ModelRequest{Path: r.Path, Header: r.Header, Body: r.Body})
		}
		return next.reply
	}
	return &Model{server: looptest.Serve(t, respond)}
}

// URL is the model's base URL, for spec.model.baseURL (the operator posts to URL/chat/completions).
func (m *Model) URL() string { return m.server.URL }

// Requests returns what the model was sent so far, in order of arrival.
func (m *Model) Requests() []ModelRequest {
	received := m.server.Requests()
	requests := make([]ModelRequest, len(received))
	for i, r := range received {
		requests[i] = ModelRequest{Path: r.Path, Header: r.Header, Body: r.Body}
	}
	return requests
}

// LastMessage returns the request's last message: after a tool call, the tool message holding
// the tool's output or the reason it did not run.
func (r ModelRequest) LastMessage() (Message, error) {
	messages, err := r.Messages()
	if err != nil {
		return Message{}, err
	}
	if len(messages) == 0 {
		return Message{}, fmt.Errorf("the model request has no messages: %s", json.RawMessage(r.Body))
	}
	return messages[len(messages)-1], nil
}

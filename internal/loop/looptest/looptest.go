// Package looptest is a fake model endpoint for tests: an httptest server that answers each
// request with the next scripted reply, in the real OpenAI chat-completions or Anthropic Messages
// wire format, and records what it was sent.
package looptest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
)

// T is the part of testing.TB the fake needs; Ginkgo's GinkgoT() satisfies it too.
type T interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Reply is one scripted response.
type Reply struct {
	Status int // 0 means 200
	Header http.Header
	Body   string
}

// Request is one recorded request.
type Request struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
}

// JSON decodes the request body.
func (r Request) JSON(t T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("request body is not JSON: %v\n%s", err, r.Body)
	}
	return m
}

// Server is the fake endpoint. URL is its base URL.
type Server struct {
	URL string

	t        T
	mu       sync.Mutex
	replies  []Reply
	requests []Request
}

// New starts a server answering with replies in order; it is closed when the test ends. A request
// beyond the script fails the test and gets a 500.
func New(t T, replies ...Reply) *Server {
	s := &Server{t: t, replies: replies}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
	if len(s.replies) == 0 {
		s.mu.Unlock()
		s.t.Errorf("looptest: unscripted request %d to %s", len(s.requests), r.URL.Path)
		http.Error(w, `{"error":{"message":"looptest: no scripted reply"}}`, http.StatusInternalServerError)
		return
	}
	reply := s.replies[0]
	s.replies = s.replies[1:]
	s.mu.Unlock()
	for k, v := range reply.Header {
		w.Header()[k] = v
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	if reply.Status == 0 {
		reply.Status = http.StatusOK
	}
	w.WriteHeader(reply.Status)
	_, _ = io.WriteString(w, reply.Body)
}

// Requests returns what the server was sent so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// ToolCall is a tool call for a scripted reply. Arguments is the raw JSON text.
type ToolCall struct {
	ID, Name, Arguments string
}

// Usage of every scripted reply: 10 prompt and 5 completion tokens.
const (
	PromptTokens     = 10
	CompletionTokens = 5
)

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

var openAIUsage = map[string]any{"prompt_tokens": PromptTokens, "completion_tokens": CompletionTokens, "total_tokens": PromptTokens + CompletionTokens}

// OpenAIText is a chat completion that ends the run with text.
func OpenAIText(text string) Reply {
	return Reply{Body: mustJSON(map[string]any{
		"id": "chatcmpl-text", "object": "chat.completion", "model": "fake",
		"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
			"message": map[string]any{"role": "assistant", "content": text}}},
		"usage": openAIUsage,
	})}
}

// OpenAIToolCalls is a chat completion requesting tool calls.
func OpenAIToolCalls(calls ...ToolCall) Reply {
	tcs := make([]any, len(calls))
	for i, c := range calls {
		tcs[i] = map[string]any{"id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": c.Arguments}}
	}
	return Reply{Body: mustJSON(map[string]any{
		"id": "chatcmpl-tools", "object": "chat.completion", "model": "fake",
		"choices": []any{map[string]any{"index": 0, "finish_reason": "tool_calls",
			"message": map[string]any{"role": "assistant", "content": nil, "tool_calls": tcs}}},
		"usage": openAIUsage,
	})}
}

var anthropicUsage = map[string]any{"input_tokens": PromptTokens, "output_tokens": CompletionTokens}

// AnthropicText is a message that ends the run with text.
func AnthropicText(text string) Reply {
	return Reply{Body: mustJSON(map[string]any{
		"id": "msg_text", "type": "message", "role": "assistant", "model": "fake", "stop_reason": "end_turn",
		"content": []any{map[string]any{"type": "text", "text": text}},
		"usage":   anthropicUsage,
	})}
}

// AnthropicToolUse is a message requesting tool calls.
func AnthropicToolUse(calls ...ToolCall) Reply {
	blocks := make([]any, len(calls))
	for i, c := range calls {
		blocks[i] = map[string]any{"type": "tool_use", "id": c.ID, "name": c.Name, "input": json.RawMessage(c.Arguments)}
	}
	return Reply{Body: mustJSON(map[string]any{
		"id": "msg_tools", "type": "message", "role": "assistant", "model": "fake", "stop_reason": "tool_use",
		"content": blocks, "usage": anthropicUsage,
	})}
}

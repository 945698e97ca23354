package looptest

import (
	"encoding/json"
	"net/http"
	"strings"
)

// The OpenAI chat-completions wire format (POST {base}/chat/completions), as far as the fakes
// read and write it. The loop itself speaks it through go-openai; these types are for the other
// side of the wire.

// ChatRequest is a chat-completions request.
type ChatRequest struct {
	Model    string        `json:"model"`
	Messages []ChatMessage `json:"messages"`
	Tools    []ChatTool    `json:"tools,omitempty"`
}

// ChatMessage is a message of a request, or the assistant message of a completion. Content is a
// string, a list of content parts or null; Text reads all three.
type ChatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  []ChatToolCall  `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
}

// ChatToolCall is a tool call of an assistant message; Arguments is JSON text.
type ChatToolCall struct {
	ID       string           `json:"id"`
	Type     string           `json:"type"`
	Function ChatFunctionCall `json:"function"`
}

// ChatFunctionCall names the function a ChatToolCall calls.
type ChatFunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ChatTool is a tool offered in a request.
type ChatTool struct {
	Type     string       `json:"type"`
	Function ChatFunction `json:"function"`
}

// ChatFunction describes an offered tool; Parameters is its JSON schema.
type ChatFunction struct {
	Name        string         `json:"name"`
	Description string         `json:"description,omitempty"`
	Parameters  map[string]any `json:"parameters,omitempty"`
}

// ChatCompletion is a chat-completions response with one choice.
type ChatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint,omitempty"`
	Choices           []ChatChoice `json:"choices"`
	Usage             ChatUsage    `json:"usage"`
}

// ChatChoice is a completion's choice.
type ChatChoice struct {
	Index        int         `json:"index"`
	FinishReason string      `json:"finish_reason"`
	Message      ChatMessage `json:"message"`
}

// ChatUsage is a completion's token count.
type ChatUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// Chat decodes the request as a chat-completions request.
func (r Request) Chat() (ChatRequest, error) {
	var req ChatRequest
	err := json.Unmarshal(r.Body, &req)
	return req, err
}

// Text returns the message's content whether it is a string or a list of text parts.
func (m ChatMessage) Text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(m.Content, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return ""
}

// NewCompletion is the completion of id and model answering with msg: it finishes with
// "tool_calls" when msg calls tools, else with "stop".
func NewCompletion(id, model string, msg ChatMessage, usage ChatUsage) ChatCompletion {
	finish := "stop"
	if len(msg.ToolCalls) > 0 {
		finish = "tool_calls"
	}
	return ChatCompletion{
		ID: id, Object: "chat.completion", Model: model,
		Choices: []ChatChoice{{Index: 0, FinishReason: finish, Message: msg}},
		Usage:   usage,
	}
}

// Reply is the completion as the fake's response.
func (c ChatCompletion) Reply() Reply { return Reply{Body: mustJSON(c)} }

// AssistantText is the assistant message that answers with text.
func AssistantText(text string) ChatMessage {
	return ChatMessage{Role: "assistant", Content: json.RawMessage(mustJSON(text))}
}

// AssistantToolCalls is the assistant message that calls tools; its content is null.
func AssistantToolCalls(calls ...ChatToolCall) ChatMessage {
	return ChatMessage{Role: "assistant", ToolCalls: calls}
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

var scriptedUsage = ChatUsage{PromptTokens: PromptTokens, CompletionTokens: CompletionTokens, TotalTokens: PromptTokens + CompletionTokens}

// OpenAIText is a chat completion that ends the run with text.
func OpenAIText(text string) Reply {
	return NewCompletion("chatcmpl-text", "fake", AssistantText(text), scriptedUsage).Reply()
}

// OpenAIToolCalls is a chat completion requesting tool calls.
func OpenAIToolCalls(calls ...ToolCall) Reply {
	tcs := make([]ChatToolCall, len(calls))
	for i, c := range calls {
		tcs[i] = ChatToolCall{ID: c.ID, Type: "function", Function: ChatFunctionCall{Name: c.Name, Arguments: c.Arguments}}
	}
	return NewCompletion("chatcmpl-tools", "fake", AssistantToolCalls(tcs...), scriptedUsage).Reply()
}

// OpenAIError is an OpenAI error response: an invalid_request_error below status 500, else a
// server_error.
func OpenAIError(status int, message string) Reply {
	typ := "invalid_request_error"
	if status >= http.StatusInternalServerError {
		typ = "server_error"
	}
	return Reply{Status: status, Body: mustJSON(map[string]any{"error": map[string]any{"message": message, "type": typ}})}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

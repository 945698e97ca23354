package loop

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/toolnexus/operator/internal/tools"
)

// Tracer wraps each model request and each tool execution in a span; the controller's is
// OpenTelemetry (internal/telemetry), and nil traces nothing. The context a Start method returns
// is the one the request or the tool runs with, so the HTTP transport can propagate it.
type Tracer interface {
	// Content reports whether spans record prompts, arguments and outputs; only then does the
	// loop fill the Content fields below, with the model's API key redacted.
	Content() bool
	StartModel(ctx context.Context, s ModelSpan) (context.Context, func(ModelSpanEnd))
	StartTool(ctx context.Context, s ToolSpan) (context.Context, func(ToolSpanEnd))
}

// ModelSpan describes a model request about to be sent.
type ModelSpan struct {
	Style, Model, BaseURL string
	// Content: the system prompt, and the transcript sent as JSON.
	System, Input string
}

// ModelSpanEnd is how a model request ended.
type ModelSpanEnd struct {
	// Model is the model the endpoint says answered; FinishReason why it stopped.
	Model, FinishReason string
	Usage               Usage
	// Err is the request's failure and ErrorType its class: the HTTP status, "network",
	// "invalid_response" or "_OTHER".
	Err       error
	ErrorType string
	// Content: the assistant message as JSON.
	Output string
}

// Tool call outcomes of a ToolSpanEnd.
const (
	ToolOK      = "ok"
	ToolError   = "error"
	ToolPending = "pending"
)

// ToolSpan describes a tool execution about to start.
type ToolSpan struct {
	Name, CallID string
	Source       tools.Source
	// Content: the arguments the model sent.
	Arguments string
}

// ToolSpanEnd is how a tool execution ended.
type ToolSpanEnd struct {
	// Outcome is ToolOK, ToolError or ToolPending; Kind the suspension's kind when pending.
	Outcome, Kind string
	// Err is a hook's error, which aborts the run.
	Err error
	// Content: the tool's output.
	Output string
}

// traceModel starts the span of a model request; its end function takes the request's outcome.
func (c *Client) traceModel(ctx context.Context, req modelRequest) (context.Context, func(modelResponse, error)) {
	t := c.opts.Tracer
	if t == nil {
		return ctx, func(modelResponse, error) {}
	}
	content := t.Content()
	s := ModelSpan{Style: c.opts.Style, Model: req.Model, BaseURL: c.opts.BaseURL}
	if content {
		s.System, s.Input = c.redact(req.System), c.redactJSON(req.Messages)
	}
	ctx, end := t.StartModel(ctx, s)
	return ctx, func(resp modelResponse, err error) {
		if err != nil {
			end(ModelSpanEnd{Err: err, ErrorType: errorType(err)})
			return
		}
		e := ModelSpanEnd{Model: resp.Model, FinishReason: resp.FinishReason, Usage: resp.Usage}
		if content {
			e.Output = c.redactJSON(Message{Role: RoleAssistant, Content: resp.Text, ToolCalls: resp.ToolCalls})
		}
		end(e)
	}
}

// traceTool runs one execution of call inside its span.
func (c *Client) traceTool(ctx context.Context, call Call, tk *tools.Toolkit, run func(context.Context) *execution) *execution {
	t := c.opts.Tracer
	if t == nil {
		return run(ctx)
	}
	content := t.Content()
	tool, _ := tk.Lookup(call.Name)
	s := ToolSpan{Name: call.Name, CallID: call.ID, Source: tool.Source}
	if content {
		s.Arguments = c.redact(call.Arguments)
	}
	ctx, end := t.StartTool(ctx, s)
	o := run(ctx)
	e := ToolSpanEnd{Outcome: ToolOK, Err: o.err}
	switch req := tools.PendingOf(o.result); {
	case req != nil:
		e.Outcome, e.Kind = ToolPending, req.Kind
	case o.result.IsError || o.err != nil:
		e.Outcome = ToolError
	}
	if content {
		e.Output = c.redact(o.result.Output)
	}
	end(e)
	return o
}

func (c *Client) redact(s string) string { return string(redactSecret([]byte(s), c.opts.APIKey)) }

func (c *Client) redactJSON(v any) string {
	raw, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(redactSecret(raw, c.opts.APIKey))
}

// errorType classifies a model error for error.type: a bounded vocabulary.
func errorType(err error) string {
	var pe *ProviderError
	var ne *networkError
	switch {
	case errors.As(err, &pe):
		return strconv.Itoa(pe.Status)
	case errors.As(err, &ne):
		return "network"
	case errors.Is(err, ErrInvalidResponse):
		return "invalid_response"
	}
	return "_OTHER"
}

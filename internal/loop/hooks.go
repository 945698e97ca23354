package loop

import (
	"context"
	"time"

	"github.com/toolnexus/operator/internal/tools"
)

// Hooks intercept model and tool calls, with toolnexus Go semantics: Turn is 0-based and any hook
// error aborts the run (Step returns it). Tool hooks of one turn run concurrently, one goroutine
// per call.
type Hooks struct {
	// BeforeLLM may replace the transcript (for the rest of the run), the tools or the model (for
	// this turn). An error means no request is sent.
	BeforeLLM func(ctx context.Context, ev BeforeLLMEvent) (*LLMOverride, error)
	// AfterLLM observes the raw provider payload.
	AfterLLM func(ctx context.Context, ev AfterLLMEvent) error
	// BeforeTool may rewrite the arguments, or short-circuit the call with a Result: the tool never
	// runs and AfterTool is skipped. A pending Result is an approval gate (toolnexus "path B").
	// It is not called again for the retry with an answer.
	BeforeTool func(ctx context.Context, ev BeforeToolEvent) (*ToolOverride, error)
	// AfterTool may replace a tool's result. It is not called when a call suspends, and is called
	// once on the result of the retry with an answer.
	AfterTool func(ctx context.Context, ev AfterToolEvent) (*ToolOverride, error)
}

// BeforeLLMEvent is what the next model request would carry.
type BeforeLLMEvent struct {
	Messages []Message
	Tools    []tools.Tool
	Model    string
	Turn     int
}

// LLMOverride replaces parts of the next model request; zero fields keep the original.
type LLMOverride struct {
	Messages []Message
	Tools    []tools.Tool
	Model    string
}

// AfterLLMEvent carries the model's raw JSON response.
type AfterLLMEvent struct {
	Response map[string]any
	Model    string
	Turn     int
}

// BeforeToolEvent describes a tool call about to run.
type BeforeToolEvent struct {
	Name string
	Args map[string]any
	ID   string
	Turn int
}

// AfterToolEvent describes a tool call that produced a result.
type AfterToolEvent struct {
	Name   string
	Args   map[string]any
	Result tools.ToolResult
	ID     string
	Turn   int
}

// ToolOverride changes a tool call: Args rewrites the arguments (BeforeTool), Result replaces the
// result (BeforeTool: short-circuit; AfterTool: transform).
type ToolOverride struct {
	Args   map[string]any
	Result *tools.ToolResult
}

// EventKind says which of Event's fields are set.
type EventKind string

// Event kinds.
const (
	EventLLM  EventKind = "llm"
	EventTool EventKind = "tool"
)

// Event is an observation for metrics (toolnexus onMetric): one per model request and one per tool
// execution. A suspension is reported as Pending, never as IsError.
type Event struct {
	Kind     EventKind
	Duration time.Duration

	// LLM events.
	Model            string
	StatusCode       int // 0 when the endpoint was not reached
	OK               bool
	PromptTokens     int
	CompletionTokens int

	// Tool events.
	Tool    string
	Source  tools.Source
	IsError bool
	Pending bool
}

package loop

import (
	"context"
	"time"

	"github.com/toolnexus/operator/internal/loop/state"
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
	// Once a gate approves, BeforeTool is called again with the gate in Passed and the arguments
	// the approver saw (a rewrite is ignored then), so a call can pass several gates one after the
	// other; it runs when BeforeTool raises none. It is not called for the retry with an answer
	// to the tool's own suspension.
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
	// Passed are the keys of the gates that approved the call so far (state.Gate.Key).
	Passed []string
	// URL and Remote say what the tool reaches, whatever it is called (tools.Tool).
	URL, Remote string
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
// result (BeforeTool: short-circuit; AfterTool: transform). Gate describes the gate a pending
// Result of BeforeTool raises; it is saved with the call (a nil Gate has the empty key).
type ToolOverride struct {
	Args   map[string]any
	Result *tools.ToolResult
	Gate   *state.Gate
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
	// Waiting says the call waits on external work it started or looked at (an MCP task); Poll
	// says this execution was a look at that work, not the call itself.
	Waiting bool
	Poll    bool
}

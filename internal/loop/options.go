package loop

import (
	"context"
	"net/http"
	"time"

	"github.com/toolnexus/operator/internal/tools"
)

// Model styles.
const (
	StyleOpenAI    = "openai"
	StyleAnthropic = "anthropic"
)

// Defaults, as toolnexus.
const (
	DefaultMaxTurns  = 10
	DefaultRetries   = 2
	DefaultRetryBase = 500 * time.Millisecond
	// DefaultMaxToolCallsPerTurn bounds the calls of one model turn that run; the model is told
	// about the others.
	DefaultMaxToolCallsPerTurn = 64
	// DefaultMaxParallelTools bounds how many calls of one turn run at once.
	DefaultMaxParallelTools = 8
)

var defaultBaseURL = map[string]string{
	StyleOpenAI:    "https://api.openai.com/v1",
	StyleAnthropic: "https://api.anthropic.com",
}

// Options configure a Client.
type Options struct {
	// BaseURL of the endpoint; defaults to the style's public API.
	BaseURL string
	// Style is StyleOpenAI (default) or StyleAnthropic.
	Style string
	// Model is the model id, sent verbatim. Required.
	Model string
	// APIKey is sent as a Bearer token (openai) or x-api-key (anthropic). Empty sends none: unlike
	// toolnexus there is no environment fallback, so a run can only use the key it was given.
	APIKey       string
	SystemPrompt string
	// MaxTurns bounds the model turns; 0 means DefaultMaxTurns.
	MaxTurns int
	Hooks    Hooks
	// WaitFor resolves a suspension in process (Run only). It may be called concurrently, once per
	// suspended call. Nil makes Run return StatusPending instead.
	WaitFor func(ctx context.Context, req tools.Request) (tools.Answer, error)
	// Retries is how many times Run retries a transient model error: 0 means DefaultRetries, -1
	// none. Step never retries; its caller requeues.
	Retries int
	// RetryBase is the first backoff delay, doubled per retry; 0 means DefaultRetryBase.
	RetryBase time.Duration
	// RequestTimeout bounds one model request; 0 means no bound beyond the context.
	RequestTimeout time.Duration
	// HTTPClient carries model requests; nil means a new http.Client.
	HTTPClient *http.Client
	// IdempotencyPrefix prefixes each tool call's IdempotencyKey (the controller uses the run UID).
	IdempotencyPrefix string
	// OnEvent receives an Event per model request and per tool execution, from the goroutine that
	// called Step or Run.
	OnEvent func(Event)
	// Clock measures event durations and stamps expiries; nil means time.Now.
	Clock func() time.Time
	// SuspensionTimeout, when positive, sets the expiry of a suspension whose tool gave none, and
	// is the latest a tool's own expiry may be: a later one is cut to now + SuspensionTimeout.
	SuspensionTimeout time.Duration
	// MaxToolCallsPerTurn bounds the calls of one model turn that run; 0 means
	// DefaultMaxToolCallsPerTurn. The others get an error result naming the limit.
	MaxToolCallsPerTurn int
	// MaxParallelTools bounds how many calls of one turn run at once; 0 means
	// DefaultMaxParallelTools.
	MaxParallelTools int
	// Tracer wraps model requests and tool executions in spans; nil traces nothing.
	Tracer Tracer
}

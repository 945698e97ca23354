// Package loop is the toolnexus agent loop: model turn → tool calls → results → next turn. It is
// built as a durable step machine (State, Step, State.Answer) that a controller persists between
// steps; Run drives the same machine in process, resolving suspensions with WaitFor. No
// Kubernetes imports.
package loop

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
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

// Client runs the loop against one model endpoint. It holds no per-run state, so one Client can
// serve any number of runs and a run can move between Clients.
type Client struct {
	opts  Options
	model model
	now   func() time.Time
	// sleep waits between Run's retries; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error
}

// New validates opts and builds a Client.
func New(opts Options) (*Client, error) {
	if opts.Style == "" {
		opts.Style = StyleOpenAI
	}
	base, ok := defaultBaseURL[opts.Style]
	if !ok {
		return nil, fmt.Errorf("loop: unknown model style %q: use %q or %q", opts.Style, StyleOpenAI, StyleAnthropic)
	}
	if opts.Model == "" {
		return nil, fmt.Errorf("loop: Options.Model is required")
	}
	switch {
	case opts.MaxTurns < 0:
		return nil, fmt.Errorf("loop: Options.MaxTurns is %d, want 0 (default %d) or more", opts.MaxTurns, DefaultMaxTurns)
	case opts.MaxTurns == 0:
		opts.MaxTurns = DefaultMaxTurns
	}
	switch {
	case opts.Retries < -1:
		return nil, fmt.Errorf("loop: Options.Retries is %d, want -1 (none), 0 (default %d) or more", opts.Retries, DefaultRetries)
	case opts.Retries == 0:
		opts.Retries = DefaultRetries
	case opts.Retries == -1:
		opts.Retries = 0
	}
	if opts.RetryBase <= 0 {
		opts.RetryBase = DefaultRetryBase
	}
	if opts.MaxToolCallsPerTurn <= 0 {
		opts.MaxToolCallsPerTurn = DefaultMaxToolCallsPerTurn
	}
	if opts.MaxParallelTools <= 0 {
		opts.MaxParallelTools = DefaultMaxParallelTools
	}
	if opts.BaseURL == "" {
		opts.BaseURL = base
	}
	opts.BaseURL = strings.TrimRight(opts.BaseURL, "/")
	if u, err := url.Parse(opts.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("loop: Options.BaseURL %q is not an http(s) URL", opts.BaseURL)
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{}
	}
	c := &Client{opts: opts, now: opts.Clock, sleep: sleepCtx}
	if c.now == nil {
		c.now = time.Now
	}
	doer := wireDoer{client: opts.HTTPClient, apiKey: opts.APIKey}
	if opts.Style == StyleAnthropic {
		c.model = newAnthropicModel(opts, doer)
	} else {
		c.model = newOpenAIModel(opts, doer)
	}
	return c, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (c *Client) emit(ev Event) {
	if c.opts.OnEvent != nil {
		c.opts.OnEvent(ev)
	}
}

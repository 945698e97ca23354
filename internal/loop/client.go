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
)

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

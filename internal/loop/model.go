package loop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/toolnexus/operator/internal/tools"
)

// model is one wire style. It translates the provider-neutral request and response; everything
// else (timeouts, errors, events, hooks) is shared.
type model interface {
	complete(ctx context.Context, req modelRequest) (modelResponse, error)
}

type modelRequest struct {
	Model    string
	System   string
	Messages []Message
	Tools    []tools.Tool
}

type modelResponse struct {
	Text      string
	ToolCalls []MessageToolCall
	Usage     Usage
	// Model is the model the endpoint says answered, FinishReason why it stopped (for traces).
	Model, FinishReason string
}

// callModel sends one request, once. It bounds it by RequestTimeout, reports an LLM event and
// returns the raw response body when AfterLLM wants it (nil otherwise: it is let go of once
// decoded).
func (c *Client) callModel(ctx context.Context, req modelRequest) (modelResponse, []byte, error) {
	ctx, endSpan := c.traceModel(ctx, req)
	ex := &exchange{keep: c.opts.Hooks.AfterLLM != nil}
	reqCtx := withExchange(ctx, ex)
	if c.opts.RequestTimeout > 0 {
		var cancel context.CancelFunc
		reqCtx, cancel = context.WithTimeout(reqCtx, c.opts.RequestTimeout)
		defer cancel()
	}
	start := c.now()
	resp, err := c.model.complete(reqCtx, req)
	if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		// Only our per-request bound expired: to the caller that is a slow endpoint, retryable.
		err = &networkError{err: fmt.Errorf("no answer within %s", c.opts.RequestTimeout)}
	}
	ev := Event{Kind: EventLLM, Model: req.Model, Duration: c.now().Sub(start), StatusCode: ex.status, OK: err == nil}
	if err == nil {
		ev.PromptTokens, ev.CompletionTokens = resp.Usage.PromptTokens, resp.Usage.CompletionTokens
	}
	c.emit(ev)
	endSpan(resp, err)
	return resp, ex.body, err
}

// rawPayload decodes the response body for AfterLLM; the body was validated as JSON by the doer.
func rawPayload(body []byte) map[string]any {
	var m map[string]any
	_ = json.Unmarshal(body, &m)
	return m
}

package loop

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/toolnexus/operator/internal/tools"
)

// outcome is what executing one call produced; runCalls applies it to the state afterwards, so
// the goroutines never write to the state.
type outcome struct {
	result tools.ToolResult
	// args is set when BeforeTool rewrote the arguments.
	args  map[string]any
	gated bool
	event Event
	err   error
}

// runCalls executes every queued and answered call of the turn concurrently, then records the
// outcomes; once every call is done, the turn's results join the transcript.
func (c *Client) runCalls(ctx context.Context, st *State, tk *tools.Toolkit) ([]Call, error) {
	turn := st.Turn - 1 // hooks see the 0-based turn that requested the calls
	outs := make([]*outcome, len(st.Calls))
	var wg sync.WaitGroup
	for i, call := range st.Calls {
		switch call.Phase {
		case PhaseQueued:
			wg.Go(func() { outs[i] = c.executeFirst(ctx, call, tk, turn) })
		case PhaseAnswered:
			wg.Go(func() { outs[i] = c.executeWithAnswer(ctx, call, tk, turn) })
		}
	}
	wg.Wait()
	for _, o := range outs {
		if o != nil && o.err != nil {
			return nil, o.err // a hook error aborts the run; st is untouched
		}
	}
	var suspended []Call
	for i, o := range outs {
		if o == nil {
			continue
		}
		c.emit(o.event)
		call := &st.Calls[i]
		if req := tools.PendingOf(o.result); req != nil {
			if req.ID == "" {
				req.ID = "pending:" + call.ID // the answer must be able to echo it
			}
			call.Phase, call.Request, call.Args, call.Gated = PhaseSuspended, req, o.args, o.gated
			suspended = append(suspended, *call)
			continue
		}
		res := o.result
		call.Phase, call.Result = PhaseDone, &res
	}
	if st.allDone() {
		c.recordTurn(st)
	}
	return suspended, nil
}

// executeFirst runs a queued call: BeforeTool, the tool, AfterTool. A suspension, from the tool or
// from BeforeTool, is returned as is for runCalls to park.
func (c *Client) executeFirst(ctx context.Context, call Call, tk *tools.Toolkit, turn int) *outcome {
	start := c.now()
	tool, known := tk.Lookup(call.Name)
	ev := Event{Kind: EventTool, Tool: call.Name, Source: tool.Source}
	finish := func(o *outcome) *outcome {
		ev.Duration = c.now().Sub(start)
		ev.Pending = tools.PendingOf(o.result) != nil
		ev.IsError = o.result.IsError && !ev.Pending
		o.event = ev
		return o
	}
	if !known {
		// No hook runs for a tool that does not exist: there is nothing to gate or transform.
		return finish(&outcome{result: tk.Execute(ctx, call.Name, nil, nil)})
	}
	args, err := parseArgs(call.Arguments)
	if err != nil {
		return finish(&outcome{result: tools.ToolResult{Output: fmt.Sprintf("invalid JSON arguments for %s: %v", call.Name, err), IsError: true}})
	}
	o := &outcome{}
	if h := c.opts.Hooks.BeforeTool; h != nil {
		ov, err := h(ctx, BeforeToolEvent{Name: call.Name, Args: args, ID: call.ID, Turn: turn})
		if err != nil {
			return &outcome{err: fmt.Errorf("loop: BeforeTool hook for %s: %w", call.Name, err)}
		}
		if ov != nil && ov.Args != nil {
			args, o.args = ov.Args, ov.Args
		}
		if ov != nil && ov.Result != nil {
			o.result = *ov.Result
			o.gated = tools.PendingOf(o.result) != nil
			return finish(o)
		}
	}
	o.result = tk.Execute(ctx, call.Name, args, &tools.ToolContext{CallID: call.ID, IdempotencyKey: c.idempotencyKey(call.ID)})
	if tools.PendingOf(o.result) != nil {
		return finish(o)
	}
	o.result, o.err = c.afterTool(ctx, call, args, o.result, turn)
	return finish(o)
}

// executeWithAnswer runs an answered call once more with the answer attached (for a gated call,
// for the first time). BeforeTool is not re-entered: the answer is the approval. As in toolnexus
// Go, AfterTool sees the retry's result; a result that still suspends then becomes
// "unresolved: <prompt>", so a call is never parked twice.
func (c *Client) executeWithAnswer(ctx context.Context, call Call, tk *tools.Toolkit, turn int) *outcome {
	start := c.now()
	tool, _ := tk.Lookup(call.Name)
	args := call.Args
	if args == nil {
		args, _ = parseArgs(call.Arguments) // it parsed before the call suspended
	}
	tc := &tools.ToolContext{CallID: call.ID, IdempotencyKey: c.idempotencyKey(call.ID) + "/answer", Answer: call.Answer}
	res := tk.Execute(ctx, call.Name, args, tc)
	ev := Event{Kind: EventTool, Tool: call.Name, Source: tool.Source, Duration: c.now().Sub(start)}
	ev.Pending = tools.PendingOf(res) != nil
	ev.IsError = res.IsError && !ev.Pending
	res, err := c.afterTool(ctx, call, args, res, turn)
	if tools.PendingOf(res) != nil {
		res = tools.ToolResult{Output: "unresolved: " + call.Request.Prompt, IsError: true}
	}
	return &outcome{result: res, event: ev, err: err}
}

func (c *Client) afterTool(ctx context.Context, call Call, args map[string]any, res tools.ToolResult, turn int) (tools.ToolResult, error) {
	h := c.opts.Hooks.AfterTool
	if h == nil {
		return res, nil
	}
	ov, err := h(ctx, AfterToolEvent{Name: call.Name, Args: args, Result: res, ID: call.ID, Turn: turn})
	if err != nil {
		return res, fmt.Errorf("loop: AfterTool hook for %s: %w", call.Name, err)
	}
	if ov != nil && ov.Result != nil {
		return *ov.Result, nil
	}
	return res, nil
}

func (c *Client) idempotencyKey(callID string) string {
	if c.opts.IdempotencyPrefix == "" {
		return callID
	}
	return c.opts.IdempotencyPrefix + "/" + callID
}

// parseArgs decodes the model's arguments. Empty text means no arguments (some models send "" for
// a tool without parameters); anything but a JSON object is an error the model gets to see.
func parseArgs(raw string) (map[string]any, error) {
	if strings.TrimSpace(raw) == "" {
		return map[string]any{}, nil
	}
	var v any
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return nil, err
	}
	switch m := v.(type) {
	case map[string]any:
		return m, nil
	case nil:
		return map[string]any{}, nil
	}
	return nil, fmt.Errorf("arguments are %s, want a JSON object", jsonKind(v))
}

func jsonKind(v any) string {
	switch v.(type) {
	case []any:
		return "an array"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	}
	return "a number"
}

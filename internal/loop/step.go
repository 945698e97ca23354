package loop

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// MaxCallIDLen bounds a tool call id; a longer one from the model is replaced.
const MaxCallIDLen = 128

// StepResult says what one Step did.
type StepResult struct {
	Action Action
	// Suspended are the suspensions this step raised, in call order.
	Suspended []Call
}

// Step advances st by exactly one unit of work, the one st.Next names: one model request (a single
// attempt; the caller retries what Retryable allows), or one round of tool executions. The caller
// persists st after every Step. On error st is unchanged, so the step can be repeated.
func (c *Client) Step(ctx context.Context, st *State, tk *tools.Toolkit) (StepResult, error) {
	switch act := st.Next(); act {
	case ActionModelTurn:
		return StepResult{Action: act}, c.modelTurn(ctx, st, tk)
	case ActionToolCalls:
		suspended, err := c.runCalls(ctx, st, tk)
		return StepResult{Action: act, Suspended: suspended}, err
	default:
		return StepResult{Action: act}, nil
	}
}

// StepUntilSaved takes the steps st allows in one go, for a caller that persists st in between
// (the controller's executor): the tool calls of the turn and then the next model turn. It stops
// after a model turn that asks for tool calls, so that the turn is saved before they run; when the
// run waits (a suspension) or has ended; and before a model turn once the transcript's texts
// outgrow maxTranscript bytes, so that the save ends the run instead of the transcript going to
// the model. On error st keeps the steps taken before it.
func (c *Client) StepUntilSaved(ctx context.Context, st *State, tk *tools.Toolkit, maxTranscript int) error {
	for {
		next := st.Next()
		if next != ActionModelTurn && next != ActionToolCalls {
			return nil
		}
		if next == ActionModelTurn && transcriptSize(st) > maxTranscript {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		res, err := c.Step(ctx, st, tk)
		if err != nil {
			return err
		}
		if res.Action == ActionModelTurn && st.Next() == ActionToolCalls {
			return nil
		}
	}
}

// transcriptSize is what the transcript's texts add up to: a lower bound of its encoded size.
func transcriptSize(st *State) int {
	n := 0
	for _, m := range st.Messages {
		n += len(m.Content)
		for _, tc := range m.ToolCalls {
			n += len(tc.Arguments)
		}
	}
	return n
}

func (c *Client) modelTurn(ctx context.Context, st *State, tk *tools.Toolkit) error {
	if st.Turn >= c.opts.MaxTurns {
		// Reached only when MaxTurns shrank between processes; the tool step normally ends the run.
		c.finishIncomplete(st)
		return nil
	}
	req := modelRequest{Model: c.opts.Model, System: c.opts.SystemPrompt, Messages: st.Messages, Tools: tk.Tools()}
	if h := c.opts.Hooks.BeforeLLM; h != nil {
		ov, err := h(ctx, BeforeLLMEvent{Messages: append([]Message(nil), req.Messages...), Tools: req.Tools, Model: req.Model, Turn: st.Turn})
		if err != nil {
			return fmt.Errorf("loop: BeforeLLM hook: %w", err)
		}
		if ov != nil {
			if ov.Messages != nil {
				req.Messages = ov.Messages
			}
			if ov.Tools != nil {
				req.Tools = ov.Tools
			}
			if ov.Model != "" {
				req.Model = ov.Model
			}
		}
	}
	resp, raw, err := c.callModel(ctx, req)
	if err != nil {
		return err
	}
	if h := c.opts.Hooks.AfterLLM; h != nil {
		if err := h(ctx, AfterLLMEvent{Response: rawPayload(raw), Model: req.Model, Turn: st.Turn}); err != nil {
			return fmt.Errorf("loop: AfterLLM hook: %w", err)
		}
	}
	// Some OpenAI-compatible servers omit ids, and a confused or hostile model may repeat one or send
	// one of any length; a call needs a unique, bounded id for its result and its PendingRequest,
	// the same in the transcript and in st.Calls.
	seen := make(map[string]bool, len(resp.ToolCalls))
	for i := range resp.ToolCalls {
		for n := 0; resp.ToolCalls[i].ID == "" || seen[resp.ToolCalls[i].ID] || len(resp.ToolCalls[i].ID) > MaxCallIDLen; n++ {
			resp.ToolCalls[i].ID = fmt.Sprintf("call_%d_%d", st.Turn+1, i+1)
			if n > 0 {
				resp.ToolCalls[i].ID += fmt.Sprintf("_%d", n)
			}
		}
		seen[resp.ToolCalls[i].ID] = true
	}
	// Commit only now, so a failed request or hook leaves st as it was.
	st.Messages = append(req.Messages, Message{Role: RoleAssistant, Content: resp.Text, ToolCalls: resp.ToolCalls})
	st.Turn++
	st.Usage.Add(resp.Usage)
	st.Model = req.Model
	st.ModelFailures = 0
	if len(resp.ToolCalls) == 0 {
		st.Status, st.Text = StatusDone, resp.Text
		return nil
	}
	st.Calls = make([]Call, len(resp.ToolCalls))
	for i, tc := range resp.ToolCalls {
		st.Calls[i] = Call{ID: tc.ID, Name: tc.Name, Arguments: tc.Arguments, Phase: PhaseQueued}
		if i >= c.opts.MaxToolCallsPerTurn {
			// Every call gets a result, so the transcript stays balanced; these never run.
			st.Calls[i].Phase = PhaseDone
			st.Calls[i].Result = &tools.ToolResult{IsError: true, Output: fmt.Sprintf(
				"not executed: the turn asked for %d tool calls and at most %d run per turn; call fewer tools at once",
				len(resp.ToolCalls), c.opts.MaxToolCallsPerTurn)}
		}
	}
	return nil
}

// recordTurn appends the results of a turn whose calls are all done, in the model's call order.
func (c *Client) recordTurn(st *State) {
	for _, call := range st.Calls {
		st.Messages = append(st.Messages, Message{Role: RoleTool, ToolCallID: call.ID, Content: call.Result.Output, IsError: call.Result.IsError})
		st.ToolCalls = append(st.ToolCalls, ToolCall{ID: call.ID, Name: call.Name, Arguments: call.Arguments,
			Output: call.Result.Output, IsError: call.Result.IsError, Turn: st.Turn})
		if call.Wait != nil {
			st.Abandoned = append(st.Abandoned, call.Wait.Wait)
		}
	}
	st.ToolCallCount += len(st.Calls)
	st.Calls = nil
	if st.Turn >= c.opts.MaxTurns {
		c.finishIncomplete(st)
	}
}

// finishIncomplete ends a run that used its turns and still wanted tools, as toolnexus: the text
// is whatever the last assistant message said.
func (c *Client) finishIncomplete(st *State) {
	st.Status, st.Limit = StatusIncomplete, LimitMaxTurns
	for i := len(st.Messages) - 1; i >= 0; i-- {
		if st.Messages[i].Role == RoleAssistant {
			st.Text = st.Messages[i].Content
			return
		}
	}
}

// MaxShownArguments bounds the arguments of a call that waits for an answer: its answerer must see
// them whole (a PendingRequest shows at most this much), since the retry runs with exactly them.
const MaxShownArguments = wire.MaxArgumentsBytes

// execution is what executing one call produced; runCalls applies it to the state afterwards, so
// the goroutines never write to the state.
type execution struct {
	result tools.ToolResult
	// args are the arguments the call ran with (after BeforeTool).
	args  map[string]any
	gated bool
	// gate is the gate a gated suspension waits on, and passed the gates the call passed before it.
	gate   *state.Gate
	passed []string
	// retried is set when the call ran with its own answer: a suspension then is unresolved.
	retried bool
	// polled is set when the execution looked at the work the call waits on, and abandoned when the
	// call stops waiting on work that may still go on (its holder is told to stop it).
	polled, abandoned bool
	event             Event
	err               error
}

// runCalls executes every queued and answered call of the turn, at most Options.MaxParallelTools
// at once, then records the outcomes; once every call is done, the turn's results join the
// transcript.
func (c *Client) runCalls(ctx context.Context, st *State, tk *tools.Toolkit) ([]Call, error) {
	turn := st.Turn - 1 // hooks see the 0-based turn that requested the calls
	outs := make([]*execution, len(st.Calls))
	var wg sync.WaitGroup
	slots := make(chan struct{}, c.opts.MaxParallelTools)
	for i, call := range st.Calls {
		var run func(context.Context) *execution
		switch call.Phase {
		case PhaseQueued:
			run = func(ctx context.Context) *execution { return c.executeFirst(ctx, call, tk, turn) }
		case PhaseAnswered:
			run = func(ctx context.Context) *execution { return c.executeWithAnswer(ctx, call, tk, turn) }
		case PhaseWaiting:
			if !call.Wait.Due {
				continue
			}
			run = func(ctx context.Context) *execution { return c.executeWait(ctx, call, tk, turn) }
		default:
			continue
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			outs[i] = c.traceTool(ctx, call, tk, run)
		})
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
		if sc, ok := c.suspend(call, o); ok {
			*call = sc
			suspended = append(suspended, sc)
			continue
		}
		res := o.result
		call.Phase, call.Result = PhaseDone, &res
		if !o.abandoned {
			// The work ended with this result: nothing is left to stop.
			call.Wait = nil
		}
	}
	if st.AllDone() {
		c.recordTurn(st)
	}
	return suspended, nil
}

// suspend returns call parked on the suspension o raised, or false when o is a result: o did not
// suspend, or suspending is not allowed (a retry that suspends again is unresolved, and a
// suspension no PendingRequest could hold cannot wait, see holdable).
func (c *Client) suspend(call *Call, o *execution) (Call, bool) {
	if w := tools.WaitOf(o.result); w != nil {
		return c.wait(call, o, w)
	}
	if r := tools.RoundOf(o.result); r != nil && !o.gated {
		return c.askRound(call, o, r)
	}
	req := tools.PendingOf(o.result)
	if req == nil {
		return Call{}, false
	}
	if o.retried && !asksAnew(call, req) {
		o.result = tools.ToolResult{Output: "unresolved: " + call.Request.Prompt, IsError: true}
		return Call{}, false
	}
	if req.ID == "" {
		req.ID = "pending:" + call.ID // the answer must be able to echo it
	}
	args, err := c.holdable(call.Name, req, o.args)
	if err != nil {
		o.result = tools.ToolResult{Output: fmt.Sprintf("%s cannot wait for an answer: %v", call.Name, err), IsError: true}
		return Call{}, false
	}
	next := Call{ID: call.ID, Name: call.Name, Arguments: call.Arguments, Args: string(args),
		Phase: PhaseSuspended, Request: req, Gated: o.gated, Approval: call.Approval, Passed: call.Passed, Wait: call.Wait}
	switch {
	case o.gated:
		next.Gate, next.Passed = o.gate, o.passed
	case call.Gated:
		// The approved tool ran for the first time and suspended on its own: a new suspension.
		next.Approval, next.Passed = call.Answer, passedWith(*call)
	}
	return next, true
}

// holdable checks that a PendingRequest can hold the suspension req of the tool name called with
// args, and returns the arguments as the request shows them. The API server would refuse one past
// its bounds, and the call would never get an answer; the model is told instead. It also settles
// req's expiry (see expiry).
func (c *Client) holdable(name string, req *tools.Request, args map[string]any) ([]byte, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	if len(raw) > MaxShownArguments {
		return nil, fmt.Errorf("its arguments (%d bytes) exceed the %d bytes an answerer can be shown", len(raw), MaxShownArguments)
	}
	if n := utf8.RuneCountInString(name); n > wire.MaxToolNameLen {
		return nil, fmt.Errorf("its name is %d characters; at most %d fit", n, wire.MaxToolNameLen)
	}
	if err := req.CheckBounds(); err != nil {
		return nil, err
	}
	if req.ExpiresAt, err = c.expiry(req.ExpiresAt); err != nil {
		return nil, err
	}
	return raw, nil
}

// expiry is when a suspension whose tool asked for own ("" for none) expires, in UTC RFC 3339
// with seconds, or "" for never. A tool may shorten the run's SuspensionTimeout, never lengthen
// it: the timeout is the run author's promise of how long a request stays answerable.
func (c *Client) expiry(own string) (string, error) {
	var limit time.Time
	if c.opts.SuspensionTimeout > 0 {
		limit = c.now().Add(c.opts.SuspensionTimeout)
	}
	if own == "" {
		if limit.IsZero() {
			return "", nil
		}
		return limit.UTC().Format(time.RFC3339), nil
	}
	t, err := time.Parse(time.RFC3339, own)
	if err != nil {
		return "", fmt.Errorf("its expiresAt %q is not an RFC 3339 time such as 2026-12-01T00:00:00Z", own)
	}
	if !limit.IsZero() && t.After(limit) {
		t = limit
	}
	return t.UTC().Format(time.RFC3339), nil
}

// executeFirst runs a queued call: BeforeTool, the tool, AfterTool. A suspension, from the tool or
// from BeforeTool, is returned as is for runCalls to park.
func (c *Client) executeFirst(ctx context.Context, call Call, tk *tools.Toolkit, turn int) *execution {
	start := c.now()
	tool, known := tk.Lookup(call.Name)
	ev := Event{Kind: EventTool, Tool: call.Name, Source: tool.Source}
	finish := func(o *execution) *execution {
		ev.Duration = c.now().Sub(start)
		ev.Pending = tools.PendingOf(o.result) != nil
		ev.Waiting = tools.WaitOf(o.result) != nil
		ev.IsError = o.result.IsError && !ev.Pending && !ev.Waiting
		o.event = ev
		return o
	}
	if !known {
		// No hook runs for a tool that does not exist: there is nothing to gate or transform.
		return finish(&execution{result: tk.Execute(ctx, call.Name, nil, nil)})
	}
	args, err := parseArgs(call.Arguments)
	if err != nil {
		return finish(&execution{result: tools.ToolResult{Output: fmt.Sprintf("invalid JSON arguments for %s: %v", call.Name, err), IsError: true}})
	}
	o := &execution{}
	if h := c.opts.Hooks.BeforeTool; h != nil {
		ov, err := h(ctx, BeforeToolEvent{Name: call.Name, Args: args, ID: call.ID, Turn: turn, URL: tool.URL, Remote: tool.Remote})
		if err != nil {
			return &execution{err: fmt.Errorf("loop: BeforeTool hook for %s: %w", call.Name, err)}
		}
		if ov != nil && ov.Args != nil {
			args = ov.Args
		}
		if ov != nil && ov.Result != nil {
			o.result, o.args = *ov.Result, args
			o.gated = tools.PendingOf(o.result) != nil
			o.gate = ov.Gate
			return finish(o)
		}
	}
	o.args = args
	o.result = tk.Execute(ctx, call.Name, args, &tools.ToolContext{CallID: call.ID, IdempotencyKey: c.idempotencyKey(call.ID)})
	if tools.PendingOf(o.result) != nil || tools.WaitOf(o.result) != nil {
		return finish(o)
	}
	o.result, o.err = c.afterTool(ctx, call, args, o.result, turn)
	return finish(o)
}

// executeWithAnswer runs an answered call with its answer attached and exactly the arguments its
// answerer was shown. BeforeTool is not re-entered: the answer is the approval. For a gated call
// this is the tool's first run, and a suspension then is the tool's own, returned as is; otherwise
// it is the retry, and as in toolnexus Go AfterTool sees its result, which runCalls turns into
// "unresolved: <prompt>" if it still suspends, so a suspension is never parked twice.
func (c *Client) executeWithAnswer(ctx context.Context, call Call, tk *tools.Toolkit, turn int) *execution {
	start := c.now()
	tool, _ := tk.Lookup(call.Name)
	o := &execution{retried: !call.Gated}
	if err := json.Unmarshal([]byte(call.Args), &o.args); err != nil || o.args == nil {
		// Only a damaged state lacks them: the call parked with its arguments.
		o.result = tools.ToolResult{Output: fmt.Sprintf("%s: the arguments it was answered for are unreadable", call.Name), IsError: true}
		return o
	}
	if call.Gated {
		if next := c.nextGate(ctx, call, tool, o.args, turn); next != nil {
			if next.err == nil && tools.PendingOf(next.result) == nil {
				// BeforeTool answered for the tool (a gate that refuses the call): its result is final.
				next.result, next.err = c.afterTool(ctx, call, o.args, next.result, turn)
			}
			next.event = Event{Kind: EventTool, Tool: call.Name, Source: tool.Source, Duration: c.now().Sub(start),
				Pending: next.gated, IsError: next.result.IsError && !next.gated}
			return next
		}
	}
	key := c.idempotencyKey(call.ID)
	if o.retried {
		key += "/answer"
	}
	tc := &tools.ToolContext{CallID: call.ID, IdempotencyKey: key, Answer: call.Answer}
	if call.Wait != nil {
		// The answer is for the work the call waits on: the tool hands it there.
		h := call.Wait.Wait
		tc.Wait = &h
	}
	if call.Round != nil {
		tc.Answer, tc.Round = nil, roundOf(call)
	}
	o.result = tk.Execute(ctx, call.Name, o.args, tc)
	o.event = Event{Kind: EventTool, Tool: call.Name, Source: tool.Source, Duration: c.now().Sub(start)}
	o.event.Pending = tools.PendingOf(o.result) != nil
	o.event.Waiting = tools.WaitOf(o.result) != nil
	o.event.IsError = o.result.IsError && !o.event.Pending && !o.event.Waiting
	if (o.event.Pending && (call.Gated || call.Wait != nil || call.Round != nil)) || o.event.Waiting {
		return o
	}
	o.result, o.err = c.afterTool(ctx, call, o.args, o.result, turn)
	return o
}

// nextGate asks BeforeTool whether a call that a gate just approved must pass another one. It
// returns nil when none is raised and the tool may run, or the execution that stops it: a new
// gated suspension, a result that replaces the tool's, or a hook error.
func (c *Client) nextGate(ctx context.Context, call Call, tool tools.Tool, args map[string]any, turn int) *execution {
	h := c.opts.Hooks.BeforeTool
	if h == nil {
		return nil
	}
	passed := passedWith(call)
	ov, err := h(ctx, BeforeToolEvent{Name: call.Name, Args: args, ID: call.ID, Turn: turn, Passed: passed, URL: tool.URL, Remote: tool.Remote})
	if err != nil {
		return &execution{err: fmt.Errorf("loop: BeforeTool hook for %s: %w", call.Name, err)}
	}
	if ov == nil || ov.Result == nil {
		return nil
	}
	o := &execution{result: *ov.Result, args: args, passed: passed}
	if tools.PendingOf(o.result) != nil {
		o.gated, o.gate = true, ov.Gate
	}
	return o
}

// passedWith is the gates a gated call has passed once the gate it waits on approved.
func passedWith(call Call) []string {
	key := ""
	if call.Gate != nil {
		key = call.Gate.Key
	}
	return append(append([]string(nil), call.Passed...), key)
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

package loop

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// A call that hands its work to someone else (tools.Waiting: an MCP task today) waits on it
// without a connection or a worker: the call is parked in the state with the work's handle, and
// the host takes a step when a look is due (state.Settle says when), in which the tool is asked
// again with the handle. What the holder says about when to look again is bounded here, and so is
// how long a call waits: a holder that never finishes, or cannot be reached, ends the call with an
// error result the model sees.

const (
	// MinPollInterval and MaxPollInterval bound the holder's pollIntervalMs: 0 or a missing value
	// looks again after MinPollInterval, a day after MaxPollInterval.
	MinPollInterval = time.Second
	MaxPollInterval = time.Minute
	// MaxPollFailures is how many looks in a row may fail (the holder unreachable, a transient
	// error) before the call stops waiting; the failures back off from the poll interval.
	MaxPollFailures = 8
	// DefaultWaitTimeout bounds a wait when the run has no SuspensionTimeout: a wait is a
	// suspension on a machine instead of a person, and the run's suspension timeout, when set,
	// bounds both.
	DefaultWaitTimeout = 24 * time.Hour
)

// executeWait looks at the work a waiting call waits on, asking its tool again with the handle.
// BeforeTool is not re-entered: the call passed its gates when it started the work. A tool that is
// not available now (its MCP server unreachable) is a failed look, not the call's result.
func (c *Client) executeWait(ctx context.Context, call Call, tk *tools.Toolkit, turn int) *execution {
	start := c.now()
	tool, known := tk.Lookup(call.Name)
	o := &execution{polled: true}
	if err := json.Unmarshal([]byte(call.Args), &o.args); err != nil || o.args == nil {
		o.result, o.abandoned = tools.ToolResult{Output: fmt.Sprintf("%s: the arguments it waits with are unreadable", call.Name), IsError: true}, true
		return o
	}
	h := call.Wait.Wait
	h.PollError = ""
	if known {
		o.result = tk.Execute(ctx, call.Name, o.args, &tools.ToolContext{CallID: call.ID, IdempotencyKey: c.idempotencyKey(call.ID), Wait: &h})
	} else {
		h.PollError = "the tool is not available now: " + tk.Execute(ctx, call.Name, nil, nil).Output
		o.result = tools.Waiting(h)
	}
	o.event = Event{Kind: EventTool, Tool: call.Name, Source: tool.Source, Duration: c.now().Sub(start), Poll: true}
	o.event.Pending = tools.PendingOf(o.result) != nil
	o.event.Waiting = tools.WaitOf(o.result) != nil
	o.event.IsError = o.result.IsError && !o.event.Pending && !o.event.Waiting
	if o.event.Pending || o.event.Waiting {
		return o
	}
	o.result, o.err = c.afterTool(ctx, call, o.args, o.result, turn)
	return o
}

// asksAnew reports whether req, raised by the retry of call with its answer, is a new question
// rather than the same one again: only work the call waits on (an MCP task) asks in turn, and
// only a request of another id is new. Anything else is unresolved (the loop rule).
func asksAnew(call *Call, req *tools.Request) bool {
	return call.Wait != nil && call.Request != nil && req.ID != "" && req.ID != call.Request.ID
}

// wait parks call on the work w (started or looked at by o), or returns false with o's result
// made an error when the call cannot wait on it: a handle past its bounds, arguments past what
// the record holds, too many failed looks in a row.
func (c *Client) wait(call *Call, o *execution, w *tools.Wait) (Call, bool) {
	now := c.now()
	fail := func(format string, a ...any) (Call, bool) {
		o.result = tools.ToolResult{Output: fmt.Sprintf("%s cannot wait on its %s: ", call.Name, w.Kind) + fmt.Sprintf(format, a...), IsError: true}
		// A handle that came with the call's first run names work that may have started: stop it.
		o.abandoned = call.Wait != nil || checkWait(w) == nil
		return Call{}, false
	}
	if err := checkWait(w); err != nil {
		return fail("%v", err)
	}
	args, err := json.Marshal(o.args)
	if err != nil {
		return fail("%v", err)
	}
	if len(args) > MaxShownArguments {
		return fail("its arguments (%d bytes) exceed the %d bytes the record holds for a waiting call", len(args), MaxShownArguments)
	}
	handle := *w
	handle.Message = clip.Marked(handle.Message, wire.MaxWaitMessageBytes)
	handle.PollError = clip.Marked(handle.PollError, wire.MaxWaitMessageBytes)
	sw := &state.Wait{Wait: handle, Since: stamp(now), Deadline: stamp(now.Add(c.waitTimeout()))}
	if prev := call.Wait; prev != nil {
		sw.Since, sw.Deadline, sw.Polls, sw.Failures = prev.Since, prev.Deadline, prev.Polls, prev.Failures
	}
	if o.polled {
		sw.Polls++
	}
	interval := pollInterval(handle.PollIntervalMs)
	if handle.PollError != "" {
		sw.Failures++
		if sw.Failures >= MaxPollFailures {
			o.result = tools.ToolResult{Output: fmt.Sprintf("%s stopped waiting on %s %s on %s: %d looks in a row failed, the last: %s",
				call.Name, handle.Kind, handle.ID, handle.Server, sw.Failures, handle.PollError), IsError: true}
			o.abandoned = true
			return Call{}, false
		}
		interval = min(MaxPollInterval, interval<<sw.Failures)
	} else {
		sw.Failures = 0
	}
	next := now.Add(interval)
	if deadline, err := time.Parse(time.RFC3339Nano, sw.Deadline); err == nil {
		if handle.Woken && handle.PollError == "" {
			// Its host wakes the call when the work ends (state.Wake): no look is scheduled before
			// the deadline. A look that failed backs off as any other.
			next = deadline
		}
		if next.After(deadline) {
			next = deadline
		}
	}
	sw.NextPoll = stamp(next)
	return Call{ID: call.ID, Name: call.Name, Arguments: call.Arguments, Args: string(args), Phase: PhaseWaiting,
		Approval: call.Approval, Passed: call.Passed, Wait: sw}, true
}

// checkWait checks a handle a tool returned against what the record holds.
func checkWait(w *tools.Wait) error {
	switch {
	case w.Kind == "" || len(w.Kind) > 64:
		return fmt.Errorf("the handle's kind %q is empty or longer than 64 bytes", clip.Marked(w.Kind, 80))
	case w.ID == "":
		return fmt.Errorf("the %s has an empty id", w.Kind)
	case len(w.ID) > wire.MaxWaitIDBytes:
		return fmt.Errorf("the %s id is %d bytes; at most %d fit", w.Kind, len(w.ID), wire.MaxWaitIDBytes)
	case len(w.Server) > wire.MaxWaitServerBytes:
		return fmt.Errorf("the server name is %d bytes; at most %d fit", len(w.Server), wire.MaxWaitServerBytes)
	}
	return nil
}

// pollInterval bounds what the holder asked for.
func pollInterval(ms int64) time.Duration {
	if ms <= 0 || ms < MinPollInterval.Milliseconds() {
		return MinPollInterval
	}
	if ms > MaxPollInterval.Milliseconds() {
		return MaxPollInterval
	}
	return time.Duration(ms) * time.Millisecond
}

// waitTimeout is how long a call may wait on external work.
func (c *Client) waitTimeout() time.Duration {
	if c.opts.SuspensionTimeout > 0 {
		return c.opts.SuspensionTimeout
	}
	return DefaultWaitTimeout
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

package loop

import (
	"context"
	"fmt"

	"github.com/toolnexus/operator/internal/tools"
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

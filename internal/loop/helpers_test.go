package loop

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
)

// newClient builds a Client against base with test-friendly defaults; mutators adjust Options.
func newClient(t testing.TB, base string, mut ...func(*Options)) *Client {
	t.Helper()
	opts := Options{BaseURL: base, Model: "gpt-4o-mini", APIKey: "test-key"}
	for _, m := range mut {
		m(&opts)
	}
	c, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

func anthropicStyle(o *Options) { o.Style, o.Model = StyleAnthropic, "claude-test" }

func toolkit(t testing.TB, ts ...tools.Tool) *tools.Toolkit {
	t.Helper()
	tk, err := tools.NewToolkit(ts...)
	if err != nil {
		t.Fatalf("NewToolkit: %v", err)
	}
	return tk
}

// step runs one Step and fails the test on error or on an unexpected action.
func step(t testing.TB, c *Client, st *State, tk *tools.Toolkit, want Action) StepResult {
	t.Helper()
	res, err := c.Step(context.Background(), st, tk)
	if err != nil {
		t.Fatalf("Step (%s): %v", want, err)
	}
	if res.Action != want {
		t.Fatalf("Step did %s, want %s", res.Action, want)
	}
	return res
}

// roundTrip is what a controller does between steps: persist the state and load it elsewhere.
func roundTrip(t testing.TB, st *State) *State {
	t.Helper()
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatalf("marshal state: %v", err)
	}
	var fresh State
	if err := json.Unmarshal(raw, &fresh); err != nil {
		t.Fatalf("unmarshal state: %v", err)
	}
	return &fresh
}

// toolResult is a tool result as a model request carries it, whichever the style.
type toolResult struct {
	ID      string
	Content string
	IsError bool
}

// sentToolResults extracts the tool results of a recorded model request, in order.
func sentToolResults(t testing.TB, req looptest.Request) []toolResult {
	t.Helper()
	var out []toolResult
	for _, m := range req.JSON(t)["messages"].([]any) {
		msg := m.(map[string]any)
		if msg["role"] == "tool" { // openai
			content, _ := msg["content"].(string)
			out = append(out, toolResult{ID: msg["tool_call_id"].(string), Content: content})
			continue
		}
		blocks, ok := msg["content"].([]any)
		if !ok {
			continue
		}
		for _, b := range blocks { // anthropic
			block := b.(map[string]any)
			if block["type"] != "tool_result" {
				continue
			}
			r := toolResult{ID: block["tool_use_id"].(string), IsError: block["is_error"].(bool)}
			if parts, ok := block["content"].([]any); ok && len(parts) > 0 {
				r.Content = parts[0].(map[string]any)["text"].(string)
			}
			out = append(out, r)
		}
	}
	return out
}

// suspending is a native tool that suspends with req until it is retried with an answer, then
// returns answered(answer).
func suspending(name string, req tools.Request, answered func(tools.Answer) string) tools.Tool {
	return tools.NativeTool(name, "suspends once", nil, func(_ context.Context, _ map[string]any, tc *tools.ToolContext) (any, error) {
		if tc.Answer != nil {
			return answered(*tc.Answer), nil
		}
		return tools.Pending(req), nil
	})
}

// counter is a native tool that counts its runs and returns "ran <n>".
type counter struct{ runs atomic.Int32 }

func (c *counter) tool(name string) tools.Tool {
	return tools.NativeTool(name, "counts runs", nil, func(context.Context, map[string]any, *tools.ToolContext) (any, error) {
		return fmt.Sprintf("ran %d", c.runs.Add(1)), nil
	})
}

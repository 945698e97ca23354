package loop

// The client-level examples of the seed documents in reference/seeds/, ported one to one:
// ToolResult.AuthRequired example 3, LlmClient.WaitFor examples 1–3 and the part of Answer.output
// example 3 that concerns the loop. The tool-level examples are in internal/tools.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
)

// calendarTool is the seeds' read_calendar: it needs a login until it is retried with an answer.
func calendarTool() tools.Tool {
	return tools.NativeTool("read_calendar", "reads today's events", nil, func(_ context.Context, _ map[string]any, tc *tools.ToolContext) (any, error) {
		if tc.Answer != nil && tc.Answer.OK {
			return "09:00 standup, 14:00 1:1", nil
		}
		return tools.AuthRequired("https://accounts.example.com/authorize", ""), nil
	})
}

// AuthRequired, example 3: inside a real client run, WaitFor performs the "login".
func TestSeedAuthRequired3WaitForPerformsLogin(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "read_calendar", Arguments: "{}"}),
		looptest.OpenAIText("You have a 09:00 standup and a 14:00 1:1."))
	logins := 0
	c := newClient(t, srv.URL, func(o *Options) {
		o.WaitFor = func(_ context.Context, r tools.Request) (tools.Answer, error) {
			if r.Kind != tools.KindAuthorization {
				t.Errorf("unexpected kind: %s", r.Kind)
			}
			logins++ // stands in for driving an OAuth redirect/consent/callback
			return tools.Answer{ID: r.ID, OK: true}, nil
		}
	})
	res, err := c.Run(context.Background(), "what's on my calendar today?", toolkit(t, calendarTool()))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != StatusDone {
		t.Errorf("status: %s", res.Status)
	}
	if logins != 1 {
		t.Errorf("expected exactly one login, got %d", logins)
	}
	if res.Text != "You have a 09:00 standup and a 14:00 1:1." {
		t.Errorf("text: %q", res.Text)
	}
	if got := res.ToolCalls[0].Output; got != "09:00 standup, 14:00 1:1" {
		t.Errorf("the tool was not retried after the login: %q", got)
	}
}

// WaitFor, example 1: nothing suspends, so WaitFor is never called.
func TestSeedWaitFor1NotCalledWhenNothingSuspends(t *testing.T) {
	srv := looptest.New(t, looptest.OpenAIText("hello, no tools needed"))
	calls := 0
	c := newClient(t, srv.URL, func(o *Options) {
		o.WaitFor = func(_ context.Context, r tools.Request) (tools.Answer, error) {
			calls++
			return tools.Answer{ID: r.ID, OK: true}, nil
		}
	})
	res, err := c.Run(context.Background(), "say hello", toolkit(t))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != StatusDone || calls != 0 {
		t.Errorf("status %s, WaitFor calls %d; want done, 0", res.Status, calls)
	}
}

// WaitFor, example 2: without WaitFor the run halts as pending instead of hanging.
func TestSeedWaitFor2PendingNeverHangs(t *testing.T) {
	srv := looptest.New(t, looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve_purchase", Arguments: `{"item":"gpu"}`}))
	approve := tools.NativeTool("approve_purchase", "Requests spend approval", nil, func(_ context.Context, a map[string]any, tc *tools.ToolContext) (any, error) {
		if tc.Answer != nil {
			return "approved: " + a["item"].(string), nil
		}
		return tools.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "Approve purchase of " + a["item"].(string) + "?"}), nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a hang fails, not blocks
	defer cancel()
	res, err := newClient(t, srv.URL).Run(ctx, "buy a gpu", toolkit(t, approve))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != StatusPending {
		t.Fatalf("status: %s", res.Status)
	}
	if res.Pending == nil || res.Pending.Kind != tools.KindApproval {
		t.Fatalf("expected the approval Request that parked the run, got %+v", res.Pending)
	}
	if res.Text != "Approve purchase of gpu?" || res.Pending.Prompt != res.Text {
		t.Errorf("waiting on %q (text %q)", res.Pending.Prompt, res.Text)
	}
}

// WaitFor, example 3: WaitFor is called at most once per suspension; a retry that suspends again
// becomes "unresolved: <prompt>" and the run finishes.
func TestSeedWaitFor3NeverResolvesTheSameRequestTwice(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "flaky_approve", Arguments: "{}"}),
		looptest.OpenAIText("gave up after one retry"))
	flaky := tools.NativeTool("flaky_approve", "always re-suspends, even after resolution", nil,
		func(context.Context, map[string]any, *tools.ToolContext) (any, error) {
			return tools.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "approve?"}), nil
		})
	calls := 0
	c := newClient(t, srv.URL, func(o *Options) {
		o.WaitFor = func(_ context.Context, r tools.Request) (tools.Answer, error) {
			calls++
			return tools.Answer{ID: r.ID, OK: true}, nil
		}
	})
	res, err := c.Run(context.Background(), "approve this", toolkit(t, flaky))
	if err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Errorf("expected exactly 1 WaitFor call, got %d", calls)
	}
	if res.Status != StatusDone {
		t.Errorf("status: %s", res.Status)
	}
	if got := res.ToolCalls[0].Output; got != "unresolved: approve?" || !res.ToolCalls[0].IsError {
		t.Errorf("tool result: %q (isError %v)", got, res.ToolCalls[0].IsError)
	}
}

// Answer.output, example 3, as the loop enforces it: an ok answer with no output never becomes a
// fabricated tool result.
func TestSeedAnswerOutput3RequiresAResult(t *testing.T) {
	st := suspendedState(tools.Request{ID: "req-1", Kind: tools.KindInput, Prompt: "Which environment?"})
	err := st.Answer("call_1", tools.Answer{ID: "req-1", OK: true})
	if err == nil || !strings.Contains(err.Error(), "carries no result") {
		t.Fatalf("expected a rejection, got %v", err)
	}
	if err := st.Answer("call_1", tools.AnswerOutput("req-1", "ok")); err != nil {
		t.Errorf("AnswerOutput must set a recognised key: %v", err)
	}
}

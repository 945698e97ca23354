package loop

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
)

// TestDurableResumeEachKind: suspend, persist, load into a fresh State with a new Client, answer,
// step to the end. The retried tool sees the answer and its result reaches the model.
func TestDurableResumeEachKind(t *testing.T) {
	outputOf := func(a tools.Answer) string { s, _ := a.OutputOf(); return s }
	cases := []struct {
		kind   string
		req    tools.Request
		answer func(req tools.Request) tools.Answer
		// answered builds the retry's output from the answer the tool received.
		answered func(tools.Answer) string
		want     string
	}{{
		kind:     tools.KindApproval,
		req:      tools.Request{Kind: tools.KindApproval, Prompt: "Approve purchase of gpu?"},
		answer:   func(r tools.Request) tools.Answer { return tools.Answer{ID: r.ID, OK: true} },
		answered: func(a tools.Answer) string { return "approved: gpu" },
		want:     "approved: gpu",
	}, {
		kind:     tools.KindAuthorization,
		req:      tools.AuthRequired("https://accounts.example.com/authorize", "").Metadata["pending"].(tools.Request),
		answer:   func(r tools.Request) tools.Answer { return tools.Answer{OK: true} },
		answered: func(tools.Answer) string { return "09:00 standup, 14:00 1:1" },
		want:     "09:00 standup, 14:00 1:1",
	}, {
		kind:     tools.KindInput,
		req:      tools.Request{Kind: tools.KindInput, Prompt: "Which environment?"},
		answer:   func(r tools.Request) tools.Answer { return tools.AnswerOutput(r.ID, "staging") },
		answered: func(a tools.Answer) string { return "deploying to " + outputOf(a) },
		want:     "deploying to staging",
	}, {
		kind: tools.KindQuestion,
		req: tools.Request{Kind: tools.KindQuestion, Prompt: "Pick a color? (options: red, green)",
			Data: map[string]any{"questions": []any{map[string]any{"question": "Pick a color?", "options": []any{"red", "green"}}}}},
		answer: func(r tools.Request) tools.Answer {
			return tools.Answer{ID: r.ID, OK: true, Data: map[string]any{"Pick a color?": "red"}}
		},
		answered: func(a tools.Answer) string { b, _ := json.Marshal(a.Data); return string(b) },
		want:     `{"Pick a color?":"red"}`,
	}, {
		kind: tools.KindToolCall,
		req: tools.Request{Kind: tools.KindToolCall, Prompt: "relay tool call lookup to the caller for execution",
			Data: map[string]any{"calls": []any{map[string]any{"id": "call_1", "name": "lookup"}}}},
		answer:   func(r tools.Request) tools.Answer { return tools.AnswerOutput(r.ID, "42") },
		answered: outputOf,
		want:     "42",
	}}
	for _, tc := range cases {
		t.Run(tc.kind, func(t *testing.T) {
			srv := looptest.New(t,
				looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "act", Arguments: `{"item":"gpu"}`}),
				looptest.OpenAIText("finished"))
			tool := suspending("act", tc.req, tc.answered)

			first := newClient(t, srv.URL)
			st := NewState("go")
			step(t, first, st, toolkit(t, tool), ActionModelTurn)
			res := step(t, first, st, toolkit(t, tool), ActionToolCalls)
			if len(res.Suspended) != 1 || res.Suspended[0].Request.Kind != tc.kind {
				t.Fatalf("Suspended = %+v, want one %s request", res.Suspended, tc.kind)
			}
			if got := st.Next(); got != ActionWaiting {
				t.Fatalf("Next = %s, want Waiting", got)
			}

			// A new process: fresh state from JSON, new client, new toolkit.
			st = roundTrip(t, st)
			second := newClient(t, srv.URL)
			tk := toolkit(t, tool)
			open := st.Suspended()
			if err := st.Answer(open[0].ID, tc.answer(*open[0].Request)); err != nil {
				t.Fatalf("Answer: %v", err)
			}
			step(t, second, st, tk, ActionToolCalls)
			step(t, second, st, tk, ActionModelTurn)

			if st.Status != StatusDone || st.Text != "finished" {
				t.Fatalf("status %q text %q, want done/finished", st.Status, st.Text)
			}
			reqs := srv.Requests()
			want := []toolResult{{ID: "call_1", Content: tc.want}}
			if diff := cmp.Diff(want, sentToolResults(t, reqs[1])); diff != "" {
				t.Errorf("tool results sent to the model (-want +got):\n%s", diff)
			}
			wantCalls := []ToolCall{{ID: "call_1", Name: "act", Arguments: `{"item":"gpu"}`, Output: tc.want, Turn: 1}}
			if diff := cmp.Diff(wantCalls, st.ToolCalls); diff != "" {
				t.Errorf("ToolCalls (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDurableBothStyles runs the core scenario (suspend, persist, answer, finish) on both wires.
func TestDurableBothStyles(t *testing.T) {
	approve := suspending("approve_purchase", tools.Request{Kind: tools.KindApproval, Prompt: "Approve purchase of gpu?"},
		func(tools.Answer) string { return "approved: gpu" })
	call := looptest.ToolCall{ID: "toolu_1", Name: "approve_purchase", Arguments: `{"item":"gpu"}`}
	styles := []struct {
		name    string
		mut     func(*Options)
		replies []looptest.Reply
	}{
		{"openai", func(*Options) {}, []looptest.Reply{looptest.OpenAIToolCalls(call), looptest.OpenAIText("bought")}},
		{"anthropic", anthropicStyle, []looptest.Reply{looptest.AnthropicToolUse(call), looptest.AnthropicText("bought")}},
	}
	for _, s := range styles {
		t.Run(s.name, func(t *testing.T) {
			srv := looptest.New(t, s.replies...)
			tk := toolkit(t, approve)
			st := NewState("buy a gpu")
			c := newClient(t, srv.URL, s.mut)
			step(t, c, st, tk, ActionModelTurn)
			step(t, c, st, tk, ActionToolCalls)

			st = roundTrip(t, st)
			c = newClient(t, srv.URL, s.mut)
			if err := st.Answer("toolu_1", tools.Answer{OK: true}); err != nil {
				t.Fatal(err)
			}
			step(t, c, st, tk, ActionToolCalls)
			step(t, c, st, tk, ActionModelTurn)

			got := st.Result()
			want := RunResult{Text: "bought", Status: StatusDone, Turns: 2, ToolCallCount: 1, Model: c.opts.Model,
				Usage: Usage{PromptTokens: 20, CompletionTokens: 10, TotalTokens: 30}}
			if diff := cmp.Diff(want, got, ignoreTranscript); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]toolResult{{ID: "toolu_1", Content: "approved: gpu"}}, sentToolResults(t, srv.Requests()[1])); diff != "" {
				t.Errorf("tool results (-want +got):\n%s", diff)
			}
		})
	}
}

var ignoreTranscript = cmp.FilterPath(func(p cmp.Path) bool {
	f := p.Last().String()
	return f == ".Messages" || f == ".ToolCalls"
}, cmp.Ignore())

// TestTwoSuspensionsAnsweredInReverse: both suspensions of a turn are kept, answered in any order,
// the call that did not suspend is never re-run, and the next request carries all results in the
// model's call order.
func TestTwoSuspensionsAnsweredInReverse(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(
			looptest.ToolCall{ID: "call_a", Name: "ask_env", Arguments: `{}`},
			looptest.ToolCall{ID: "call_b", Name: "plain", Arguments: `{}`},
			looptest.ToolCall{ID: "call_c", Name: "approve", Arguments: `{}`}),
		looptest.OpenAIText("all set"))
	var plain counter
	tk := toolkit(t,
		suspending("ask_env", tools.Request{ID: "r-env", Kind: tools.KindInput, Prompt: "Which environment?"},
			func(a tools.Answer) string { s, _ := a.OutputOf(); return "env " + s }),
		plain.tool("plain"),
		suspending("approve", tools.Request{ID: "r-ok", Kind: tools.KindApproval, Prompt: "Approve?"},
			func(tools.Answer) string { return "approved" }))
	c := newClient(t, srv.URL)
	st := NewState("deploy")
	step(t, c, st, tk, ActionModelTurn)
	res := step(t, c, st, tk, ActionToolCalls)
	var ids []string
	for _, s := range res.Suspended {
		ids = append(ids, s.ID)
	}
	if diff := cmp.Diff([]string{"call_a", "call_c"}, ids); diff != "" {
		t.Fatalf("suspended calls (-want +got):\n%s", diff)
	}
	if got := st.Result(); got.Status != StatusPending || got.Pending.ID != "r-env" || got.Text != "Which environment?" {
		t.Fatalf("pending result = %q %+v %q, want the first request in call order", got.Status, got.Pending, got.Text)
	}

	st = roundTrip(t, st)
	if err := st.Answer("call_c", tools.Answer{ID: "r-ok", OK: true}); err != nil {
		t.Fatal(err)
	}
	step(t, c, st, tk, ActionToolCalls)
	if got := st.Next(); got != ActionWaiting {
		t.Fatalf("after one answer Next = %s, want Waiting", got)
	}
	st = roundTrip(t, st)
	if err := st.Answer("call_a", tools.AnswerOutput("r-env", "staging")); err != nil {
		t.Fatal(err)
	}
	step(t, c, st, tk, ActionToolCalls)
	step(t, c, st, tk, ActionModelTurn)

	want := []toolResult{{ID: "call_a", Content: "env staging"}, {ID: "call_b", Content: "ran 1"}, {ID: "call_c", Content: "approved"}}
	if diff := cmp.Diff(want, sentToolResults(t, srv.Requests()[1])); diff != "" {
		t.Errorf("results sent (-want +got):\n%s", diff)
	}
	if n := plain.runs.Load(); n != 1 {
		t.Errorf("the call that did not suspend ran %d times, want 1", n)
	}
	if st.Status != StatusDone || st.ToolCallCount != 3 {
		t.Errorf("status %q, toolCallCount %d; want done, 3", st.Status, st.ToolCallCount)
	}
}

func TestAnswerOutcomes(t *testing.T) {
	approval := tools.Request{Kind: tools.KindApproval, Prompt: "Approve purchase of gpu?"}
	cases := []struct {
		name   string
		tool   tools.Tool
		answer tools.Answer
		want   toolResult
	}{{
		name:   "decline with reason",
		tool:   suspending("act", approval, func(tools.Answer) string { return "must not run" }),
		answer: tools.AnswerDeclined("", "expired"),
		want:   toolResult{ID: "call_1", Content: "declined/expired: Approve purchase of gpu?\nreason: expired"},
	}, {
		name:   "decline without reason",
		tool:   suspending("act", approval, func(tools.Answer) string { return "must not run" }),
		answer: tools.Answer{OK: false},
		want:   toolResult{ID: "call_1", Content: "declined/expired: Approve purchase of gpu?"},
	}, {
		name: "re-suspension is unresolved",
		tool: tools.NativeTool("act", "always suspends", nil, func(context.Context, map[string]any, *tools.ToolContext) (any, error) {
			return tools.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "approve again?"}), nil
		}),
		answer: tools.Answer{OK: true},
		want:   toolResult{ID: "call_1", Content: "unresolved: approve again?"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := looptest.New(t,
				looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "act", Arguments: `{}`}),
				looptest.OpenAIText("ok"))
			c, tk, st := newClient(t, srv.URL), toolkit(t, tc.tool), NewState("go")
			step(t, c, st, tk, ActionModelTurn)
			step(t, c, st, tk, ActionToolCalls)
			st = roundTrip(t, st)
			if err := st.Answer("call_1", tc.answer); err != nil {
				t.Fatal(err)
			}
			res := step(t, c, st, tk, ActionToolCalls)
			if len(res.Suspended) != 0 {
				t.Errorf("a call suspended twice: %+v", res.Suspended)
			}
			step(t, c, st, tk, ActionModelTurn)
			if diff := cmp.Diff([]toolResult{tc.want}, sentToolResults(t, srv.Requests()[1])); diff != "" {
				t.Errorf("results sent (-want +got):\n%s", diff)
			}
			if !st.ToolCalls[0].IsError {
				t.Errorf("history says IsError false for %q", st.ToolCalls[0].Output)
			}
		})
	}
}

// TestAnswerRefused: answers that do not fit leave the state exactly as it was.
func TestAnswerRefused(t *testing.T) {
	form := map[string]any{"schema": map[string]any{"type": "object", "required": []any{"env", "region"}}}
	cases := []struct {
		name    string
		req     tools.Request
		callID  string
		answer  tools.Answer
		wantErr string
	}{
		{"unknown call", tools.Request{Kind: tools.KindApproval}, "call_x", tools.Answer{OK: true}, `no tool call "call_x"`},
		{"id does not echo", tools.Request{ID: "r1", Kind: tools.KindApproval}, "call_1", tools.Answer{ID: "r2", OK: true}, `does not echo the pending request id "r1"`},
		{"input without output", tools.Request{ID: "r1", Kind: tools.KindInput}, "call_1", tools.Answer{OK: true}, "needs data.output (a string)"},
		{"input with non-string output", tools.Request{ID: "r1", Kind: tools.KindInput}, "call_1",
			tools.Answer{OK: true, Data: map[string]any{"output": 12345}}, "data.output of type int; it must be a string"},
		{"form missing required", tools.Request{ID: "r1", Kind: tools.KindInput, Data: form}, "call_1",
			tools.Answer{OK: true, Data: map[string]any{"env": "secret-value"}}, "lacks required field(s) region of data.schema"},
		{"question without data", tools.Request{ID: "r1", Kind: tools.KindQuestion}, "call_1", tools.Answer{OK: true}, "needs a non-empty data object"},
		{"tool_call without result", tools.Request{ID: "r1", Kind: tools.KindToolCall}, "call_1",
			tools.Answer{OK: true, Data: map[string]any{"value": "secret-value"}}, "needs data.results (an array) or data.output (a string) (keys seen: [value])"},
		{"tool_call with a null output", tools.Request{ID: "r1", Kind: tools.KindToolCall}, "call_1",
			tools.Answer{OK: true, Data: map[string]any{"output": nil}}, "needs data.results (an array) or data.output (a string) (keys seen: [output])"},
		{"tool_call with results that are no array", tools.Request{ID: "r1", Kind: tools.KindToolCall}, "call_1",
			tools.Answer{OK: true, Data: map[string]any{"results": "secret-value"}}, "needs data.results (an array)"},
		{"reason with ok", tools.Request{ID: "r1", Kind: tools.KindApproval}, "call_1", tools.Answer{OK: true, Reason: "declined"}, "a reason is only for ok: false"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := suspendedState(tc.req)
			before := roundTrip(t, st)
			err := st.Answer(tc.callID, tc.answer)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Answer error = %v, want it to contain %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "secret-value") {
				t.Errorf("error echoes a value: %v", err)
			}
			if diff := cmp.Diff(before, st); diff != "" {
				t.Errorf("state changed (-before +after):\n%s", diff)
			}
		})
	}
}

func TestAnswerAccepted(t *testing.T) {
	form := map[string]any{"schema": map[string]any{"type": "object", "required": []any{"env"}}}
	cases := []struct {
		name   string
		req    tools.Request
		answer tools.Answer
	}{
		{"approval needs no data", tools.Request{ID: "r1", Kind: tools.KindApproval}, tools.Answer{OK: true}},
		{"input output", tools.Request{ID: "r1", Kind: tools.KindInput}, tools.AnswerOutput("r1", "")},
		{"form fields", tools.Request{ID: "r1", Kind: tools.KindInput, Data: form}, tools.Answer{OK: true, Data: map[string]any{"env": "prod"}}},
		{"tool_call results", tools.Request{ID: "r1", Kind: tools.KindToolCall}, tools.Answer{OK: true, Data: map[string]any{"results": []any{}}}},
		{"decline needs no data", tools.Request{ID: "r1", Kind: tools.KindInput}, tools.AnswerDeclined("r1", "")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := suspendedState(tc.req).Answer("call_1", tc.answer); err != nil {
				t.Errorf("Answer: %v", err)
			}
		})
	}
}

func TestAnswerTwice(t *testing.T) {
	for _, first := range []tools.Answer{{OK: true}, {OK: false}} {
		st := suspendedState(tools.Request{ID: "r1", Kind: tools.KindApproval})
		if err := st.Answer("call_1", first); err != nil {
			t.Fatal(err)
		}
		if err := st.Answer("call_1", tools.Answer{OK: true}); err == nil || !strings.Contains(err.Error(), "already answered") {
			t.Errorf("second answer after ok=%v: err = %v, want already answered", first.OK, err)
		}
	}
	st := suspendedState(tools.Request{ID: "r1", Kind: tools.KindApproval})
	st.Calls = append(st.Calls, Call{ID: "call_2", Name: "x", Phase: PhaseQueued})
	if err := st.Answer("call_2", tools.Answer{OK: true}); err == nil || !strings.Contains(err.Error(), "not waiting for an answer") {
		t.Errorf("answer to a queued call: err = %v", err)
	}
}

// suspendedState is a state whose only call, call_1, waits on req.
func suspendedState(req tools.Request) *State {
	st := NewState("go")
	st.Turn = 1
	st.Messages = append(st.Messages, Message{Role: RoleAssistant, ToolCalls: []MessageToolCall{{ID: "call_1", Name: "act", Arguments: "{}"}}})
	st.Calls = []Call{{ID: "call_1", Name: "act", Arguments: "{}", Args: "{}", Phase: PhaseSuspended, Request: &req}}
	return st
}

package loop

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
)

// StepUntilSaved stops where the caller must save: after a model turn that asks for tool calls,
// at a suspension, at the end, and before a model turn the transcript has outgrown.
func TestStepUntilSaved(t *testing.T) {
	callWork := looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "work", Arguments: "{}"})
	callGate := looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "gate", Arguments: "{}"})
	cases := map[string]struct {
		replies       []looptest.Reply
		maxTranscript int
		// steps are the StepUntilSaved calls made, each from the state the previous left.
		steps        int
		wantRequests int
		wantRuns     int32
		wantNext     Action
	}{
		"a model turn asking for tools is saved before they run": {
			replies: []looptest.Reply{callWork}, maxTranscript: 1 << 20, steps: 1,
			wantRequests: 1, wantRuns: 0, wantNext: ActionToolCalls,
		},
		"the tool calls and the next model turn go in one step": {
			replies: []looptest.Reply{callWork, looptest.OpenAIText("done")}, maxTranscript: 1 << 20, steps: 2,
			wantRequests: 2, wantRuns: 1, wantNext: ActionFinished,
		},
		"a suspension stops the step": {
			replies: []looptest.Reply{callGate}, maxTranscript: 1 << 20, steps: 2,
			wantRequests: 1, wantRuns: 0, wantNext: ActionWaiting,
		},
		"an outgrown transcript does not go to the model": {
			replies: []looptest.Reply{callWork}, maxTranscript: len("hello"), steps: 2,
			wantRequests: 1, wantRuns: 1, wantNext: ActionModelTurn,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			model := looptest.New(t, tc.replies...)
			var work counter
			tk := toolkit(t, work.tool("work"), suspending("gate", tools.Request{Kind: tools.KindApproval, Prompt: "ok?"},
				func(tools.Answer) string { return "approved" }))
			c := newClient(t, model.URL)
			st := NewState("hello")
			for range tc.steps {
				if err := c.StepUntilSaved(context.Background(), st, tk, tc.maxTranscript); err != nil {
					t.Fatal(err)
				}
				st = roundTrip(t, st)
			}
			if got := len(model.Requests()); got != tc.wantRequests {
				t.Errorf("model requests %d, want %d", got, tc.wantRequests)
			}
			if got := work.runs.Load(); got != tc.wantRuns {
				t.Errorf("tool runs %d, want %d", got, tc.wantRuns)
			}
			if got := st.Next(); got != tc.wantNext {
				t.Errorf("next action %s, want %s", got, tc.wantNext)
			}
		})
	}
}

// A cancelled step returns the context's error and keeps what it did.
func TestStepUntilSavedCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	st := NewState("hello")
	err := newClient(t, "http://127.0.0.1:1").StepUntilSaved(ctx, st, toolkit(t), 1<<20)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if st.Next() != ActionModelTurn || !strings.Contains(st.Messages[0].Content, "hello") {
		t.Errorf("state changed: next %s", st.Next())
	}
}

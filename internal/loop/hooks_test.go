package loop

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
)

// hookLog records hook invocations as "<hook> <name> turn=<n>" lines.
type hookLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *hookLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
}

func TestHooks(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(
			looptest.ToolCall{ID: "c1", Name: "blocked", Arguments: `{}`},
			looptest.ToolCall{ID: "c2", Name: "shout", Arguments: `{"text":"hi"}`}),
		looptest.OpenAIText("done"))
	var blockedRuns counter
	shout := tools.NativeTool("shout", "", nil, func(_ context.Context, args map[string]any, _ *tools.ToolContext) (any, error) {
		return args["text"], nil
	})
	log := &hookLog{}
	var raw []string
	hooks := Hooks{
		BeforeLLM: func(_ context.Context, ev BeforeLLMEvent) (*LLMOverride, error) {
			log.add(fmt.Sprintf("BeforeLLM %s turn=%d", ev.Model, ev.Turn))
			return &LLMOverride{Model: "override-model"}, nil
		},
		AfterLLM: func(_ context.Context, ev AfterLLMEvent) error {
			raw = append(raw, ev.Response["id"].(string))
			return nil
		},
		BeforeTool: func(_ context.Context, ev BeforeToolEvent) (*ToolOverride, error) {
			log.add(fmt.Sprintf("BeforeTool %s turn=%d", ev.Name, ev.Turn))
			if ev.Name == "blocked" {
				return &ToolOverride{Result: &tools.ToolResult{Output: "not allowed", IsError: true}}, nil
			}
			return &ToolOverride{Args: map[string]any{"text": "rewritten"}}, nil
		},
		AfterTool: func(_ context.Context, ev AfterToolEvent) (*ToolOverride, error) {
			log.add(fmt.Sprintf("AfterTool %s turn=%d", ev.Name, ev.Turn))
			return &ToolOverride{Result: &tools.ToolResult{Output: ev.Result.Output + "!"}}, nil
		},
	}
	c := newClient(t, srv.URL, func(o *Options) { o.Hooks = hooks })
	res, err := c.Run(context.Background(), "go", toolkit(t, blockedRuns.tool("blocked"), shout))
	if err != nil {
		t.Fatal(err)
	}
	if blockedRuns.runs.Load() != 0 {
		t.Errorf("a short-circuited tool ran")
	}
	want := []toolResult{{ID: "c1", Content: "not allowed"}, {ID: "c2", Content: "rewritten!"}}
	if diff := cmp.Diff(want, sentToolResults(t, srv.Requests()[1])); diff != "" {
		t.Errorf("results (-want +got):\n%s", diff)
	}
	// Tool hooks run concurrently; compare as a set where order is not defined.
	wantLog := map[string]bool{
		"BeforeLLM gpt-4o-mini turn=0": true, "BeforeTool blocked turn=0": true, "BeforeTool shout turn=0": true,
		"AfterTool shout turn=0": true, "BeforeLLM gpt-4o-mini turn=1": true,
	}
	gotLog := map[string]bool{}
	for _, l := range log.lines {
		gotLog[l] = true
	}
	if diff := cmp.Diff(wantLog, gotLog); diff != "" || len(log.lines) != len(wantLog) {
		t.Errorf("hook calls (-want +got):\n%s\nall: %q", diff, log.lines)
	}
	if diff := cmp.Diff([]string{"chatcmpl-tools", "chatcmpl-text"}, raw); diff != "" {
		t.Errorf("AfterLLM raw ids (-want +got):\n%s", diff)
	}
	if got := srv.Requests()[0].JSON(t)["model"]; got != "override-model" || res.Model != "override-model" {
		t.Errorf("sent model %v, result model %q; want the override", got, res.Model)
	}
}

func TestBeforeLLMReplacesTranscript(t *testing.T) {
	srv := looptest.New(t, looptest.OpenAIText("short"))
	c := newClient(t, srv.URL, func(o *Options) {
		o.Hooks.BeforeLLM = func(context.Context, BeforeLLMEvent) (*LLMOverride, error) {
			return &LLMOverride{Messages: []Message{{Role: RoleUser, Content: "redacted prompt"}}}, nil
		}
	})
	res, err := c.Run(context.Background(), "secret prompt", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []Message{{Role: RoleUser, Content: "redacted prompt"}, {Role: RoleAssistant, Content: "short"}}
	if diff := cmp.Diff(want, res.Messages); diff != "" {
		t.Errorf("transcript (-want +got):\n%s", diff)
	}
}

// TestHookErrorAborts: an error from any hook ends the step with that error and leaves the state
// as it was, so nothing half-done is persisted.
func TestHookErrorAborts(t *testing.T) {
	boom := errors.New("boom")
	cases := []struct {
		name  string
		hooks Hooks
		steps int // successful steps before the failing one
	}{
		{"BeforeLLM", Hooks{BeforeLLM: func(context.Context, BeforeLLMEvent) (*LLMOverride, error) { return nil, boom }}, 0},
		{"AfterLLM", Hooks{AfterLLM: func(context.Context, AfterLLMEvent) error { return boom }}, 0},
		{"BeforeTool", Hooks{BeforeTool: func(context.Context, BeforeToolEvent) (*ToolOverride, error) { return nil, boom }}, 1},
		{"AfterTool", Hooks{AfterTool: func(context.Context, AfterToolEvent) (*ToolOverride, error) { return nil, boom }}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := looptest.New(t, looptest.OpenAIToolCalls(looptest.ToolCall{ID: "c1", Name: "t", Arguments: `{}`}))
			var ran counter
			c, tk, st := newClient(t, srv.URL, func(o *Options) { o.Hooks = tc.hooks }), toolkit(t, ran.tool("t")), NewState("go")
			for range tc.steps {
				if _, err := c.Step(context.Background(), st, tk); err != nil {
					t.Fatal(err)
				}
			}
			before := roundTrip(t, st)
			_, err := c.Step(context.Background(), st, tk)
			if !errors.Is(err, boom) {
				t.Fatalf("Step error = %v, want boom", err)
			}
			if retry, _ := Retryable(err); retry {
				t.Errorf("a hook error is retryable")
			}
			if diff := cmp.Diff(before, st); diff != "" {
				t.Errorf("state changed (-before +after):\n%s", diff)
			}
		})
	}
}

// TestAfterToolSeesNoSuspension: AfterTool runs once, on the result of the retry with the answer,
// never on the suspension itself.
func TestAfterToolSeesNoSuspension(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "c1", Name: "ask", Arguments: `{}`}),
		looptest.OpenAIText("ok"))
	var seen []string
	c := newClient(t, srv.URL, func(o *Options) {
		o.Hooks.AfterTool = func(_ context.Context, ev AfterToolEvent) (*ToolOverride, error) {
			seen = append(seen, ev.Result.Output)
			return nil, nil
		}
	})
	tk := toolkit(t, suspending("ask", tools.Request{Kind: tools.KindInput, Prompt: "Which?"}, func(a tools.Answer) string { s, _ := a.OutputOf(); return s }))
	st := NewState("go")
	step(t, c, st, tk, ActionModelTurn)
	step(t, c, st, tk, ActionToolCalls)
	if len(seen) != 0 {
		t.Fatalf("AfterTool saw the suspension: %q", seen)
	}
	if err := st.Answer("c1", tools.AnswerOutput("", "blue")); err != nil {
		t.Fatal(err)
	}
	step(t, c, st, tk, ActionToolCalls)
	if diff := cmp.Diff([]string{"blue"}, seen); diff != "" {
		t.Errorf("AfterTool saw (-want +got):\n%s", diff)
	}
}

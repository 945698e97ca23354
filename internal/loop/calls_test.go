package loop

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/tools"
)

// TestBadCallsReachTheModel: malformed arguments and unknown tools become error results the model
// sees; the run goes on.
func TestBadCallsReachTheModel(t *testing.T) {
	for _, style := range []struct {
		name  string
		mut   func(*Options)
		calls func(...looptest.ToolCall) looptest.Reply
		text  func(string) looptest.Reply
	}{
		{"openai", func(*Options) {}, looptest.OpenAIToolCalls, looptest.OpenAIText},
		{"anthropic", anthropicStyle, looptest.AnthropicToolUse, looptest.AnthropicText},
	} {
		t.Run(style.name, func(t *testing.T) {
			calls := []looptest.ToolCall{
				{ID: "c1", Name: "nope", Arguments: `{}`},
				{ID: "c2", Name: "echo", Arguments: `[1,2]`},
				{ID: "c3", Name: "echo", Arguments: `{"x":1}`},
			}
			if style.name == "openai" { // only the openai wire carries arguments as text, so only it can be malformed
				calls[1].Arguments = `{"x":`
			}
			srv := looptest.New(t, style.calls(calls...), style.text("sorry"))
			var ran counter
			tk := toolkit(t, ran.tool("echo"))
			c, st := newClient(t, srv.URL, style.mut), NewState("go")
			step(t, c, st, tk, ActionModelTurn)
			step(t, c, st, tk, ActionToolCalls)
			step(t, c, st, tk, ActionModelTurn)

			badArgs := "invalid JSON arguments for echo: arguments are an array, want a JSON object"
			if style.name == "openai" {
				badArgs = "invalid JSON arguments for echo: unexpected end of JSON input"
			}
			want := []toolResult{
				{ID: "c1", Content: "Unknown tool: nope", IsError: style.name == "anthropic"},
				{ID: "c2", Content: badArgs, IsError: style.name == "anthropic"},
				{ID: "c3", Content: "ran 1"},
			}
			if diff := cmp.Diff(want, sentToolResults(t, srv.Requests()[1])); diff != "" {
				t.Errorf("results sent (-want +got):\n%s", diff)
			}
			if st.Status != StatusDone || ran.runs.Load() != 1 {
				t.Errorf("status %q, echo ran %d times; want done, 1", st.Status, ran.runs.Load())
			}
		})
	}
}

// gate is an approval gate in BeforeTool (path B), counting how often it is consulted.
type gate struct {
	mu    sync.Mutex
	calls int
}

func (g *gate) hook(_ context.Context, ev BeforeToolEvent) (*ToolOverride, error) {
	g.mu.Lock()
	g.calls++
	g.mu.Unlock()
	if slices.Contains(ev.Passed, "guard") {
		return nil, nil
	}
	r := tools.Pending(tools.Request{ID: "toolguard:" + ev.ID, Kind: tools.KindApproval, Prompt: "Approve the call to " + ev.Name + "?",
		Data: map[string]any{"tool": ev.Name}})
	return &ToolOverride{Result: &r, Gate: &state.Gate{Key: "guard"}}, nil
}

func TestGatedCall(t *testing.T) {
	cases := []struct {
		name     string
		answer   tools.Answer
		wantRuns []string // idempotency keys the tool saw
		// consulted is how often the gate was asked: once for the call, again once it approved.
		consulted int
		want      toolResult
	}{
		{"approved runs once with the answer", tools.Answer{ID: "toolguard:call_1", OK: true},
			[]string{"uid-1/call_1"}, 2, toolResult{ID: "call_1", Content: "deleted"}},
		{"declined never runs", tools.AnswerDeclined("toolguard:call_1", ""),
			nil, 1, toolResult{ID: "call_1", Content: "declined/expired: Approve the call to delete_db?\nreason: declined"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := looptest.New(t,
				looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "delete_db", Arguments: `{"db":"prod"}`}),
				looptest.OpenAIText("done"))
			var mu sync.Mutex
			var runs []string
			del := tools.NativeTool("delete_db", "", nil, func(_ context.Context, args map[string]any, tc *tools.ToolContext) (any, error) {
				mu.Lock()
				defer mu.Unlock()
				if tc.Answer == nil {
					t.Errorf("the gated tool ran without the answer in its context")
				}
				runs = append(runs, tc.IdempotencyKey)
				return "deleted", nil
			})
			g := &gate{}
			mut := func(o *Options) { o.Hooks.BeforeTool, o.IdempotencyPrefix = g.hook, "uid-1" }
			c, tk, st := newClient(t, srv.URL, mut), toolkit(t, del), NewState("drop prod")
			step(t, c, st, tk, ActionModelTurn)
			res := step(t, c, st, tk, ActionToolCalls)
			if len(res.Suspended) != 1 || !res.Suspended[0].Gated || res.Suspended[0].Request.ID != "toolguard:call_1" {
				t.Fatalf("Suspended = %+v, want the gate's request", res.Suspended)
			}
			st = roundTrip(t, st)
			c = newClient(t, srv.URL, mut)
			if err := st.Answer("call_1", tc.answer); err != nil {
				t.Fatal(err)
			}
			step(t, c, st, tk, ActionToolCalls)
			step(t, c, st, tk, ActionModelTurn)
			if diff := cmp.Diff(tc.wantRuns, runs); diff != "" {
				t.Errorf("tool runs (-want +got):\n%s", diff)
			}
			if g.calls != tc.consulted {
				t.Errorf("the gate was consulted %d times, want %d", g.calls, tc.consulted)
			}
			if diff := cmp.Diff([]toolResult{tc.want}, sentToolResults(t, srv.Requests()[1])); diff != "" {
				t.Errorf("results sent (-want +got):\n%s", diff)
			}
		})
	}
}

// chain gates a call first by "policy/a", then by "run": each raises its own request once the
// gates before it approved, as the operator's platform policies and a run's own gates do.
// refuse, when set, makes the run gate refuse the call outright instead.
func chain(refuse bool) Hooks {
	return Hooks{BeforeTool: func(_ context.Context, ev BeforeToolEvent) (*ToolOverride, error) {
		for _, key := range []string{"policy/a", "run"} {
			if slices.Contains(ev.Passed, key) {
				continue
			}
			if key == "run" && refuse {
				r := tools.ToolResult{Output: "refused by the run gate", IsError: true}
				return &ToolOverride{Result: &r}, nil
			}
			r := tools.Pending(tools.Request{ID: key + ":" + ev.ID, Kind: tools.KindApproval, Prompt: "Approve for " + key + "?"})
			// A rewrite while a later gate is raised is ignored: the call runs with what the
			// first approver saw.
			return &ToolOverride{Result: &r, Args: map[string]any{"db": "other"}, Gate: &state.Gate{Key: key, OnTimeout: state.OnTimeoutFail}}, nil
		}
		return nil, nil
	}}
}

func TestCallPassesEveryGate(t *testing.T) {
	cases := []struct {
		name   string
		refuse bool
		second tools.Answer // to the run gate; zero when the gate refuses instead
		runs   []string
		result string
	}{
		{"both approve: runs once", false, tools.Answer{OK: true}, []string{`call_1 {"db":"other"}`}, "deleted"},
		{"second declines: never runs", false, tools.AnswerDeclined("", "no"), nil, "declined/expired: Approve for run?\nreason: no"},
		{"second refuses: never runs", true, tools.Answer{}, nil, "refused by the run gate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := looptest.New(t,
				looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "delete_db", Arguments: `{"db":"prod"}`}),
				looptest.OpenAIText("done"))
			var runs []string
			del := tools.NativeTool("delete_db", "", nil, func(_ context.Context, args map[string]any, tc *tools.ToolContext) (any, error) {
				runs = append(runs, fmt.Sprintf("%s %s", tc.IdempotencyKey, mustJSON(t, args)))
				return "deleted", nil
			})
			mut := func(o *Options) { o.Hooks = chain(tc.refuse) }
			c, tk, st := newClient(t, srv.URL, mut), toolkit(t, del), NewState("drop prod")
			step(t, c, st, tk, ActionModelTurn)
			res := step(t, c, st, tk, ActionToolCalls)
			first := res.Suspended
			if len(first) != 1 || first[0].Gate == nil || first[0].Gate.Key != "policy/a" || first[0].Request.ID != "policy/a:call_1" {
				t.Fatalf("first suspension = %+v, want policy/a's", first)
			}
			st = roundTrip(t, st)
			if err := st.Answer("call_1", tools.Answer{OK: true}); err != nil {
				t.Fatal(err)
			}
			res = step(t, newClient(t, srv.URL, mut), st, tk, ActionToolCalls)
			if !tc.refuse {
				if len(res.Suspended) != 1 || res.Suspended[0].Gate.Key != "run" || res.Suspended[0].Request.ID != "run:call_1" ||
					!slices.Equal(res.Suspended[0].Passed, []string{"policy/a"}) || res.Suspended[0].Args != `{"db":"other"}` {
					t.Fatalf("second suspension = %+v, want the run gate's, after policy/a, with the first approver's arguments", res.Suspended)
				}
				st = roundTrip(t, st)
				if err := st.Answer("call_1", tc.second); err != nil {
					t.Fatal(err)
				}
				step(t, newClient(t, srv.URL, mut), st, tk, ActionToolCalls)
			}
			step(t, newClient(t, srv.URL, mut), st, tk, ActionModelTurn)
			if diff := cmp.Diff(tc.runs, runs); diff != "" {
				t.Errorf("tool runs (-want +got):\n%s", diff)
			}
			if got := sentToolResults(t, srv.Requests()[1]); len(got) != 1 || got[0].Content != tc.result {
				t.Errorf("results sent = %+v, want %q", got, tc.result)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRetryUsesRewrittenArgs: the retry with the answer runs with the arguments BeforeTool
// produced, even across a persist/load, and the idempotency key gains /answer.
func TestRetryUsesRewrittenArgs(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "buy", Arguments: `{"item":"gpu"}`}),
		looptest.OpenAIText("ok"))
	type run struct {
		Args   map[string]any
		Key    string
		Answer bool
	}
	var runs []run
	buy := tools.NativeTool("buy", "", nil, func(_ context.Context, args map[string]any, tc *tools.ToolContext) (any, error) {
		runs = append(runs, run{Args: args, Key: tc.IdempotencyKey, Answer: tc.Answer != nil})
		if tc.Answer == nil {
			return tools.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "Approve?"}), nil
		}
		return "bought", nil
	})
	rewrite := func(o *Options) {
		o.Hooks.BeforeTool = func(_ context.Context, ev BeforeToolEvent) (*ToolOverride, error) {
			return &ToolOverride{Args: map[string]any{"item": ev.Args["item"], "qty": 1.0}}, nil
		}
	}
	c, tk, st := newClient(t, srv.URL, rewrite), toolkit(t, buy), NewState("buy")
	step(t, c, st, tk, ActionModelTurn)
	step(t, c, st, tk, ActionToolCalls)
	st = roundTrip(t, st)
	if err := st.Answer("call_1", tools.Answer{OK: true}); err != nil {
		t.Fatal(err)
	}
	step(t, newClient(t, srv.URL, rewrite), st, tk, ActionToolCalls)
	args := map[string]any{"item": "gpu", "qty": 1.0}
	want := []run{{Args: args, Key: "call_1"}, {Args: args, Key: "call_1/answer", Answer: true}}
	if diff := cmp.Diff(want, runs); diff != "" {
		t.Errorf("tool runs (-want +got):\n%s", diff)
	}
}

func TestIdempotencyKey(t *testing.T) {
	for prefix, want := range map[string]string{"": "call_1", "uid-1": "uid-1/call_1"} {
		c := newClient(t, "http://model.invalid", func(o *Options) { o.IdempotencyPrefix = prefix })
		if got := c.idempotencyKey("call_1"); got != want {
			t.Errorf("prefix %q: key %q, want %q", prefix, got, want)
		}
	}
}

// TestMissingCallIDs: a server that omits tool call ids, or sends one longer than MaxCallIDLen,
// gets stable ones, the same in the transcript and in the results.
func TestMissingCallIDs(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{Name: "t", Arguments: `{}`},
			looptest.ToolCall{ID: strings.Repeat("x", MaxCallIDLen+1), Name: "t", Arguments: `{}`}),
		looptest.OpenAIText("ok"))
	var ran counter
	c, tk, st := newClient(t, srv.URL), toolkit(t, ran.tool("t")), NewState("go")
	step(t, c, st, tk, ActionModelTurn)
	step(t, c, st, tk, ActionToolCalls)
	step(t, c, st, tk, ActionModelTurn)
	var ids []string
	for _, r := range sentToolResults(t, srv.Requests()[1]) {
		ids = append(ids, r.ID)
	}
	want := []string{"call_1_1", "call_1_2"}
	if diff := cmp.Diff(want, ids); diff != "" {
		t.Errorf("result ids (-want +got):\n%s", diff)
	}
	var asked []string
	for _, tc := range st.Messages[1].ToolCalls {
		asked = append(asked, tc.ID)
	}
	if diff := cmp.Diff(want, asked); diff != "" {
		t.Errorf("transcript ids (-want +got):\n%s", diff)
	}
}

package loop

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
)

// toolRun is one execution of a recording tool: what it was given.
type toolRun struct {
	Args   map[string]any
	Key    string
	Answer *tools.Answer
}

// recorder is a native tool that records its runs and answers with respond.
type recorder struct {
	mu      sync.Mutex
	runs    []toolRun
	respond func(tc *tools.ToolContext) any
}

func (r *recorder) tool(name string) tools.Tool {
	return tools.NativeTool(name, "records its runs", nil, func(_ context.Context, args map[string]any, tc *tools.ToolContext) (any, error) {
		r.mu.Lock()
		r.runs = append(r.runs, toolRun{Args: args, Key: tc.IdempotencyKey, Answer: tc.Answer})
		r.mu.Unlock()
		return r.respond(tc), nil
	})
}

func (r *recorder) keys() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, run := range r.runs {
		out = append(out, run.Key)
	}
	return out
}

// answerStep records a on the only call of st after a persist/load, then steps the tool calls in
// a fresh Client, as a controller does when an answer arrives.
func answerStep(t *testing.T, base string, st *State, tk *tools.Toolkit, a tools.Answer, mut ...func(*Options)) (*State, StepResult) {
	t.Helper()
	st = roundTrip(t, st)
	if err := st.Answer(st.Calls[0].ID, a); err != nil {
		t.Fatalf("Answer: %v", err)
	}
	return st, step(t, newClient(t, base, mut...), st, tk, ActionToolCalls)
}

// finishTurn steps until the turn's results reached the model and returns the results it was sent.
func finishTurn(t *testing.T, c *Client, st *State, tk *tools.Toolkit, srv *looptest.Server) []toolResult {
	t.Helper()
	if st.Next() == ActionToolCalls {
		step(t, c, st, tk, ActionToolCalls)
	}
	step(t, c, st, tk, ActionModelTurn)
	return lastToolResults(t, srv)
}

const authURL = "https://accounts.example.com/authorize"

// TestGateApprovalIsNotTheToolsSuspension : after the gate's approval the tool runs for
// the first time; when that run suspends on its own, the call waits on a new request of the tool's
// own kind, and only a retry of that one can be unresolved.
func TestGateApprovalIsNotTheToolsSuspension(t *testing.T) {
	authThenData := func(tc *tools.ToolContext) any {
		if tc.Answer != nil && !strings.HasPrefix(tc.Answer.ID, tools.ApprovalIDPrefix) {
			return "3 events"
		}
		return tools.AuthRequired(authURL, "")
	}
	alwaysAuth := func(*tools.ToolContext) any { return tools.AuthRequired(authURL, "") }
	approve := tools.Answer{OK: true}
	cases := []struct {
		name    string
		respond func(tc *tools.ToolContext) any
		answers []tools.Answer // the gate's, then the tool's own
		keys    []string
		want    string
	}{
		{"the tool's own suspension, answered", authThenData, []tools.Answer{approve, approve},
			[]string{"uid-1/call_1", "uid-1/call_1/answer"}, "3 events"},
		{"the tool's own retry suspends again", alwaysAuth, []tools.Answer{approve, approve},
			[]string{"uid-1/call_1", "uid-1/call_1/answer"}, "unresolved: " + tools.DefaultAuthPrompt},
		{"the tool's own suspension, declined", authThenData, []tools.Answer{approve, tools.AnswerDeclined("", "")},
			[]string{"uid-1/call_1"}, "declined/expired: " + tools.DefaultAuthPrompt + "\nreason: declined"},
		{"the gate declined", authThenData, []tools.Answer{tools.AnswerDeclined("", "")},
			nil, "declined/expired: Approve the call to calendar?\nreason: declined"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := looptest.New(t,
				looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "calendar", Arguments: `{"day":"mon"}`}),
				looptest.OpenAIText("done"))
			g, cal := &gate{}, &recorder{respond: tc.respond}
			mut := func(o *Options) { o.Hooks.BeforeTool, o.IdempotencyPrefix = g.hook, "uid-1" }
			c, tk, st := newClient(t, srv.URL, mut), toolkit(t, cal.tool("calendar")), NewState("my week")
			step(t, c, st, tk, ActionModelTurn)
			res := step(t, c, st, tk, ActionToolCalls)
			if len(res.Suspended) != 1 || !res.Suspended[0].Gated || res.Suspended[0].Request.ID != "toolguard:call_1" {
				t.Fatalf("Suspended = %+v, want the gate's request", res.Suspended)
			}

			st, res = answerStep(t, srv.URL, st, tk, tc.answers[0], mut)
			var ownID string
			if len(tc.answers) > 1 {
				if len(res.Suspended) != 1 {
					t.Fatalf("after the approval: Suspended = %+v, want the tool's own request", res.Suspended)
				}
				own := roundTrip(t, st).Calls[0]
				wantOwn := Call{ID: "call_1", Name: "calendar", Arguments: `{"day":"mon"}`, Args: `{"day":"mon"}`, Phase: PhaseSuspended,
					Request:  &tools.Request{ID: own.Request.ID, Kind: tools.KindAuthorization, Prompt: tools.DefaultAuthPrompt, URL: authURL},
					Approval: &tools.Answer{ID: "toolguard:call_1", OK: true}, Passed: []string{"guard"}}
				if diff := cmp.Diff(wantOwn, own); diff != "" {
					t.Errorf("the call after its approved first run (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(wantOwn, res.Suspended[0]); diff != "" {
					t.Errorf("the suspension Step reported (-want +got):\n%s", diff)
				}
				if ownID = own.Request.ID; strings.HasPrefix(ownID, tools.ApprovalIDPrefix) || strings.HasPrefix(ownID, "pending:") {
					t.Errorf("the tool's own request has id %q, want the tool's", ownID)
				}
				st, _ = answerStep(t, srv.URL, st, tk, tc.answers[1], mut)
			}
			got := finishTurn(t, newClient(t, srv.URL, mut), st, tk, srv)
			if diff := cmp.Diff([]toolResult{{ID: "call_1", Content: tc.want}}, got); diff != "" {
				t.Errorf("results sent (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.keys, cal.keys()); diff != "" {
				t.Errorf("the tool's idempotency keys (-want +got):\n%s", diff)
			}
			// Once for the call and, when it approved, once again: it raises nothing more.
			want := 1
			if tc.answers[0].OK {
				want = 2
			}
			if g.calls != want {
				t.Errorf("the gate was consulted %d times, want %d", g.calls, want)
			}
			for i, run := range cal.runs {
				// The first run carries the approval, the retry the answer to the tool's own request.
				want := &tools.Answer{ID: "toolguard:call_1", OK: true}
				if i > 0 {
					want = &tools.Answer{ID: ownID, OK: true}
				}
				if diff := cmp.Diff(want, run.Answer); diff != "" {
					t.Errorf("the answer run %d saw (-want +got):\n%s", i+1, diff)
				}
			}
		})
	}
}

// TestRetryRunsWithTheRecordedArgs: Call.Args holds exactly the JSON the retry runs with, across a
// persist/load: what BeforeTool made of the arguments, even {}, else the model's.
func TestRetryRunsWithTheRecordedArgs(t *testing.T) {
	cases := []struct {
		name     string
		rewrite  map[string]any // nil: BeforeTool leaves the arguments alone
		wantArgs string
	}{
		{"rewritten to {}", map[string]any{}, `{}`},
		{"rewritten", map[string]any{"item": "cpu"}, `{"item":"cpu"}`},
		{"not rewritten", nil, `{"item":"gpu","qty":2}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := looptest.New(t,
				looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "buy", Arguments: `{"qty": 2, "item": "gpu"}`}),
				looptest.OpenAIText("ok"))
			buy := &recorder{respond: func(tc *tools.ToolContext) any {
				if tc.Answer == nil {
					return tools.Pending(tools.Request{ID: "buy-1", Kind: tools.KindApproval, Prompt: "Buy?"})
				}
				return "bought"
			}}
			mut := func(o *Options) {
				o.Hooks.BeforeTool = func(context.Context, BeforeToolEvent) (*ToolOverride, error) {
					return &ToolOverride{Args: tc.rewrite}, nil
				}
			}
			c, tk, st := newClient(t, srv.URL, mut), toolkit(t, buy.tool("buy")), NewState("buy")
			step(t, c, st, tk, ActionModelTurn)
			step(t, c, st, tk, ActionToolCalls)
			st = roundTrip(t, st)
			recorded := st.Calls[0].Args
			if recorded != tc.wantArgs {
				t.Errorf("Call.Args = %s, want %s", recorded, tc.wantArgs)
			}
			answerStep(t, srv.URL, st, tk, tools.Answer{OK: true}, mut)
			if len(buy.runs) != 2 {
				t.Fatalf("the tool ran %d times, want 2", len(buy.runs))
			}
			var want map[string]any
			if err := json.Unmarshal([]byte(tc.wantArgs), &want); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]map[string]any{want, want}, []map[string]any{buy.runs[0].Args, buy.runs[1].Args}); diff != "" {
				t.Errorf("arguments of the first run and the retry (-want +got):\n%s", diff)
			}
			if buy.runs[1].Args == nil {
				t.Errorf("the retry ran with nil arguments, want an empty map")
			}
			if raw, _ := json.Marshal(buy.runs[1].Args); string(raw) != recorded {
				t.Errorf("the retry ran with %s, the state recorded %s", raw, recorded)
			}
		})
	}
}

// TestArgumentsTooLargeToShow: a call whose arguments an answerer could not be shown whole cannot
// wait for an answer; the model gets an error result instead of a suspension.
func TestArgumentsTooLargeToShow(t *testing.T) {
	const overhead = len(`{"blob":""}`)
	tooLarge := fmt.Sprintf("ask cannot wait for an answer: its arguments (%d bytes) exceed the %d bytes an answerer can be shown",
		MaxShownArguments+1, MaxShownArguments)
	cases := []struct {
		name    string
		blob    int
		gated   bool
		suspend bool
	}{
		{"exactly the limit waits", MaxShownArguments - overhead, false, true},
		{"one byte over gets an error", MaxShownArguments - overhead + 1, false, false},
		{"one byte over at the gate gets an error", MaxShownArguments - overhead + 1, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := fmt.Sprintf(`{"blob":%q}`, strings.Repeat("x", tc.blob))
			srv := looptest.New(t,
				looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "ask", Arguments: args}),
				looptest.OpenAIText("ok"))
			ask := &recorder{respond: func(*tools.ToolContext) any {
				return tools.Pending(tools.Request{ID: "ask-1", Kind: tools.KindInput, Prompt: "Which?"})
			}}
			mut := func(o *Options) {
				if tc.gated {
					o.Hooks.BeforeTool = (&gate{}).hook
				}
			}
			c, tk, st := newClient(t, srv.URL, mut), toolkit(t, ask.tool("ask")), NewState("go")
			step(t, c, st, tk, ActionModelTurn)
			res := step(t, c, st, tk, ActionToolCalls)
			if runs, want := len(ask.runs), map[bool]int{false: 1, true: 0}[tc.gated]; runs != want {
				t.Errorf("the tool ran %d times, want %d", runs, want)
			}
			if tc.suspend {
				if len(res.Suspended) != 1 || len(res.Suspended[0].Args) != MaxShownArguments {
					t.Errorf("Suspended = %d calls, want one with %d bytes of arguments", len(res.Suspended), MaxShownArguments)
				}
				return
			}
			if len(res.Suspended) != 0 || st.Next() != ActionModelTurn {
				t.Fatalf("Suspended = %d calls, Next %s; want none, %s", len(res.Suspended), st.Next(), ActionModelTurn)
			}
			got := finishTurn(t, c, st, tk, srv)
			if diff := cmp.Diff([]toolResult{{ID: "call_1", Content: tooLarge}}, got); diff != "" {
				t.Errorf("results sent (-want +got):\n%s", diff)
			}
		})
	}
}

// manyCalls is a model turn asking for n calls of tool, ids call_1…call_n.
func manyCalls(n int, tool string) (looptest.Reply, []string) {
	calls, ids := make([]looptest.ToolCall, n), make([]string, n)
	for i := range calls {
		ids[i] = fmt.Sprintf("call_%d", i+1)
		calls[i] = looptest.ToolCall{ID: ids[i], Name: tool, Arguments: `{}`}
	}
	return looptest.OpenAIToolCalls(calls...), ids
}

// TestMaxToolCallsPerTurn: of a turn asking for 10,000 calls only the first MaxToolCallsPerTurn
// run; every other call gets an error result naming the limit, so the next request carries one
// result per call, in call order. The turn's memory stays bounded.
func TestMaxToolCallsPerTurn(t *testing.T) {
	const calls = 10_000
	// Measured on linux/amd64, Go 1.26, for the three steps (both sides of the fake model's HTTP
	// included): 42.8 MiB in total allocations (61.5 MiB under -race). The bound leaves headroom.
	const maxAlloc = 128 << 20
	cases := []struct {
		name  string
		limit int
		want  int
	}{
		{"default", 0, DefaultMaxToolCallsPerTurn},
		{"configured", 100, 100},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			turn, ids := manyCalls(calls, "act")
			srv := looptest.New(t, turn, looptest.OpenAIText("done"))
			act := &recorder{respond: func(tc *tools.ToolContext) any { return "ran " + tc.CallID }}
			c := newClient(t, srv.URL, func(o *Options) { o.MaxToolCallsPerTurn = tc.limit })
			tk, st := toolkit(t, act.tool("act")), NewState("go")

			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			step(t, c, st, tk, ActionModelTurn)
			step(t, c, st, tk, ActionToolCalls)
			step(t, c, st, tk, ActionModelTurn)
			runtime.ReadMemStats(&after)
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d calls, %d run: %.1f MiB allocated", calls, tc.want, float64(alloc)/(1<<20))
			if alloc > maxAlloc {
				t.Errorf("the turn allocated %d MiB, want at most %d MiB", alloc>>20, maxAlloc>>20)
			}

			ran := act.keys()
			slices.Sort(ran)
			wantRan := slices.Clone(ids[:tc.want])
			slices.Sort(wantRan)
			if diff := cmp.Diff(wantRan, ran); diff != "" {
				t.Errorf("calls that ran (-want +got):\n%s", diff)
			}
			notRun := fmt.Sprintf("not executed: the turn asked for %d tool calls and at most %d run per turn; call fewer tools at once",
				calls, tc.want)
			want := make([]toolResult, calls)
			for i, id := range ids {
				want[i] = toolResult{ID: id, Content: notRun}
				if i < tc.want {
					want[i].Content = "ran " + id
				}
			}
			if diff := cmp.Diff(want, lastToolResults(t, srv)); diff != "" {
				t.Errorf("results sent (-want +got):\n%s", diff)
			}
			if st.ToolCallCount != calls || len(st.Messages) != 2+calls+1 {
				t.Errorf("transcript: %d calls counted, %d messages; want %d, %d", st.ToolCallCount, len(st.Messages), calls, 2+calls+1)
			}
		})
	}
}

// TestMaxParallelTools: the calls of one turn run concurrently, at most MaxParallelTools at once.
func TestMaxParallelTools(t *testing.T) {
	cases := []struct {
		name  string
		limit int
		calls int
		want  int32
	}{
		{"configured", 2, 6, 2},
		{"default", 0, 2 * DefaultMaxParallelTools, DefaultMaxParallelTools},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var running, most atomic.Int32
			var ts []tools.Tool
			var calls []looptest.ToolCall
			for i := range tc.calls {
				name := fmt.Sprintf("slow_%d", i+1)
				calls = append(calls, looptest.ToolCall{ID: fmt.Sprintf("call_%d", i+1), Name: name, Arguments: `{}`})
				ts = append(ts, tools.NativeTool(name, "slow", nil, func(context.Context, map[string]any, *tools.ToolContext) (any, error) {
					n := running.Add(1)
					defer running.Add(-1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(50 * time.Millisecond)
					return "slept", nil
				}))
			}
			srv := looptest.New(t, looptest.OpenAIToolCalls(calls...), looptest.OpenAIText("done"))
			c := newClient(t, srv.URL, func(o *Options) { o.MaxParallelTools = tc.limit })
			tk, st := toolkit(t, ts...), NewState("go")
			step(t, c, st, tk, ActionModelTurn)
			if got := finishTurn(t, c, st, tk, srv); len(got) != tc.calls {
				t.Errorf("%d results sent, want %d", len(got), tc.calls)
			}
			if got := most.Load(); got != tc.want {
				t.Errorf("at most %d tools ran at once, want %d", got, tc.want)
			}
		})
	}
}

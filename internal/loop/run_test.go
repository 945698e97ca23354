package loop

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
)

func TestNewValidates(t *testing.T) {
	cases := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{"no model", Options{}, "Options.Model is required"},
		{"bad style", Options{Model: "m", Style: "gemini"}, `unknown model style "gemini"`},
		{"negative turns", Options{Model: "m", MaxTurns: -1}, "MaxTurns is -1"},
		{"retries below -1", Options{Model: "m", Retries: -2}, "Retries is -2"},
		{"not a URL", Options{Model: "m", BaseURL: "localhost:8080"}, "is not an http(s) URL"},
	}
	for _, tc := range cases {
		if _, err := New(tc.opts); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.wantErr)
		}
	}
	c, err := New(Options{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	want := []any{StyleOpenAI, "https://api.openai.com/v1", DefaultMaxTurns, DefaultRetries, DefaultRetryBase}
	got := []any{c.opts.Style, c.opts.BaseURL, c.opts.MaxTurns, c.opts.Retries, c.opts.RetryBase}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
}

func TestNext(t *testing.T) {
	calls := func(phases ...Phase) []Call {
		var cs []Call
		for _, p := range phases {
			cs = append(cs, Call{Phase: p})
		}
		return cs
	}
	cases := []struct {
		name string
		st   State
		want Action
	}{
		{"fresh", State{}, ActionModelTurn},
		{"finished", State{Status: StatusDone}, ActionFinished},
		{"incomplete", State{Status: StatusIncomplete, Calls: calls(PhaseQueued)}, ActionFinished},
		{"queued", State{Calls: calls(PhaseQueued, PhaseSuspended)}, ActionToolCalls},
		{"answered", State{Calls: calls(PhaseDone, PhaseAnswered, PhaseSuspended)}, ActionToolCalls},
		{"only suspended", State{Calls: calls(PhaseDone, PhaseSuspended)}, ActionWaiting},
		{"all done", State{Calls: calls(PhaseDone, PhaseDone)}, ActionToolCalls},
	}
	for _, tc := range cases {
		if got := tc.st.Next(); got != tc.want {
			t.Errorf("%s: Next = %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestRunRetriesTransientErrors(t *testing.T) {
	fail := func(status int, retryAfter string) looptest.Reply {
		r := looptest.Reply{Status: status, Body: `{"error":"busy"}`}
		if retryAfter != "" {
			r.Header = http.Header{"Retry-After": {retryAfter}}
		}
		return r
	}
	cases := []struct {
		name       string
		retries    int
		replies    []looptest.Reply
		wantSleeps []time.Duration
		wantErr    string
	}{
		{"backoff doubles", 0, []looptest.Reply{fail(503, ""), fail(500, ""), looptest.OpenAIText("ok")},
			[]time.Duration{500 * time.Millisecond, time.Second}, ""},
		{"retry-after wins", 0, []looptest.Reply{fail(429, "7"), looptest.OpenAIText("ok")},
			[]time.Duration{7 * time.Second}, ""},
		{"exhausted", 0, []looptest.Reply{fail(503, ""), fail(503, ""), fail(503, "")},
			[]time.Duration{500 * time.Millisecond, time.Second}, "HTTP 503"},
		{"disabled", -1, []looptest.Reply{fail(503, "")}, nil, "HTTP 503"},
		{"not transient", 0, []looptest.Reply{fail(400, "")}, nil, "HTTP 400"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := looptest.New(t, tc.replies...)
			c := newClient(t, srv.URL, func(o *Options) { o.Retries = tc.retries })
			var sleeps []time.Duration
			c.sleep = func(_ context.Context, d time.Duration) error { sleeps = append(sleeps, d); return nil }
			res, err := c.Run(context.Background(), "go", nil)
			if tc.wantErr == "" && (err != nil || res.Text != "ok") {
				t.Fatalf("Run = %q, %v; want ok", res.Text, err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Run error = %v, want %q", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.wantSleeps, sleeps); diff != "" {
				t.Errorf("sleeps (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRunMaxTurns(t *testing.T) {
	call := looptest.OpenAIToolCalls(looptest.ToolCall{ID: "c", Name: "t", Arguments: `{}`})
	srv := looptest.New(t, call, call)
	var ran counter
	res, err := newClient(t, srv.URL, func(o *Options) { o.MaxTurns = 2 }).Run(context.Background(), "loop forever", toolkit(t, ran.tool("t")))
	if err != nil {
		t.Fatal(err)
	}
	got := []any{res.Status, res.Limit, res.Turns, res.ToolCallCount, len(srv.Requests())}
	if diff := cmp.Diff([]any{StatusIncomplete, LimitMaxTurns, 2, 2, 2}, got); diff != "" {
		t.Errorf("status, limit, turns, toolCallCount, requests (-want +got):\n%s", diff)
	}
}

func TestRunTimeout(t *testing.T) {
	block := tools.NativeTool("slow", "", nil, func(ctx context.Context, _ map[string]any, _ *tools.ToolContext) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	fake := looptest.New(t, looptest.OpenAIToolCalls(looptest.ToolCall{ID: "c", Name: "slow", Arguments: `{}`}))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	res, err := newClient(t, fake.URL).Run(ctx, "go", toolkit(t, block))
	if !errors.Is(err, context.DeadlineExceeded) || res.Status != StatusIncomplete || res.Limit != LimitTimeout || res.Turns != 1 {
		t.Errorf("Run = %+v, %v; want incomplete/timeout after 1 turn with a deadline error", res, err)
	}
}

// TestEvents: one LLM event per request and one tool event per execution; a suspension is
// pending, not an error. Durations come from the injected clock.
func TestEvents(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(
			looptest.ToolCall{ID: "c1", Name: "ask", Arguments: `{}`},
			looptest.ToolCall{ID: "c2", Name: "nope", Arguments: `{}`}),
		looptest.OpenAIText("ok"))
	var mu sync.Mutex
	var events []Event
	var tick atomic.Int64
	clock := func() time.Time { return time.Unix(0, tick.Add(int64(time.Millisecond))) }
	c := newClient(t, srv.URL, func(o *Options) {
		o.Clock = clock
		o.OnEvent = func(e Event) { mu.Lock(); events = append(events, e); mu.Unlock() }
		o.WaitFor = func(_ context.Context, r tools.Request) (tools.Answer, error) {
			return tools.AnswerOutput(r.ID, "x"), nil
		}
	})
	tk := toolkit(t, suspending("ask", tools.Request{Kind: tools.KindInput, Prompt: "?"}, func(tools.Answer) string { return "fine" }))
	if _, err := c.Run(context.Background(), "go", tk); err != nil {
		t.Fatal(err)
	}
	for i := range events {
		if events[i].Duration <= 0 {
			t.Errorf("event %d has no duration", i)
		}
		events[i].Duration = 0
	}
	llm := Event{Kind: EventLLM, Model: "gpt-4o-mini", StatusCode: 200, OK: true, PromptTokens: 10, CompletionTokens: 5}
	want := []Event{
		llm,
		{Kind: EventTool, Tool: "ask", Source: tools.SourceNative, Pending: true},
		{Kind: EventTool, Tool: "nope", IsError: true},
		{Kind: EventTool, Tool: "ask", Source: tools.SourceNative},
		llm,
	}
	if diff := cmp.Diff(want, events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestWaitForFailures(t *testing.T) {
	cases := []struct {
		name    string
		waitFor func(context.Context, tools.Request) (tools.Answer, error)
		wantErr string
	}{
		{"error aborts", func(context.Context, tools.Request) (tools.Answer, error) {
			return tools.Answer{}, errors.New("queue down")
		},
			"WaitFor for ask (request r1): queue down"},
		{"unusable answer", func(context.Context, tools.Request) (tools.Answer, error) { return tools.Answer{OK: true}, nil },
			"WaitFor answered ask unusably: state: answer to input request \"r1\" carries no result"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := looptest.New(t, looptest.OpenAIToolCalls(looptest.ToolCall{ID: "c1", Name: "ask", Arguments: `{}`}))
			c := newClient(t, srv.URL, func(o *Options) { o.WaitFor = tc.waitFor })
			tk := toolkit(t, suspending("ask", tools.Request{ID: "r1", Kind: tools.KindInput, Prompt: "?"}, func(tools.Answer) string { return "" }))
			if _, err := c.Run(context.Background(), "go", tk); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Run error = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestWaitForEachSuspensionOnce: two suspensions in one turn each reach WaitFor exactly once, in
// parallel, so a parked WaitFor for one does not block the other.
func TestWaitForEachSuspensionOnce(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(
			looptest.ToolCall{ID: "c1", Name: "first", Arguments: `{}`},
			looptest.ToolCall{ID: "c2", Name: "second", Arguments: `{}`}),
		looptest.OpenAIText("ok"))
	secondAnswered := make(chan struct{})
	var mu sync.Mutex
	seen := map[string]int{}
	c := newClient(t, srv.URL, func(o *Options) {
		o.WaitFor = func(_ context.Context, r tools.Request) (tools.Answer, error) {
			mu.Lock()
			seen[r.ID]++
			mu.Unlock()
			if r.ID == "r1" {
				<-secondAnswered // the first waits until the second is answered
			} else {
				close(secondAnswered)
			}
			return tools.Answer{ID: r.ID, OK: true}, nil
		}
	})
	approve := func(name, id string) tools.Tool {
		return suspending(name, tools.Request{ID: id, Kind: tools.KindApproval, Prompt: id}, func(tools.Answer) string { return name + " ok" })
	}
	res, err := c.Run(context.Background(), "go", toolkit(t, approve("first", "r1"), approve("second", "r2")))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int{"r1": 1, "r2": 1}, seen); diff != "" {
		t.Errorf("WaitFor calls (-want +got):\n%s", diff)
	}
	want := []toolResult{{ID: "c1", Content: "first ok"}, {ID: "c2", Content: "second ok"}}
	if diff := cmp.Diff(want, sentToolResults(t, srv.Requests()[1])); diff != "" || res.Status != StatusDone {
		t.Errorf("status %q; results (-want +got):\n%s", res.Status, diff)
	}
}

// TestResumeAfterPending: without WaitFor, Resume returns pending; answering the same State and
// resuming finishes the run.
func TestResumeAfterPending(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "c1", Name: "ask", Arguments: `{}`}),
		looptest.OpenAIText("deployed to staging"))
	c := newClient(t, srv.URL)
	tk := toolkit(t, suspending("ask", tools.Request{ID: "r1", Kind: tools.KindInput, Prompt: "Which environment?"},
		func(a tools.Answer) string { s, _ := a.OutputOf(); return s }))
	st := NewState("deploy")
	res, err := c.Resume(context.Background(), st, tk)
	if err != nil || res.Status != StatusPending || res.Pending.ID != "r1" || res.Text != "Which environment?" {
		t.Fatalf("Resume = %+v, %v; want pending on r1", res, err)
	}
	if err := st.Answer("c1", tools.AnswerOutput("r1", "staging")); err != nil {
		t.Fatal(err)
	}
	res, err = c.Resume(context.Background(), st, tk)
	if err != nil || res.Status != StatusDone || res.Text != "deployed to staging" || res.Pending != nil {
		t.Fatalf("Resume = %+v, %v; want done", res, err)
	}
}

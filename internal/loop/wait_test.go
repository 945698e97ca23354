package loop

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/tools"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// scripted is a tool whose first run starts work (returns start) and whose later runs, which must
// carry the work's handle, return the next of looks.
type scripted struct {
	mu      sync.Mutex
	start   tools.ToolResult
	looks   []func(tc *tools.ToolContext) tools.ToolResult
	starts  int
	handles []tools.Wait
	answers []*tools.Answer
}

func (s *scripted) tool(t *testing.T) tools.Tool {
	return tools.NativeTool("build", "runs long", nil, func(_ context.Context, _ map[string]any, tc *tools.ToolContext) (any, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if tc.Wait == nil {
			s.starts++
			return s.start, nil
		}
		s.handles = append(s.handles, *tc.Wait)
		s.answers = append(s.answers, tc.Answer)
		if len(s.looks) == 0 {
			t.Errorf("a look with nothing scripted (handle %+v)", *tc.Wait)
			return "unscripted", nil
		}
		next := s.looks[0]
		s.looks = s.looks[1:]
		return next(tc), nil
	})
}

func task(id string, intervalMs int64) tools.ToolResult {
	return tools.Waiting(tools.Wait{Kind: tools.WaitKindMCPTask, Server: "ci", ID: id, PollIntervalMs: intervalMs, Status: "working"})
}

func look(r tools.ToolResult) func(*tools.ToolContext) tools.ToolResult {
	return func(*tools.ToolContext) tools.ToolResult { return r }
}

// settleAt settles st at the clock's time with nothing seen, as the host does when it is woken.
func settleAt(st *State, now time.Time, p state.Policy) state.Settlement {
	return state.Settle(st, nil, nil, now, p)
}

func waitSetup(t *testing.T, s *scripted, mut ...func(*Options)) (*Client, *State, *tools.Toolkit, *fakeClock, *looptest.Server) {
	t.Helper()
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "build", Arguments: `{"ref":"main"}`}),
		looptest.OpenAIText("built"))
	clock := &fakeClock{now: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
	c := newClient(t, srv.URL, append([]func(*Options){func(o *Options) { o.Clock = clock.Now }}, mut...)...)
	st := NewState("build main")
	tk := toolkit(t, s.tool(t))
	step(t, c, st, tk, ActionModelTurn)
	step(t, c, st, tk, ActionToolCalls)
	return c, st, tk, clock, srv
}

// TestWaitParksPollsAndFinishes: a call that starts a task parks without a request, is looked at
// only when its (bounded) poll interval has passed, survives a save and load between looks, never
// starts the work again, and the work's result reaches the model.
func TestWaitParksPollsAndFinishes(t *testing.T) {
	s := &scripted{start: task("t-1", 0), looks: []func(*tools.ToolContext) tools.ToolResult{
		look(task("t-1", 86_400_000)), // a day: bounded to MaxPollInterval
		look(tools.ToolResult{Output: "artifact sha256:abc"}),
	}}
	c, st, tk, clock, srv := waitSetup(t, s)
	w := st.Calls[0].Wait
	if st.Calls[0].Phase != PhaseWaiting || w == nil || w.ID != "t-1" || w.Server != "ci" {
		t.Fatalf("call after its first run = %+v, want waiting on t-1", st.Calls[0])
	}
	if len(st.Suspended()) != 0 || st.Next() != ActionWaiting {
		t.Fatalf("a waiting call raised a request or is runnable: Next = %s", st.Next())
	}
	if want := stamp(clock.Now().Add(MinPollInterval)); w.NextPoll != want {
		t.Errorf("NextPoll = %s, want %s (pollIntervalMs 0 is bounded to %s)", w.NextPoll, want, MinPollInterval)
	}

	st = roundTrip(t, st)
	clock.Add(500 * time.Millisecond)
	if out := settleAt(st, clock.Now(), state.Policy{}); out.WakeAt.IsZero() || st.Next() != ActionWaiting {
		t.Fatalf("before the poll is due: WakeAt %v, Next %s; want a wake and Waiting", out.WakeAt, st.Next())
	}
	clock.Add(500 * time.Millisecond)
	settleAt(st, clock.Now(), state.Policy{})
	if st.Next() != ActionToolCalls {
		t.Fatalf("Next = %s once the poll is due, want ToolCalls", st.Next())
	}
	step(t, c, st, tk, ActionToolCalls)
	if w := st.Calls[0].Wait; w.Polls != 1 || w.NextPoll != stamp(clock.Now().Add(MaxPollInterval)) {
		t.Errorf("after one look: polls %d, NextPoll %s; want 1 and now + %s (a day is bounded)", w.Polls, w.NextPoll, MaxPollInterval)
	}

	st = roundTrip(t, st)
	clock.Add(MaxPollInterval)
	settleAt(st, clock.Now(), state.Policy{})
	step(t, c, st, tk, ActionToolCalls)
	step(t, c, st, tk, ActionModelTurn)
	if st.Status != StatusDone {
		t.Fatalf("status %q, want done", st.Status)
	}
	if got := sentToolResults(t, srv.Requests()[1]); len(got) != 1 || got[0].Content != "artifact sha256:abc" {
		t.Errorf("the model saw %+v, want the task's result", got)
	}
	if s.starts != 1 || len(s.handles) != 2 || s.handles[1].ID != "t-1" {
		t.Errorf("starts %d, looks %+v; want the work started once and looked at twice with its handle", s.starts, s.handles)
	}
}

// TestWaitFailedLooksBackOffThenGiveUp: looks that fail back off from the poll interval and, after
// MaxPollFailures in a row, end the call with an error the model sees; the work is then stopped.
func TestWaitFailedLooksBackOffThenGiveUp(t *testing.T) {
	failing := tools.Wait{Kind: tools.WaitKindMCPTask, Server: "ci", ID: "t-1", PollIntervalMs: 1000, PollError: "connection refused"}
	s := &scripted{start: task("t-1", 1000)}
	for range MaxPollFailures {
		s.looks = append(s.looks, look(tools.Waiting(failing)))
	}
	c, st, tk, clock, _ := waitSetup(t, s)
	for i := 1; i < MaxPollFailures; i++ {
		clock.Add(MaxPollInterval)
		settleAt(st, clock.Now(), state.Policy{})
		step(t, c, st, tk, ActionToolCalls)
		want := min(MaxPollInterval, time.Second<<i)
		if w := st.Calls[0].Wait; w.Failures != i || w.NextPoll != stamp(clock.Now().Add(want)) {
			t.Fatalf("after %d failed looks: failures %d, next %s; want next in %s", i, w.Failures, w.NextPoll, want)
		}
	}
	clock.Add(MaxPollInterval)
	settleAt(st, clock.Now(), state.Policy{})
	step(t, c, st, tk, ActionToolCalls)
	last := st.ToolCalls[len(st.ToolCalls)-1]
	if !last.IsError || !strings.Contains(last.Output, "8 looks in a row failed, the last: connection refused") {
		t.Errorf("result %q, want the failed looks named", last.Output)
	}
	out := settleAt(st, clock.Now(), state.Policy{})
	if len(out.Effects) != 1 || out.Effects[0].Kind != state.EffectCancelWait || out.Effects[0].Wait.ID != "t-1" || st.Abandoned != nil {
		t.Errorf("effects %+v, abandoned %+v; want the given-up task stopped once", out.Effects, st.Abandoned)
	}
}

// TestWaitAbandonedWorkIsStopped: a call that gave up on its work keeps the handle until Settle has
// told the host to stop the work, once.
func TestWaitAbandonedWorkIsStopped(t *testing.T) {
	s := &scripted{start: task("t-1", 1000), looks: []func(*tools.ToolContext) tools.ToolResult{
		look(tools.Waiting(tools.Wait{Kind: tools.WaitKindMCPTask, ID: "", Server: "ci"})), // a handle without an id
	}}
	c, st, tk, clock, _ := waitSetup(t, s)
	clock.Add(time.Second)
	settleAt(st, clock.Now(), state.Policy{})
	// The step records the turn at once (every call is done), so the host settles the saved state.
	c.opts.MaxTurns = 1
	step(t, c, st, tk, ActionToolCalls)
	if st.Calls != nil || !strings.Contains(st.ToolCalls[0].Output, "has an empty id") {
		t.Fatalf("calls %+v, tool calls %+v; want the turn recorded with the bad handle named", st.Calls, st.ToolCalls)
	}
	st = roundTrip(t, st)
	out := settleAt(st, clock.Now(), state.Policy{})
	if len(out.Effects) != 1 || out.Effects[0].Kind != state.EffectCancelWait || out.Effects[0].Wait.ID != "t-1" {
		t.Errorf("effects %+v, want the work the call stopped waiting on (t-1) stopped", out.Effects)
	}
}

// TestWaitDeadlineAndCancel: a wait past its deadline (the run's suspension timeout) ends the call
// with an error naming the bound and stops the work; a cancelled run stops its work too.
func TestWaitDeadlineAndCancel(t *testing.T) {
	t.Run("deadline", func(t *testing.T) {
		s := &scripted{start: task("t-1", 60_000)}
		_, st, _, clock, _ := waitSetup(t, s, func(o *Options) { o.SuspensionTimeout = 90 * time.Second })
		clock.Add(90 * time.Second)
		out := settleAt(st, clock.Now(), state.Policy{})
		if len(out.Effects) != 1 || out.Effects[0].Kind != state.EffectCancelWait || out.Effects[0].Wait.ID != "t-1" {
			t.Fatalf("effects %+v, want the task stopped", out.Effects)
		}
		if c := st.Calls[0]; c.Phase != PhaseDone || !strings.Contains(c.Result.Output, "did not finish within 1m30s") || c.Wait != nil {
			t.Errorf("call %+v, want done with the deadline named", c)
		}
		if again := settleAt(st, clock.Now(), state.Policy{}); len(again.Effects) != 0 {
			t.Errorf("a second settle stopped the work again: %+v", again.Effects)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		s := &scripted{start: task("t-1", 60_000)}
		_, st, _, clock, _ := waitSetup(t, s)
		out := settleAt(st, clock.Now(), state.Policy{Cancel: true})
		var stops int
		for _, e := range out.Effects {
			if e.Kind == state.EffectCancelWait && e.Wait.ID == "t-1" {
				stops++
			}
		}
		if stops != 1 || !st.Ended() {
			t.Errorf("effects %+v, ended %v; want the run ended and its task stopped once", out.Effects, st.Ended())
		}
	})
}

// TestWaitAsksInTurn: work that asks a person parks the call on a request and keeps its handle; the
// answer goes to the work (the tool gets both), a request of another id is a new question, and the
// same request again after its answer is unresolved (the loop rule).
func TestWaitAsksInTurn(t *testing.T) {
	ask := func(id string) tools.ToolResult {
		return tools.Pending(tools.Request{ID: id, Kind: tools.KindInput, Prompt: "Which " + id + "?"})
	}
	s := &scripted{start: task("t-1", 1000), looks: []func(*tools.ToolContext) tools.ToolResult{
		look(ask("tin-a")), look(ask("tin-b")), look(ask("tin-b")),
	}}
	c, st, tk, clock, _ := waitSetup(t, s)
	clock.Add(time.Second)
	settleAt(st, clock.Now(), state.Policy{})
	step(t, c, st, tk, ActionToolCalls)
	call := st.Calls[0]
	if call.Phase != PhaseSuspended || call.Request.ID != "tin-a" || call.Wait == nil {
		t.Fatalf("call %+v, want suspended on tin-a with its task kept", call)
	}
	st = roundTrip(t, st)
	if err := st.Answer("call_1", tools.AnswerOutput("tin-a", "eu")); err != nil {
		t.Fatal(err)
	}
	step(t, c, st, tk, ActionToolCalls)
	if call := st.Calls[0]; call.Phase != PhaseSuspended || call.Request.ID != "tin-b" {
		t.Fatalf("after answering tin-a: %+v, want a new request tin-b", call)
	}
	if a := s.answers[1]; a == nil || a.ID != "tin-a" || s.handles[1].ID != "t-1" {
		t.Errorf("the retry got answer %+v and handle %+v, want tin-a's answer for t-1", a, s.handles[1])
	}
	if err := st.Answer("call_1", tools.AnswerOutput("tin-b", "large")); err != nil {
		t.Fatal(err)
	}
	step(t, c, st, tk, ActionToolCalls)
	if st.Calls != nil {
		t.Fatalf("calls %+v, want the turn recorded", st.Calls)
	}
	if got := st.Messages[len(st.Messages)-1].Content; got != "unresolved: Which tin-b?" {
		t.Errorf("result %q, want the same request after its answer unresolved", got)
	}
	if s.starts != 1 {
		t.Errorf("the work was started %d times, want once", s.starts)
	}
}

package loop

import (
	"testing"
	"time"

	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// TestWaitWokenByItsHost: a wait its host wakes (a child run, watched) is never looked at on a
// schedule: Settle wakes the run only at its deadline, and the look comes once the host says the
// work ended (State.Wake), however much time passed before.
func TestWaitWokenByItsHost(t *testing.T) {
	child := tools.Wait{Kind: wire.WaitKindAgentRun, Server: "purchasing", ID: "parent-7f3a", Woken: true}
	s := &scripted{start: tools.Waiting(child), looks: []func(*tools.ToolContext) tools.ToolResult{
		look(tools.ToolResult{Output: "bought a gpu"}),
	}}
	c, st, tk, clock, srv := waitSetup(t, s, func(o *Options) { o.SuspensionTimeout = 72 * time.Hour })
	w := st.Calls[0].Wait
	if w == nil || w.NextPoll != w.Deadline || w.Deadline != stamp(clock.Now().Add(72*time.Hour)) {
		t.Fatalf("wait = %+v, want its next look at its deadline, the run's suspension timeout from now", w)
	}

	st = roundTrip(t, st)
	clock.Add(2 * MaxPollInterval)
	out := settleAt(st, clock.Now(), state.Policy{})
	if st.Next() != ActionWaiting || out.WakeAt.Format(time.RFC3339Nano) != w.Deadline {
		t.Fatalf("after two poll intervals: Next %s, WakeAt %v; want Waiting, woken only at the deadline %s", st.Next(), out.WakeAt, w.Deadline)
	}
	if st.Wake(wire.WaitKindAgentRun, "another-child") || st.Wake(tools.WaitKindMCPTask, child.ID) {
		t.Fatal("Wake of work no call waits on changed the state")
	}
	if !st.Wake(wire.WaitKindAgentRun, child.ID) || st.Next() != ActionToolCalls {
		t.Fatalf("Wake of the child: Next %s, want ToolCalls", st.Next())
	}
	if st.Wake(wire.WaitKindAgentRun, child.ID) {
		t.Error("a second Wake before the look changed the state")
	}
	step(t, c, st, tk, ActionToolCalls)
	step(t, c, st, tk, ActionModelTurn)
	if got := sentToolResults(t, srv.Requests()[1]); len(got) != 1 || got[0].Content != "bought a gpu" {
		t.Errorf("the model saw %+v, want the child's text", got)
	}
	if s.starts != 1 || len(s.handles) != 1 || s.handles[0].ID != child.ID {
		t.Errorf("starts %d, looks %+v; want one start and one look, with the child's handle", s.starts, s.handles)
	}
	if st.Wake(wire.WaitKindAgentRun, child.ID) {
		t.Error("Wake of an ended run changed the state")
	}
}

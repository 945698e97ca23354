package state

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/tools/wire"
)

// A clone equals its state, and advancing it (as a step does: new messages, calls parked,
// answered, finished, the run ended) leaves the state as it was saved.
func TestClone(t *testing.T) {
	st := turn(parked("a"), parked("b"))
	st.Messages = append(st.Messages, Message{Role: RoleAssistant, ToolCalls: []MessageToolCall{{ID: "a", Name: "deploy", Arguments: "{}"}}})
	st.ToolCalls = []ToolCall{{ID: "x", Name: "deploy", Output: "ok", Turn: 1}}
	st.Calls[1].Answer = &wire.Answer{ID: "req-b", OK: true}
	st.Calls[1].Phase = PhaseAnswered
	saved, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	c := st.Clone()
	if diff := cmp.Diff(st, c); diff != "" {
		t.Fatalf("clone (-state +clone):\n%s", diff)
	}
	c.Messages[1].ToolCalls[0].Name = "drop_db"
	c.Messages = append(c.Messages, Message{Role: RoleTool, Content: "done"})
	c.ToolCalls[0].Output = "changed"
	c.Calls[0].Request.Prompt = "changed"
	c.Calls[0].Announced.UID = "changed"
	c.Calls[1].Answer.OK = false
	c.Calls[0].Phase, c.Calls[0].Result = PhaseDone, &wire.ToolResult{Output: "r"}
	c.Calls[0].Result.Output = "changed"
	c.End(ReasonCancelled, "stop")
	c.Turn++
	after, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(saved), string(after)); diff != "" {
		t.Errorf("advancing the clone changed the state (-saved +after):\n%s", diff)
	}
}

package loop

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
)

// BenchmarkTurn measures one model turn that asks for one tool call, plus that call, against a
// zero-latency endpoint: the loop's own overhead per turn (SDK encoding, HTTP, state bookkeeping).
func BenchmarkTurn(b *testing.B) {
	reply := looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "echo", Arguments: `{"x":1}`}).Body
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, reply)
	}))
	defer srv.Close()
	c := newClient(b, srv.URL)
	tk := toolkit(b, echoTool())
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		st := NewState("go")
		if _, err := c.Step(ctx, st, tk); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Step(ctx, st, tk); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStateRoundTrip measures persisting and loading a 200-turn state, what the controller
// pays per step on a long run.
func BenchmarkStateRoundTrip(b *testing.B) {
	st := NewState("start")
	output := strings.Repeat("tool output ", 20)
	for turn := 1; turn <= 200; turn++ {
		id := fmt.Sprintf("call_%d", turn)
		st.Messages = append(st.Messages,
			Message{Role: RoleAssistant, Content: "thinking", ToolCalls: []MessageToolCall{{ID: id, Name: "echo", Arguments: `{"x":1}`}}},
			Message{Role: RoleTool, ToolCallID: id, Content: output})
		st.ToolCalls = append(st.ToolCalls, ToolCall{ID: id, Name: "echo", Arguments: `{"x":1}`, Output: output, Turn: turn})
	}
	st.Turn, st.ToolCallCount = 200, 200
	req := tools.Request{ID: "r1", Kind: tools.KindApproval, Prompt: "Approve?"}
	st.Calls = []Call{{ID: "call_201", Name: "echo", Arguments: `{}`, Phase: PhaseSuspended, Request: &req}}
	raw, _ := json.Marshal(st)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		raw, err := json.Marshal(st)
		if err != nil {
			b.Fatal(err)
		}
		var fresh State
		if err := json.Unmarshal(raw, &fresh); err != nil {
			b.Fatal(err)
		}
	}
}

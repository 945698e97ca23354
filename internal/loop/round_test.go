package loop

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// roundSetup runs the model's call of tool (an input server's, or one of extra) up to its first
// result, and returns what the test steps on.
func roundSetup(t *testing.T, tool string, extra ...tools.Tool) (*Client, *State, *tools.Toolkit, *toolstest.InputServer, *looptest.Server) {
	t.Helper()
	is := toolstest.ServeInputs(t)
	srv, err := tools.ConnectMCP(context.Background(), tools.MCPServerSpec{Name: "inputs", URL: is.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("ConnectMCP: %v", err)
	}
	model := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: tool, Arguments: `{"env":"prod"}`}),
		looptest.OpenAIText("done"))
	c := newClient(t, model.URL, func(o *Options) { o.SuspensionTimeout = time.Hour })
	st := NewState("go")
	tk := toolkit(t, append(srv.Tools(), extra...)...)
	step(t, c, st, tk, ActionModelTurn)
	step(t, c, st, tk, ActionToolCalls)
	return c, st, tk, is, model
}

func answerRequest(t *testing.T, st *State, id string, a tools.Answer) {
	t.Helper()
	a.ID = id
	if err := st.Answer("call_1", a); err != nil {
		t.Fatalf("Answer %s: %v", id, err)
	}
}

// finish takes the retry and the model's last turn, and returns what the model saw of the call.
func finish(t *testing.T, c *Client, st *State, tk *tools.Toolkit, model *looptest.Server) toolResult {
	t.Helper()
	step(t, c, st, tk, ActionToolCalls)
	step(t, c, st, tk, ActionModelTurn)
	if st.Status != StatusDone {
		t.Fatalf("status %q, want done: the run goes on", st.Status)
	}
	return seen(t, st, model)
}

// seen is what the model saw of the call (its last request), with the error flag the record keeps
// (the OpenAI style carries none).
func seen(t *testing.T, st *State, model *looptest.Server) toolResult {
	t.Helper()
	got := sentToolResults(t, model.Requests()[1])
	if len(got) != 1 || len(st.ToolCalls) == 0 {
		t.Fatalf("the model saw %d results, want 1", len(got))
	}
	got[0].IsError = st.ToolCalls[len(st.ToolCalls)-1].IsError
	return got[0]
}

// TestRoundTwoRequestsAnsweredApart: a result asking two things is one suspended call with two
// requests; each answer is taken on its own (the call runs only once both are in, whatever the
// order, across a save and load), and the one retry carries both with the requestState as given.
func TestRoundTwoRequestsAnsweredApart(t *testing.T) {
	c, st, tk, is, model := roundSetup(t, "inputs_provision")
	call := st.Calls[0]
	asks := call.Asks()
	if call.Phase != PhaseSuspended || call.Round == nil || len(asks) != 2 {
		t.Fatalf("call = %+v, want suspended on a round of two requests", call)
	}
	if call.Round.Resume != is.Issued()[0] || call.Round.Number != 1 {
		t.Errorf("round %+v, want number 1 and the server's requestState verbatim", call.Round)
	}
	if asks[0].Request.ExpiresAt == "" || asks[1].Request.ExpiresAt == "" {
		t.Errorf("requests %+v, want each to expire with the suspension timeout", asks)
	}
	if got := len(st.Open()); got != 2 {
		t.Fatalf("Open lists %d requests, want 2", got)
	}

	region := asks[1].Request
	answerRequest(t, st, region.ID, tools.Answer{OK: true, Data: map[string]any{"region": "us"}})
	st = roundTrip(t, st)
	if st.Next() != ActionWaiting || len(st.Open()) != 1 || st.Open()[0].Ask.Request.ID != asks[0].Request.ID {
		t.Fatalf("after one answer: Next %s, open %+v; want the call still waiting on the consent", st.Next(), st.Open())
	}
	if err := st.Answer("call_1", tools.Answer{ID: region.ID, OK: true, Data: map[string]any{"region": "eu"}}); err == nil {
		t.Errorf("a second answer to the region was taken")
	}
	answerRequest(t, st, asks[0].Request.ID, tools.Answer{OK: true})
	if st.Next() != ActionToolCalls {
		t.Fatalf("Next = %s once both are answered, want ToolCalls", st.Next())
	}
	if got := finish(t, c, st, tk, model); got.Content != "provisioned in us (consent: accept)" || got.IsError {
		t.Errorf("the model saw %+v, want the tool's result with both answers", got)
	}
	if n := is.Calls("provision"); n != 2 {
		t.Errorf("tools/call reached the tool %d times, want 2 (the call and one retry)", n)
	}
	if echoed := is.Echoed(); len(echoed) != 1 || echoed[0] != is.Issued()[0] {
		t.Errorf("requestStates sent back %d, want the one issued, verbatim", len(echoed))
	}
}

// TestRoundRefusalOfOneRequest: declining one request of a round finishes the call with that
// request's prompt; the tool is not called again and the other request is no longer waited on.
func TestRoundRefusalOfOneRequest(t *testing.T) {
	c, st, tk, is, model := roundSetup(t, "inputs_provision")
	asks := st.Calls[0].Asks()
	answerRequest(t, st, asks[1].Request.ID, tools.AnswerDeclined("", ""))
	if len(st.Open()) != 0 || st.Next() != ActionToolCalls {
		t.Fatalf("after a refusal: open %+v, Next %s; want nothing open and the turn to record", st.Open(), st.Next())
	}
	got := finish(t, c, st, tk, model)
	if want := "declined/expired: Which region?\nreason: declined"; got.Content != want || !got.IsError {
		t.Errorf("the model saw %+v, want %q", got, want)
	}
	if n := is.Calls("provision"); n != 1 {
		t.Errorf("tools/call reached the tool %d times, want 1", n)
	}
}

// TestRoundAskedAgain is the rule after the retry: the same request again is unresolved; other
// input is the call's next round, answered like the first.
func TestRoundAskedAgain(t *testing.T) {
	c, st, tk, _, model := roundSetup(t, "inputs_again")
	answerRequest(t, st, st.Calls[0].Request.ID, tools.Answer{OK: true, Data: map[string]any{"region": "eu"}})
	if got := finish(t, c, st, tk, model); got.Content != "unresolved: Which region?" || !got.IsError {
		t.Errorf("the model saw %+v, want unresolved", got)
	}

	c, st, tk, is, model := roundSetup(t, "inputs_wizard")
	answerRequest(t, st, st.Calls[0].Request.ID, tools.Answer{OK: true, Data: map[string]any{"name": "Ada"}})
	step(t, c, st, tk, ActionToolCalls)
	call := st.Calls[0]
	if call.Phase != PhaseSuspended || call.Round == nil || call.Round.Number != 2 || call.Request.Prompt != "Your favourite color?" || call.Answer != nil {
		t.Fatalf("after the first retry: %+v, want suspended on round 2 asking the color", call)
	}
	answerRequest(t, st, call.Request.ID, tools.Answer{OK: true, Data: map[string]any{"color": "teal"}})
	if got := finish(t, c, st, tk, model); got.Content != "Ada likes teal" {
		t.Errorf("the model saw %+v, want the wizard's result", got)
	}
	if n := is.Calls("wizard"); n != 3 {
		t.Errorf("tools/call reached the tool %d times, want 3", n)
	}
}

// TestRoundRefusedState: a requestState the server refuses on the retry (changed in the record,
// or expired) is the call's error result; the run goes on.
func TestRoundRefusedState(t *testing.T) {
	for _, tt := range []struct {
		name   string
		meddle func(*State, *toolstest.InputServer)
	}{
		{"tampered", func(st *State, _ *toolstest.InputServer) { st.Calls[0].Round.Resume += "0" }},
		{"expired", func(_ *State, is *toolstest.InputServer) { is.RotateKey() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, st, tk, is, model := roundSetup(t, "inputs_grant")
			answerRequest(t, st, st.Calls[0].Request.ID, tools.Answer{OK: true})
			tt.meddle(st, is)
			got := finish(t, c, st, tk, model)
			if !got.IsError || !strings.Contains(got.Content, "MCP server inputs: tool grant: ") ||
				!strings.Contains(got.Content, "requestState refused: it was tampered with or has expired") {
				t.Errorf("the model saw %+v, want the server's refusal", got)
			}
		})
	}
}

// TestRoundBadInput: a round no record or PendingRequest can hold is an error result the model
// sees, naming the bound; so is a server that sheds the call.
func TestRoundBadInput(t *testing.T) {
	c, st, tk, _, model := roundSetup(t, "inputs_bulky")
	got := modelSees(t, c, st, tk, model)
	want := "inputs_bulky cannot wait for its answers: the state it asks to be handed back with the answers (requestState) is "
	if !got.IsError || !strings.HasPrefix(got.Content, want) || !strings.HasSuffix(got.Content, "at most 65536 fit in the run's record") {
		t.Errorf("the model saw %q, want the bound named", got.Content)
	}

	c, st, tk, _, model = roundSetup(t, "inputs_shed")
	if got := modelSees(t, c, st, tk, model); !got.IsError || !strings.Contains(got.Content, "input_required without any input request") {
		t.Errorf("the model saw %q, want the shed call named", got.Content)
	}

	many := tools.NativeTool("many", "asks a lot", nil, func(context.Context, map[string]any, *tools.ToolContext) (any, error) {
		r := tools.Round{}
		for i := range wire.MaxRoundAsks + 1 {
			r.Asks = append(r.Asks, tools.Ask{Key: fmt.Sprint(i), Request: tools.Request{Kind: tools.KindInput, Prompt: "?"}})
		}
		return tools.Asking(r), nil
	})
	c, st, tk, _, model = roundSetup(t, "many", many)
	if got := modelSees(t, c, st, tk, model); got.Content != "many cannot wait for its answers: it asks 17 requests at once; at most 16 are answered" {
		t.Errorf("the model saw %q, want the bound named", got.Content)
	}
}

// TestRoundsAreBounded: a tool that asks new input after every answer is stopped after
// MaxInputRounds rounds.
func TestRoundsAreBounded(t *testing.T) {
	rounds := 0
	endless := tools.NativeTool("endless", "asks forever", nil, func(context.Context, map[string]any, *tools.ToolContext) (any, error) {
		rounds++
		return tools.Asking(tools.Round{Asks: []tools.Ask{{Key: "q", Request: tools.Request{ID: fmt.Sprint("q-", rounds), Kind: tools.KindInput, Prompt: "More?"}}}}), nil
	})
	c, st, tk, _, model := roundSetup(t, "endless", endless)
	for n := 1; n <= MaxInputRounds; n++ {
		call := st.Calls[0]
		if call.Round == nil || call.Round.Number != n {
			t.Fatalf("round %d: call %+v", n, call)
		}
		answerRequest(t, st, call.Request.ID, tools.Answer{OK: true, Data: map[string]any{"output": "yes"}})
		step(t, c, st, tk, ActionToolCalls)
	}
	step(t, c, st, tk, ActionModelTurn)
	got := []toolResult{seen(t, st, model)}
	if want := "endless cannot wait for its answers: it asked for input again after 10 rounds of answers; at most 10 rounds are answered"; len(got) != 1 || got[0].Content != want {
		t.Errorf("the model saw %+v, want %q", got, want)
	}
}

// modelSees takes the model's turn after a call that ended with its first result.
func modelSees(t *testing.T, c *Client, st *State, tk *tools.Toolkit, model *looptest.Server) toolResult {
	t.Helper()
	if st.Next() != ActionModelTurn {
		t.Fatalf("Next = %s, want the model's turn: the call ended (%+v)", st.Next(), st.Calls)
	}
	step(t, c, st, tk, ActionModelTurn)
	return seen(t, st, model)
}

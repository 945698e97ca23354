package tools_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// inputServer connects an input server speaking versions (2026-07-28 first when none).
func inputServer(t *testing.T, versions ...string) (*toolstest.InputServer, *tools.Toolkit, *tools.MCPServer) {
	t.Helper()
	is := toolstest.ServeInputs(t, versions...)
	srv, err := tools.ConnectMCP(context.Background(), tools.MCPServerSpec{Name: "inputs", URL: is.URL, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("ConnectMCP: %v", err)
	}
	tk, err := tools.NewToolkit(srv.Tools()...)
	if err != nil {
		t.Fatal(err)
	}
	return is, tk, srv
}

func ask(tk *tools.Toolkit, tool string, r *tools.Round) tools.ToolResult {
	return tk.Execute(context.Background(), "inputs_"+tool, map[string]any{"env": "prod"}, &tools.ToolContext{CallID: "call_1", Round: r})
}

func mustRound(t *testing.T, r tools.ToolResult) *tools.Round {
	t.Helper()
	round := tools.RoundOf(r)
	if round == nil {
		t.Fatalf("result %+v, want a round of input requests", r)
	}
	return round
}

// answered is round with every request answered ok, with data by key.
func answered(round *tools.Round, data map[string]map[string]any) *tools.Round {
	out := &tools.Round{Resume: round.Resume}
	for _, a := range round.Asks {
		a.Answer = &tools.Answer{ID: a.Request.ID, OK: true, Data: data[a.Key]}
		out.Asks = append(out.Asks, a)
	}
	return out
}

// TestMCPRoundTwoInputs: an input_required result with two input requests is one round of two
// requests (a form → input with data.schema, a URL → authorization), with the requestState kept
// verbatim; the retry carries both answers and that requestState, and its result is the tool's.
func TestMCPRoundTwoInputs(t *testing.T) {
	is, tk, srv := inputServer(t)
	if got := srv.Revision(); got != tools.RevisionStateless {
		t.Fatalf("Revision = %q, want %q", got, tools.RevisionStateless)
	}
	first := ask(tk, "provision", nil)
	round := mustRound(t, first)
	want := &tools.Round{Resume: is.Issued()[0], Asks: []tools.Ask{
		{Key: "consent", Request: tools.Request{Kind: tools.KindAuthorization, Prompt: "Grant access to the project", URL: toolstest.ConsentURL,
			Data: map[string]any{"elicitationId": "el-consent"}}},
		{Key: "region", Request: tools.Request{Kind: tools.KindInput, Prompt: "Which region?", Data: map[string]any{"schema": toolstest.RegionSchema}}},
	}}
	if diff := cmp.Diff(want, round, cmpopts.IgnoreFields(tools.Request{}, "ID")); diff != "" {
		t.Fatalf("round (-want +got):\n%s", diff)
	}
	if p := tools.PendingOf(first); p == nil || p.ID != round.Asks[0].Request.ID {
		t.Errorf("PendingOf = %+v, want the round's first request", p)
	}
	if round.Asks[0].Request.ID == round.Asks[1].Request.ID {
		t.Errorf("the two requests share the id %q", round.Asks[0].Request.ID)
	}
	again := mustRound(t, ask(tk, "provision", nil))
	for i := range round.Asks {
		if again.Asks[i].Request.ID != round.Asks[i].Request.ID {
			t.Errorf("asked again, request %s has id %q, first %q: ids must be stable", round.Asks[i].Key, again.Asks[i].Request.ID, round.Asks[i].Request.ID)
		}
	}

	got := ask(tk, "provision", answered(round, map[string]map[string]any{"region": {"region": "eu"}}))
	if diff := cmp.Diff(tools.ToolResult{Output: "provisioned in eu (consent: accept)"}, got); diff != "" {
		t.Errorf("retry (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{is.Issued()[0]}, is.Echoed()); diff != "" {
		t.Errorf("requestStates sent back (-want +got):\n%s", diff)
	}
	if n := is.Calls("provision"); n != 3 {
		t.Errorf("tools/call reached the tool %d times, want 3 (two first calls, one retry)", n)
	}
}

// TestMCPRoundURL: a URL input request alone is an authorization round; the retry accepts it.
func TestMCPRoundURL(t *testing.T) {
	_, tk, _ := inputServer(t)
	round := mustRound(t, ask(tk, "grant", nil))
	if len(round.Asks) != 1 || round.Asks[0].Request.Kind != tools.KindAuthorization || round.Asks[0].Request.URL != toolstest.ConsentURL {
		t.Fatalf("round %+v, want one authorization at %s", round, toolstest.ConsentURL)
	}
	if got := ask(tk, "grant", answered(round, nil)); got.Output != "granted (accept)" || got.IsError {
		t.Errorf("retry = %+v, want granted (accept)", got)
	}
}

// TestMCPRoundRefusedState: a requestState changed on the way, or one the server no longer
// accepts (its key rotated: expired), is refused by the server; the call's result is that error.
func TestMCPRoundRefusedState(t *testing.T) {
	is, tk, _ := inputServer(t)
	round := mustRound(t, ask(tk, "provision", nil))
	data := map[string]map[string]any{"region": {"region": "us"}}

	tampered := answered(round, data)
	tampered.Resume = strings.Replace(tampered.Resume, ".", ".0", 1)
	got := ask(tk, "provision", tampered)
	const want = "requestState refused: it was tampered with or has expired"
	if !got.IsError || !strings.HasPrefix(got.Output, "MCP server inputs: tool provision: ") || !strings.Contains(got.Output, want) {
		t.Errorf("tampered retry = %+v, want an error result naming the server, the tool and %q", got, want)
	}

	is.RotateKey()
	if got := ask(tk, "provision", answered(round, data)); !got.IsError || !strings.Contains(got.Output, want) {
		t.Errorf("retry after the key rotated = %+v, want the error %q", got, want)
	}
}

// TestMCPRoundBadInput: input_required without any input request is a clear error result; a
// requestState past the record's bound is kept as given, and the round's bounds say so (the loop
// checks them before it parks a call).
func TestMCPRoundBadInput(t *testing.T) {
	_, tk, _ := inputServer(t)
	shed := ask(tk, "shed", nil)
	if want := "MCP server inputs: tool shed: the server answered input_required without any input request"; !shed.IsError || !strings.HasPrefix(shed.Output, want) || tools.RoundOf(shed) != nil {
		t.Errorf("shed = %+v, want an error result starting %q", shed, want)
	}
	bulky := mustRound(t, ask(tk, "bulky", nil))
	err := bulky.CheckBounds()
	if err == nil || !strings.Contains(err.Error(), "(requestState) is ") || !strings.Contains(err.Error(), "at most 65536 fit in the run's record") {
		t.Errorf("CheckBounds of a %d-byte requestState = %v, want the bound named", len(bulky.Resume), err)
	}
}

// TestMCPRoundAskedAgain: what the server asks after the retry comes back as another round; the
// same question has the same id (the loop makes it unresolved), another question another id (the
// loop's next round).
func TestMCPRoundAskedAgain(t *testing.T) {
	_, tk, _ := inputServer(t)
	first := mustRound(t, ask(tk, "again", nil))
	second := mustRound(t, ask(tk, "again", answered(first, map[string]map[string]any{"region": {"region": "eu"}})))
	if second.Asks[0].Request.ID != first.Asks[0].Request.ID || second.Resume == first.Resume {
		t.Errorf("asked again: id %q (first %q), requestState changed %v; want the same id and a new requestState",
			second.Asks[0].Request.ID, first.Asks[0].Request.ID, second.Resume != first.Resume)
	}

	name := mustRound(t, ask(tk, "wizard", nil))
	color := mustRound(t, ask(tk, "wizard", answered(name, map[string]map[string]any{"name": {"name": "Ada"}})))
	if color.Asks[0].Key != "color" || color.Asks[0].Request.ID == name.Asks[0].Request.ID {
		t.Fatalf("second round %+v, want the color, under a new id", color)
	}
	if got := ask(tk, "wizard", answered(color, map[string]map[string]any{"color": {"color": "teal"}})); got.Output != "Ada likes teal" {
		t.Errorf("last retry = %+v, want Ada likes teal", got)
	}
}

// TestMCPRoundLegacyElicits: a 2025-11-25 server asks the same tool's input with elicitation/create
// within the call: the elicitation bridge's suspension, answered by re-executing the call.
func TestMCPRoundLegacyElicits(t *testing.T) {
	_, tk, srv := inputServer(t, tools.RevisionLegacy)
	if got := srv.Revision(); got != tools.RevisionLegacy {
		t.Fatalf("Revision = %q, want %q", got, tools.RevisionLegacy)
	}
	first := ask(tk, "grant", nil)
	req := tools.PendingOf(first)
	if tools.RoundOf(first) != nil || req == nil || req.Kind != tools.KindAuthorization {
		t.Fatalf("first = %+v, want a single authorization suspension (the bridge's)", first)
	}
	got := tk.Execute(context.Background(), "inputs_grant", nil, &tools.ToolContext{CallID: "call_1", Answer: &tools.Answer{ID: req.ID, OK: true}})
	if got.Output != "granted (accept)" || got.IsError {
		t.Errorf("re-execution = %+v, want granted (accept)", got)
	}
}

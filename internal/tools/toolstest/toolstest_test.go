package toolstest_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// The fake is checked against the project's own HTTP tool client: what the client sends is what
// the fake records, and what the fake answers is what the client reads.
func TestServeSpeaksTheHTTPToolProtocol(t *testing.T) {
	req := tools.Request{ID: "r1", Kind: tools.KindApproval, Prompt: "approve?"}
	srv := toolstest.Serve(t, func(c toolstest.Call) (int, string) {
		if c.Answer == nil {
			return http.StatusOK, toolstest.Pending(req)
		}
		return http.StatusOK, "bought " + fmt.Sprint(c.Args["item"])
	})
	tool, err := tools.HTTPTool(tools.HTTPToolSpec{Name: "buy", URL: srv.URL + "/buy", Client: http.DefaultClient,
		Headers: []tools.Header{{Name: "Authorization", Value: "Bearer k"}}})
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]any{"item": "gpu"}
	first, err := tool.Execute(context.Background(), args, &tools.ToolContext{IdempotencyKey: "run/call_1"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&req, tools.PendingOf(first)); diff != "" {
		t.Fatalf("first call: pending (-want +got):\n%s", diff)
	}
	answer := tools.Answer{ID: "r1", OK: true}
	retry, err := tool.Execute(context.Background(), args, &tools.ToolContext{IdempotencyKey: "run/call_1/answer", Answer: &answer})
	if err != nil {
		t.Fatal(err)
	}
	if retry.Output != "bought gpu" {
		t.Errorf("retry output %q, want %q", retry.Output, "bought gpu")
	}

	want := []toolstest.Call{
		{Method: "POST", Path: "/buy", Args: args, IdempotencyKey: "run/call_1"},
		{Method: "POST", Path: "/buy", Args: args, IdempotencyKey: "run/call_1/answer", Answer: &answer},
	}
	calls := srv.Calls()
	if diff := cmp.Diff(want, calls, cmpopts.IgnoreFields(toolstest.Call{}, "Body", "Header")); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	for i, c := range calls {
		if got := c.Header.Get("Authorization"); got != "Bearer k" {
			t.Errorf("call %d: Authorization %q, want the spec's header", i, got)
		}
	}
}

// recordingT keeps the failures a malformed call causes instead of failing the test.
type recordingT struct {
	*testing.T
	errors []string
}

func (r *recordingT) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func TestServeRefusesAMalformedAnswer(t *testing.T) {
	rt := &recordingT{T: t}
	srv := toolstest.Serve(rt, func(toolstest.Call) (int, string) { return http.StatusOK, "ran" })
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/x", strings.NewReader("{}"))
	req.Header.Set(tools.AnswerHeader, "eyJvayI6dHJ1ZX0=") // padded: not the protocol's encoding
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("status %d, want 400", resp.StatusCode)
	}
	if len(rt.errors) != 1 || !strings.Contains(rt.errors[0], "base64url without padding") {
		t.Errorf("test errors %q, want one naming the encoding", rt.errors)
	}
	if calls := srv.Calls(); len(calls) != 0 {
		t.Errorf("recorded %d calls, want none", len(calls))
	}
}

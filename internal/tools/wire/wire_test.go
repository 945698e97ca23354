package wire

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestSuspensionWireKeys pins the JSON bytes of Request, Answer and ToolResult: they are the
// toolnexus wire contract (TestPendingWireKeys) and the PendingRequest schema.
func TestSuspensionWireKeys(t *testing.T) {
	cases := []struct {
		name string
		v    any
		want string
	}{
		{"request full", Request{ID: "r1", Kind: KindInput, Prompt: "p", URL: "u", Data: map[string]any{"k": "v"}, ExpiresAt: "2026-01-01T00:00:00Z"},
			`{"id":"r1","kind":"input","prompt":"p","url":"u","data":{"k":"v"},"expiresAt":"2026-01-01T00:00:00Z"}`},
		{"request minimal", Request{ID: "r1", Kind: KindApproval, Prompt: "p"}, `{"id":"r1","kind":"approval","prompt":"p"}`},
		{"answer ok", Answer{ID: "r1", OK: true, Data: map[string]any{"k": "v"}}, `{"id":"r1","ok":true,"data":{"k":"v"}}`},
		{"answer declined", AnswerDeclined("r1", ""), `{"id":"r1","ok":false,"reason":"declined"}`},
		{"answer bare", Answer{OK: true}, `{"id":"","ok":true}`},
		{"result", ToolResult{Output: "x"}, `{"output":"x","isError":false}`},
		{"result with metadata", ToolResult{Output: "x", IsError: true, Metadata: map[string]any{"status": 500}},
			`{"output":"x","isError":true,"metadata":{"status":500}}`},
	}
	for _, tc := range cases {
		got, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if string(got) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}

func TestPending(t *testing.T) {
	r := Pending(Request{Kind: KindAuthorization, Prompt: "Sign in", URL: "https://x/login"})
	if r.Output != "Sign in\nhttps://x/login" || !r.IsError {
		t.Errorf("Pending = %q (isError %v), want prompt, newline, url as an error result", r.Output, r.IsError)
	}
	req := PendingOf(r)
	if req == nil || !strings.HasPrefix(req.ID, "pnd-") {
		t.Fatalf("PendingOf = %+v, want a generated pnd- id", req)
	}
	if other := PendingOf(Pending(Request{Kind: KindInput})); other.ID == req.ID {
		t.Errorf("two suspensions share id %q", req.ID)
	}
	if got := PendingOf(Pending(Request{ID: "mine", Kind: KindInput, Prompt: "p"})); got.ID != "mine" {
		t.Errorf("an explicit id was replaced: %q", got.ID)
	}
	if r := Pending(Request{Kind: KindApproval, Prompt: "Approve?"}); r.Output != "Approve?" {
		t.Errorf("without a URL the output is the prompt, got %q", r.Output)
	}
}

func TestAuthRequired(t *testing.T) {
	for _, tc := range []struct{ prompt, want string }{{"", DefaultAuthPrompt}, {"Sign in to read your calendar", "Sign in to read your calendar"}} {
		req := PendingOf(AuthRequired("https://x/login", tc.prompt))
		got := []string{req.Kind, req.URL, req.Prompt}
		if diff := cmp.Diff([]string{KindAuthorization, "https://x/login", tc.want}, got); diff != "" {
			t.Errorf("AuthRequired(prompt %q) kind, url, prompt (-want +got):\n%s", tc.prompt, diff)
		}
	}
}

func TestPendingOf(t *testing.T) {
	req := Request{ID: "r1", Kind: KindInput, Prompt: "Which?", Data: map[string]any{"schema": map[string]any{"type": "object"}}}
	// A suspension that went through JSON (the HTTP wire, a persisted state) is still one.
	raw, _ := json.Marshal(Pending(req))
	var viaJSON ToolResult
	if err := json.Unmarshal(raw, &viaJSON); err != nil {
		t.Fatal(err)
	}
	if _, isMap := viaJSON.Metadata["pending"].(map[string]any); !isMap {
		t.Fatalf("test premise: metadata.pending should decode as a map, got %T", viaJSON.Metadata["pending"])
	}
	cases := []struct {
		name string
		r    ToolResult
		want *Request
	}{
		{"value", ToolResult{Metadata: map[string]any{"pending": req}}, &req},
		{"pointer", ToolResult{Metadata: map[string]any{"pending": &req}}, &req},
		{"through JSON", viaJSON, &req},
		{"no metadata", ToolResult{Output: "x"}, nil},
		{"nil pending", ToolResult{Metadata: map[string]any{"pending": nil}}, nil},
		{"not a request", ToolResult{Metadata: map[string]any{"pending": "yes"}}, nil},
		{"map without kind or prompt", ToolResult{Metadata: map[string]any{"pending": map[string]any{"id": "x"}}}, nil},
		{"map of the wrong shape", ToolResult{Metadata: map[string]any{"pending": map[string]any{"kind": 3}}}, nil},
	}
	for _, tc := range cases {
		if diff := cmp.Diff(tc.want, PendingOf(tc.r)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

func TestAnswerHelpers(t *testing.T) {
	if diff := cmp.Diff(Answer{ID: "r1", OK: true, Data: map[string]any{"output": "blue"}}, AnswerOutput("r1", "blue")); diff != "" {
		t.Errorf("AnswerOutput (-want +got):\n%s", diff)
	}
	if got := AnswerDeclined("r1", ReasonExpired); got.Reason != ReasonExpired || got.OK {
		t.Errorf("AnswerDeclined with a reason = %+v", got)
	}
	recognised := []struct {
		data map[string]any
		want bool
	}{
		{map[string]any{"output": "x"}, true},
		{map[string]any{"results": []any{}}, true},
		{map[string]any{"value": "x"}, false},
		{map[string]any{"answers": []any{"x"}}, false},
		{nil, false},
	}
	for _, tc := range recognised {
		if got := (Answer{OK: true, Data: tc.data}).HasRecognisedKey(); got != tc.want {
			t.Errorf("HasRecognisedKey(%v) = %v, want %v", tc.data, got, tc.want)
		}
	}
	if diff := cmp.Diff([]string{ResultsKey, OutputKey}, RecognisedKeys); diff != "" {
		t.Errorf("RecognisedKeys must be in precedence order (-want +got):\n%s", diff)
	}
}

func TestOutputOf(t *testing.T) {
	if s, err := AnswerOutput("r", "x").OutputOf(); s != "x" || err != nil {
		t.Errorf("OutputOf = %q, %v", s, err)
	}
	if _, err := (Answer{OK: true}).OutputOf(); !errors.Is(err, ErrNoOutput) {
		t.Errorf("absent output: err = %v, want ErrNoOutput", err)
	}
	_, err := (Answer{OK: true, Data: map[string]any{"output": 42.0}}).OutputOf()
	if err == nil || err.Error() != `answer data["output"] is float64, want a string` {
		t.Errorf("non-string output: err = %v", err)
	}
	if diff := cmp.Diff([]string{"a", "b", "output"}, (Answer{Data: map[string]any{"output": 1, "b": 2, "a": 3}}).DataKeys()); diff != "" {
		t.Errorf("DataKeys (-want +got):\n%s", diff)
	}
}

// The tool-level examples of the seed documents (reference/seeds/), ported one to one.

// ToolResult.AuthRequired, example 1: the default prompt.
func TestSeedAuthRequired1DefaultPrompt(t *testing.T) {
	res := AuthRequired("https://example.com/login", "")
	if !res.IsError {
		t.Fatal("a parked call is not a success")
	}
	req := PendingOf(res)
	if req.Kind != "authorization" || req.URL != "https://example.com/login" || req.Prompt != "Authorization required to continue" {
		t.Errorf("request = %+v", req)
	}
}

// Answer.output, example 1: build the Answer for a resolved Request.
func TestSeedAnswerOutput1(t *testing.T) {
	a := AnswerOutput("req-1", "blue")
	out, err := a.OutputOf()
	if !a.OK || out != "blue" || err != nil || a.Reason != "" {
		t.Errorf("AnswerOutput = %+v (output %q, %v)", a, out, err)
	}
}

// Answer.output, example 2: a waitFor resolving an input Request with a typed reply echoes its id.
func TestSeedAnswerOutput2EchoesTheRequestID(t *testing.T) {
	req := PendingOf(Pending(Request{Kind: KindInput, Prompt: "Which environment?"}))
	resolved := AnswerOutput(req.ID, "staging")
	if out, _ := resolved.OutputOf(); !resolved.OK || resolved.ID != req.ID || out != "staging" {
		t.Errorf("resolved = %+v", resolved)
	}
}

// Answer.output, example 3: output() sets a recognised key, and output is the second of the
// recognised keys (results first). The loop's refusal of an ok answer without a result is ported
// in internal/loop.
func TestSeedAnswerOutput3RecognisedKeys(t *testing.T) {
	if !AnswerOutput("req-1", "ok").HasRecognisedKey() {
		t.Error("AnswerOutput must set a recognised key")
	}
	if RecognisedKeys[1] != OutputKey {
		t.Errorf("RecognisedKeys = %v", RecognisedKeys)
	}
}

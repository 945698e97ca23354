package tools

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestNativeToolMapping(t *testing.T) {
	pending := Pending(Request{ID: "r1", Kind: KindApproval, Prompt: "ok?"})
	cases := []struct {
		name string
		ret  any
		err  error
		want ToolResult
	}{
		{"string", "hello", nil, ToolResult{Output: "hello"}},
		{"tool result", ToolResult{Output: "x", IsError: true}, nil, ToolResult{Output: "x", IsError: true}},
		{"suspension", pending, nil, pending},
		{"result pointer", &ToolResult{Output: "p"}, nil, ToolResult{Output: "p"}},
		{"nil result pointer", (*ToolResult)(nil), nil, ToolResult{}},
		{"nil", nil, nil, ToolResult{}},
		{"value as JSON", map[string]any{"a": 1}, nil, ToolResult{Output: `{"a":1}`}},
		{"error", "ignored", errors.New("boom"), ToolResult{Output: "boom", IsError: true}},
		{"not JSON", make(chan int), nil, ToolResult{Output: "tool returned a value that is not JSON: json: unsupported type: chan int", IsError: true}},
	}
	for _, tc := range cases {
		tool := NativeTool("t", "d", nil, func(context.Context, map[string]any, *ToolContext) (any, error) { return tc.ret, tc.err })
		got, err := tool.Execute(context.Background(), nil, &ToolContext{})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
	tool := NativeTool("my tool.v2", "d", nil, nil)
	if tool.Name != "my_tool_v2" || tool.Source != SourceNative {
		t.Errorf("name %q source %q, want sanitized and native", tool.Name, tool.Source)
	}
	if diff := cmp.Diff(map[string]any{"type": "object", "properties": map[string]any{}}, tool.InputSchema); diff != "" {
		t.Errorf("default schema (-want +got):\n%s", diff)
	}
}

func TestSanitize(t *testing.T) {
	for in, want := range map[string]string{"ok_name-1": "ok_name-1", "a.b c/d": "a_b_c_d", "ünï": "_n_", "": ""} {
		if got := Sanitize(in); got != want {
			t.Errorf("Sanitize(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestToolkit(t *testing.T) {
	named := func(name, out string) Tool {
		return NativeTool(name, "", nil, func(context.Context, map[string]any, *ToolContext) (any, error) { return out, nil })
	}
	tk, err := NewToolkit(named("a", "first"), named("b", "b"), named("a", "second"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tk.Tools() {
		names = append(names, tool.Name)
	}
	if diff := cmp.Diff([]string{"a", "b"}, names); diff != "" {
		t.Errorf("tools (-want +got):\n%s", diff)
	}
	if got := tk.Execute(context.Background(), "a", nil, nil); got.Output != "first" {
		t.Errorf("duplicate: %q ran, want the first", got.Output)
	}
	if diff := cmp.Diff(ToolResult{Output: "Unknown tool: nope", IsError: true}, tk.Execute(context.Background(), "nope", nil, nil)); diff != "" {
		t.Errorf("unknown tool (-want +got):\n%s", diff)
	}

	var none *Toolkit
	if none.Tools() != nil {
		t.Error("a nil toolkit must be empty")
	}
	if _, ok := none.Lookup("a"); ok {
		t.Error("a nil toolkit found a tool")
	}
	if got := none.Execute(context.Background(), "a", nil, nil); got.Output != "Unknown tool: a" {
		t.Errorf("nil toolkit Execute = %q", got.Output)
	}

	if _, err := NewToolkit(Tool{Execute: named("x", "").Execute}); err == nil {
		t.Error("a tool without a name was accepted")
	}
	if _, err := NewToolkit(Tool{Name: "x"}); err == nil {
		t.Error("a tool without Execute was accepted")
	}
}

func TestToolkitExecute(t *testing.T) {
	failing := Tool{Name: "fails", Execute: func(context.Context, map[string]any, *ToolContext) (ToolResult, error) {
		return ToolResult{}, errors.New("transport broke")
	}}
	tk, _ := NewToolkit(failing)
	if diff := cmp.Diff(ToolResult{Output: "transport broke", IsError: true}, tk.Execute(context.Background(), "fails", nil, nil)); diff != "" {
		t.Errorf("tool error (-want +got):\n%s", diff)
	}
	tk.Unreachable("k.b", errors.New("connection refused"))
	want := ToolResult{Output: "MCP server k.b: tool lookup: the server cannot be reached: connection refused", IsError: true}
	if diff := cmp.Diff(want, tk.Execute(context.Background(), "k_b_lookup", nil, nil)); diff != "" {
		t.Errorf("tool of an unreachable MCP server (-want +got):\n%s", diff)
	}
	if got := tk.Execute(context.Background(), "other", nil, nil).Output; got != "Unknown tool: other" {
		t.Errorf("unknown tool = %q", got)
	}
}

// ToolResult.AuthRequired, example 2: a custom prompt; the retry ignores the answer's payload.
func TestSeedAuthRequired2RetryIgnoresPayload(t *testing.T) {
	res := AuthRequired("https://accounts.example.com/authorize", "Sign in to read your calendar")
	req := PendingOf(res)
	if req.Prompt != "Sign in to read your calendar" {
		t.Fatalf("prompt: %q", req.Prompt)
	}
	calendar := NativeTool("read_calendar", "reads today's events", nil, func(_ context.Context, _ map[string]any, tc *ToolContext) (any, error) {
		if tc != nil && tc.Answer != nil && tc.Answer.OK {
			return "09:00 standup, 14:00 1:1", nil
		}
		return AuthRequired("https://accounts.example.com/authorize", "Sign in to read your calendar"), nil
	})
	tk, _ := NewToolkit(calendar)
	first := tk.Execute(context.Background(), "read_calendar", map[string]any{}, nil)
	if PendingOf(first) == nil {
		t.Fatal("expected a suspension on the first call")
	}
	retried := tk.Execute(context.Background(), "read_calendar", map[string]any{}, &ToolContext{Answer: &Answer{ID: req.ID, OK: true}})
	if retried.IsError || retried.Output != "09:00 standup, 14:00 1:1" {
		t.Errorf("retried: %+v", retried)
	}
}

package tools

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestGatesCheck(t *testing.T) {
	specs := []GateSpec{
		{Tools: []string{"github_*"}, When: `args.branch == "main"`,
			Prompt: `Push {{index .arguments "branch"}} with {{.tool}}?`},
		{Tools: []string{"shell", "db_drop?"}},
		{Tools: []string{"pay*"}, When: `has(args.amount) && args.amount > 100.0`},
		{Tools: []string{"risky"}, When: `args.missing == 1`},
		{Tools: []string{"dyn"}, When: `args.flag`},
		{Tools: []string{"buy"}, Prompt: "Approve {{.tool}} with {{.arguments}}?"},
		{When: `tool.startsWith("delete_")`},
	}
	gates, err := NewGates(specs)
	if err != nil {
		t.Fatalf("NewGates: %v", err)
	}
	approval := func(tool, prompt string, args any) *Request {
		return &Request{ID: "toolguard:call_9", Kind: KindApproval, Prompt: prompt,
			Data: map[string]any{"tool": tool, "arguments": args}}
	}
	tests := []struct {
		name    string
		tool    string
		args    map[string]any
		raw     string
		want    *Request
		wantErr string
	}{
		{name: "glob and when true, custom prompt", tool: "github_push", args: map[string]any{"branch": "main"},
			want: approval("github_push", "Push main with github_push?", map[string]any{"branch": "main"})},
		{name: "glob matches, when false", tool: "github_push", args: map[string]any{"branch": "dev"}},
		{name: "glob does not match", tool: "gitlab_push", args: map[string]any{"branch": "main"}},
		{name: "exact name, no when, default prompt", tool: "shell", args: map[string]any{"cmd": "ls"},
			want: approval("shell", "Approve the call to shell?", map[string]any{"cmd": "ls"})},
		{name: "single-character glob", tool: "db_drop1", want: approval("db_drop1", "Approve the call to db_drop1?", map[string]any{})},
		{name: "glob is not a prefix match", tool: "db_drop12"},
		{name: "has() guards an optional argument", tool: "pay_invoice", args: map[string]any{}},
		{name: "numeric condition true", tool: "pay_invoice", args: map[string]any{"amount": 250.0},
			want: approval("pay_invoice", "Approve the call to pay_invoice?", map[string]any{"amount": 250.0})},
		{name: "numeric condition false", tool: "pay_invoice", args: map[string]any{"amount": 5.0}},
		{name: "evaluation error requires approval", tool: "risky", args: map[string]any{"other": 1.0},
			want:    approval("risky", "Approve the call to risky?", map[string]any{"other": 1.0}),
			wantErr: "approval gate 3: evaluating when: no such key: missing; approval is required"},
		{name: "non-bool at runtime requires approval", tool: "dyn", args: map[string]any{"flag": "yes"},
			want:    approval("dyn", "Approve the call to dyn?", map[string]any{"flag": "yes"}),
			wantErr: "approval gate 4: when yielded string, want bool; approval is required"},
		{name: "dyn bool false", tool: "dyn", args: map[string]any{"flag": false}},
		{name: "gate without tools uses the name in when", tool: "delete_user",
			want: approval("delete_user", "Approve the call to delete_user?", map[string]any{})},
		{name: "unparsed arguments reach the approver raw", tool: "shell", raw: `{"cmd": "rm -rf /"`,
			want: approval("shell", "Approve the call to shell?", `{"cmd": "rm -rf /"`)},
		{name: "raw arguments parsed when args are absent", tool: "shell", raw: `{"cmd":"ls"}`,
			want: approval("shell", "Approve the call to shell?", map[string]any{"cmd": "ls"})},
		{name: "no gate", tool: "echo", args: map[string]any{"text": "hi"}},
		{name: "arguments render as JSON in a prompt", tool: "buy", args: map[string]any{"item": "gpu", "qty": 2.0},
			want: approval("buy", `Approve buy with {"item":"gpu","qty":2}?`, map[string]any{"item": "gpu", "qty": 2.0})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := gates.Check(tt.tool, tt.args, "call_9", tt.raw)
			if gotErr := errString(err); gotErr != tt.wantErr {
				t.Errorf("error = %q, want %q", gotErr, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGatesFirstMatchWinsAndNil(t *testing.T) {
	gates, err := NewGates([]GateSpec{{Tools: []string{"*"}, Prompt: "first {{.tool}}"}, {Tools: []string{"x"}, Prompt: "second"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := gates.Check("x", nil, "c", ""); got == nil || got.Prompt != "first x" {
		t.Errorf("Check = %+v, want the first gate's prompt", got)
	}
	var none *Gates
	if got, err := none.Check("x", nil, "c", ""); got != nil || err != nil {
		t.Errorf("nil Gates Check = %v, %v", got, err)
	}
}

func TestNewGatesErrors(t *testing.T) {
	tests := []struct {
		name string
		spec GateSpec
		// want is a prefix: CEL's own diagnostics (expected tokens, carets) follow it.
		want string
	}{
		{name: "syntax", spec: GateSpec{When: `args.x ==`},
			want: "approval gate 1: when \"args.x ==\": ERROR: <input>:1:10: Syntax error: mismatched input '<EOF>'"},
		{name: "unknown variable", spec: GateSpec{When: `user == "bob"`},
			want: "approval gate 1: when \"user == \\\"bob\\\"\": ERROR: <input>:1:1: undeclared reference to 'user'"},
		{name: "not bool", spec: GateSpec{When: `tool + "!"`}, want: `approval gate 1: when "tool + \"!\"" yields string, want bool`},
		{name: "bad glob", spec: GateSpec{Tools: []string{"a[b"}}, want: `approval gate 1: tool pattern "a[b": syntax error in pattern`},
		{name: "bad template", spec: GateSpec{Prompt: "{{.tool"}, want: `approval gate 1: prompt: template: gate1:1: unclosed action`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewGates([]GateSpec{{Tools: []string{"ok"}}, tt.spec})
			if got := errString(err); !strings.HasPrefix(got, tt.want) || tt.want == "" {
				t.Errorf("error =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

package runspec

import (
	"errors"
	"strings"
	"testing"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// A spec that passed admission but cannot run is refused by the one builder with the reason an
// Agent's Ready condition names and a message naming the field; a spec that can run builds with no
// Secrets and no client.
func TestBuild(t *testing.T) {
	base := func() toolnexusv1alpha1.AgentSpec {
		return toolnexusv1alpha1.AgentSpec{Model: toolnexusv1alpha1.ModelSpec{Name: "gpt-4o-mini", BaseURL: "http://127.0.0.1:1/v1"}}
	}
	httpTool := func(name, url string) toolnexusv1alpha1.ToolSpec {
		return toolnexusv1alpha1.ToolSpec{Name: name, HTTP: &toolnexusv1alpha1.HTTPToolSpec{URL: url}}
	}
	cases := []struct {
		name   string
		edit   func(*toolnexusv1alpha1.AgentSpec)
		reason string // "" when it builds
		msg    string
	}{
		{name: "a plain spec builds", edit: func(*toolnexusv1alpha1.AgentSpec) {}},
		{name: "tools, a built-in and a gate build", edit: func(s *toolnexusv1alpha1.AgentSpec) {
			s.Tools = []toolnexusv1alpha1.ToolSpec{httpTool("buy", "http://127.0.0.1:1/buy")}
			s.Builtins = []toolnexusv1alpha1.Builtin{toolnexusv1alpha1.BuiltinQuestion}
			s.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"buy"}, When: "args.amount > 10"}}
		}},
		{name: "a tool with no kind", edit: func(s *toolnexusv1alpha1.AgentSpec) {
			s.Tools = []toolnexusv1alpha1.ToolSpec{{Name: "buy"}}
		}, reason: toolnexusv1alpha1.ReasonInvalidTool, msg: "spec.tools[0]: set one of http, agentRef or a2a"},
		{name: "an HTTP tool whose URL cannot be used", edit: func(s *toolnexusv1alpha1.AgentSpec) {
			s.Tools = []toolnexusv1alpha1.ToolSpec{httpTool("buy", "ftp://127.0.0.1/buy")}
		}, reason: toolnexusv1alpha1.ReasonInvalidTool, msg: "spec.tools[0]"},
		{name: "a gate whose when does not compile", edit: func(s *toolnexusv1alpha1.AgentSpec) {
			s.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"buy"}, When: "args.amount >"}}
		}, reason: toolnexusv1alpha1.ReasonInvalidApproval, msg: "spec.approvals"},
		{name: "a model the loop cannot talk to", edit: func(s *toolnexusv1alpha1.AgentSpec) {
			s.Model.Style = "telepathy"
		}, reason: toolnexusv1alpha1.ReasonInvalidModel, msg: "telepathy"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := base()
			tc.edit(&spec)
			b, err := Build(&spec, Env{})
			if tc.reason == "" {
				if err != nil || b.Client == nil {
					t.Fatalf("Build = %+v, %v; want a client", b, err)
				}
				return
			}
			var invalid *Error
			if !errors.As(err, &invalid) {
				t.Fatalf("Build error %v, want an *Error", err)
			}
			if invalid.Reason != tc.reason || !strings.Contains(invalid.Error(), tc.msg) {
				t.Errorf("Build error %s: %q, want %s naming %q", invalid.Reason, invalid.Error(), tc.reason, tc.msg)
			}
		})
	}
}

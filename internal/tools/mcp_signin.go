package tools

import (
	"context"
	"fmt"
	"strings"
)

// SignInTools stand in for the tools of an MCP server that offers them only once someone signed
// in (LoginRequiredError), so the model can call them and the call park on the login, as an HTTP
// tool's does: each allow-listed tool, whose call parks on the login and then runs on the server
// with the arguments given; without an allow-list, one <server>_sign_in tool whose call parks on
// the login and then says which tools the next turn offers.
func SignInTools(spec MCPServerSpec) ([]Tool, error) {
	s, err := newMCPServer(spec)
	if err != nil {
		return nil, err
	}
	if len(spec.AllowTools) == 0 {
		return []Tool{{
			Name:        Sanitize(spec.Name) + "_sign_in",
			Description: fmt.Sprintf("Sign the user in to MCP server %s, whose tools are offered only after a sign-in. Calling it asks the user to sign in; its tools are offered from the next turn.", spec.Name),
			InputSchema: map[string]any{"type": "object", "properties": map[string]any{}},
			Source:      SourceMCP, URL: spec.URL,
			Execute: func(ctx context.Context, _ map[string]any, _ *ToolContext) (ToolResult, error) {
				return s.signIn(ctx), nil
			},
		}}, nil
	}
	out := make([]Tool, 0, len(spec.AllowTools))
	for _, name := range spec.AllowTools {
		out = append(out, Tool{
			Name:        Sanitize(spec.Name) + "_" + Sanitize(name),
			Description: fmt.Sprintf("Tool %s of MCP server %s, which needs the user to sign in first: calling it asks them to, then runs it with the arguments given. Its parameters are shown once signed in.", name, spec.Name),
			InputSchema: map[string]any{"type": "object"},
			Source:      SourceMCP, URL: spec.URL, Remote: name,
			Execute: func(ctx context.Context, args map[string]any, tc *ToolContext) (ToolResult, error) {
				return s.signedCall(ctx, name, args, tc), nil
			},
		})
	}
	return out, nil
}

// signIn lists the server's tools signed in, parking on a login while it refuses.
func (s *MCPServer) signIn(ctx context.Context) ToolResult {
	fail := func(msg string) ToolResult {
		return ToolResult{Output: fmt.Sprintf("MCP server %s: %s", s.spec.Name, msg), IsError: true}
	}
	return callSignedIn(ctx, s.spec.OAuth, s.spec.URL, fail, func(ctx context.Context, token string, seen *challenges) ToolResult {
		listed := &MCPServer{spec: s.spec} // calls may run at once: each lists into its own
		if err := listed.list(withLogin(ctx, token, seen)); err != nil {
			return fail(err.Error())
		}
		names := make([]string, len(listed.tools))
		for i, t := range listed.tools {
			names[i] = t.Name
		}
		return ToolResult{Output: fmt.Sprintf("Signed in to MCP server %s; from the next turn its tools are offered: %s", s.spec.Name, strings.Join(names, ", "))}
	})
}

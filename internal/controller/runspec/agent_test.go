package runspec

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// An agentRef tool hands its host the child's prompt: the prompt argument of a tool without
// parameters, the arguments as JSON of one with its own; arguments that make no prompt are the
// model's error and reach no host. A look at a waiting call goes to the host with the handle.
func TestAgentTool(t *testing.T) {
	purchasing := toolnexusv1alpha1.ToolSpec{Name: "buyer", AgentRef: &toolnexusv1alpha1.AgentReference{Name: "purchasing"}}
	withParameters := purchasing
	withParameters.Parameters = &apiextensionsv1.JSON{Raw: []byte(`{"type":"object","properties":{"item":{"type":"string"},"budget":{"type":"number"}}}`)}
	child := &wire.Wait{Kind: wire.WaitKindAgentRun, Server: "purchasing", ID: "parent-1a2b3c4d5e", Woken: true}
	cases := []struct {
		name string
		spec toolnexusv1alpha1.ToolSpec
		args map[string]any
		wait *wire.Wait
		want *SubAgentCall // nil: the host is not asked
		err  string
	}{
		{name: "the prompt argument is the child's prompt", spec: purchasing, args: map[string]any{"prompt": "buy a gpu"},
			want: &SubAgentCall{Tool: "buyer", Agent: "purchasing", CallID: "call_1", Prompt: "buy a gpu"}},
		{name: "own parameters: the arguments as JSON", spec: withParameters, args: map[string]any{"item": "gpu", "budget": 900.0},
			want: &SubAgentCall{Tool: "buyer", Agent: "purchasing", CallID: "call_1", Prompt: `{"budget":900,"item":"gpu"}`}},
		{name: "no prompt", spec: purchasing, args: map[string]any{"item": "gpu"},
			err: `buyer: the argument "prompt" must be a non-empty string`},
		{name: "a prompt that is not text", spec: purchasing, args: map[string]any{"prompt": 42.0},
			err: `buyer: the argument "prompt" must be a non-empty string`},
		{name: "a prompt past the bound", spec: purchasing, args: map[string]any{"prompt": strings.Repeat("a", MaxChildPromptBytes+1)},
			err: "buyer: the agent's prompt would be 65537 bytes; a run's prompt holds at most 65536"},
		{name: "a look carries the handle, and no prompt", spec: purchasing, args: map[string]any{"prompt": "buy a gpu"}, wait: child,
			want: &SubAgentCall{Tool: "buyer", Agent: "purchasing", CallID: "call_1", Wait: child}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got *SubAgentCall
			tool := agentTool(tc.spec, Env{SubAgents: func(_ context.Context, c SubAgentCall) tools.ToolResult {
				got = &c
				return tools.Waiting(*child)
			}})
			res, err := tool.Execute(context.Background(), tc.args, &tools.ToolContext{CallID: "call_1", Wait: tc.wait})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("the host was asked (-want +got):\n%s", diff)
			}
			if tc.err != "" && (!res.IsError || !strings.HasPrefix(res.Output, tc.err)) {
				t.Errorf("result %+v, want the error %q", res, tc.err)
			}
			if tc.want != nil && tools.WaitOf(res) == nil {
				t.Errorf("result %+v, want the host's", res)
			}
		})
	}
}

// Without parameters the model is shown the one prompt argument; an Agent's validation, which
// builds with no host, builds the tool, and a call of it says that this host runs no sub-agents.
func TestAgentToolSchemaAndNoHost(t *testing.T) {
	spec := toolnexusv1alpha1.AgentSpec{
		Model: toolnexusv1alpha1.ModelSpec{Name: "gpt-4o-mini", BaseURL: "http://127.0.0.1:1/v1"},
		Tools: []toolnexusv1alpha1.ToolSpec{{Name: "buyer", AgentRef: &toolnexusv1alpha1.AgentReference{Name: "purchasing"}}},
	}
	b, err := Build(&spec, Env{})
	if err != nil {
		t.Fatal(err)
	}
	tool := b.Local[0]
	if tool.Source != SourceAgent || tool.URL != "agent:purchasing" || tool.Description != "Asks the agent purchasing and returns its final answer." {
		t.Errorf("tool = %s from %s reaching %s (%q)", tool.Name, tool.Source, tool.URL, tool.Description)
	}
	if req := tool.InputSchema["required"]; !cmp.Equal(req, []any{"prompt"}) {
		t.Errorf("required = %v, want [prompt]", req)
	}
	res, _ := tool.Execute(context.Background(), map[string]any{"prompt": "buy a gpu"}, &tools.ToolContext{CallID: "call_1"})
	if !res.IsError || res.Output != "buyer: this manager runs no sub-agents" {
		t.Errorf("a call without a host = %+v", res)
	}
}

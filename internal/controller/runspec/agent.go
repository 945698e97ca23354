package runspec

import (
	"context"
	"encoding/json"
	"fmt"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/tools"
)

// An agentRef tool is another Agent of the namespace. Its call is carried out by the host (the
// AgentRun controller creates a child run of the Agent and wakes the call when the child ends);
// here the tool only shows the model its arguments and turns them into the child's prompt.

// SourceAgent is the source of agentRef tools, as metrics and events name it.
const SourceAgent tools.Source = "agent"

// MaxChildPromptBytes is the longest prompt a child run takes: the AgentRun CRD's bound on
// spec.prompt.
const MaxChildPromptBytes = 65536

// PromptArgument is the one argument of an agentRef tool that declares no parameters.
const PromptArgument = "prompt"

// SubAgentCall is one call of an agentRef tool, as its host carries it out.
type SubAgentCall struct {
	// Tool is the tool's name, Agent the Agent it calls.
	Tool, Agent string
	// CallID is the model's id of the call.
	CallID string
	// Prompt is the child's prompt: the prompt argument, or the arguments as JSON.
	Prompt string
	// Wait is the child the call waits on, once one was started: the host looks at it.
	Wait *tools.Wait
}

// agentTool is the tool of spec t, whose agentRef is set.
func agentTool(t toolnexusv1alpha1.ToolSpec, env Env) tools.Tool {
	agent := t.AgentRef.Name
	schema, ownSchema := jsonObject(t.Parameters), t.Parameters != nil
	if schema == nil {
		schema = map[string]any{
			"type": "object",
			"properties": map[string]any{PromptArgument: map[string]any{
				"type": "string", "description": "What to ask the agent " + agent + ", with everything it needs to know"}},
			"required": []any{PromptArgument},
		}
	}
	description := t.Description
	if description == "" {
		description = "Asks the agent " + agent + " and returns its final answer."
	}
	return tools.Tool{
		Name: t.Name, Description: description, InputSchema: schema, Source: SourceAgent,
		// What the call reaches, for the platform's ApprovalPolicies (their `url`).
		URL: "agent:" + agent,
		Execute: func(ctx context.Context, args map[string]any, tc *tools.ToolContext) (tools.ToolResult, error) {
			if env.SubAgents == nil {
				return tools.ToolResult{Output: t.Name + ": this manager runs no sub-agents", IsError: true}, nil
			}
			call := SubAgentCall{Tool: t.Name, Agent: agent, CallID: tc.CallID, Wait: tc.Wait}
			if tc.Wait == nil {
				prompt, err := childPrompt(args, ownSchema)
				if err != nil {
					return tools.ToolResult{Output: fmt.Sprintf("%s: %v", t.Name, err), IsError: true}, nil
				}
				call.Prompt = prompt
			}
			return env.SubAgents(ctx, call), nil
		},
	}
}

// childPrompt is the child's prompt from the call's arguments: its prompt argument for a tool
// without parameters of its own, else the arguments as JSON (the Agent's system prompt says what
// they mean).
func childPrompt(args map[string]any, ownSchema bool) (string, error) {
	var prompt string
	if ownSchema {
		raw, err := json.Marshal(args)
		if err != nil {
			return "", err
		}
		prompt = string(raw)
	} else {
		s, ok := args[PromptArgument].(string)
		if !ok || s == "" {
			return "", fmt.Errorf("the argument %q must be a non-empty string: it is what the agent is asked", PromptArgument)
		}
		prompt = s
	}
	if len(prompt) > MaxChildPromptBytes {
		return "", fmt.Errorf("the agent's prompt would be %d bytes; a run's prompt holds at most %d", len(prompt), MaxChildPromptBytes)
	}
	return prompt, nil
}

package main

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/loop/looptest"
)

func tool(name, description, schema string) looptest.ChatTool {
	var t looptest.ChatTool
	t.Type = "function"
	t.Function.Name, t.Function.Description = name, description
	if schema != "" {
		if err := json.Unmarshal([]byte(schema), &t.Function.Parameters); err != nil {
			panic(err)
		}
	}
	return t
}

func text(s string) json.RawMessage { b, _ := json.Marshal(s); return b }

func TestDecide(t *testing.T) {
	purchase := tool("approve_purchase", "Buys an item after spend approval", `{"type":"object","properties":{"item":{"type":"string"}},"required":["item"]}`)
	deleteUser := tool("delete_user", "Deletes a user account", `{"type":"object","properties":{"user":{"type":"string"},"hard":{"type":"boolean"}},"required":["user"]}`)
	question := tool("question", "Ask the user", `{"type":"object","required":["questions"],"properties":{"questions":{"type":"array","items":{"type":"object","required":["question"],"properties":{"question":{"type":"string"},"options":{"type":"array"}}}}}}`)
	budget := tool("set_budget", "Sets a budget", `{"type":"object","properties":{"amount":{"type":"integer"},"currency":{"type":"string","enum":["EUR","USD"]},"team":{"type":"string","default":"core"}}}`)

	tests := []struct {
		name     string
		req      looptest.ChatRequest
		wantText string
		wantCall *looptest.ChatFunctionCall
	}{{
		name:     "no tools echoes the prompt",
		req:      looptest.ChatRequest{Messages: []looptest.ChatMessage{{Role: "system", Content: text("be brief")}, {Role: "user", Content: text("hello there")}}},
		wantText: "Stand-in model: you said: hello there",
	}, {
		name:     "a tool sharing a word with the prompt wins over the first tool",
		req:      looptest.ChatRequest{Messages: []looptest.ChatMessage{{Role: "user", Content: text("buy a gpu")}}, Tools: []looptest.ChatTool{deleteUser, purchase}},
		wantCall: &looptest.ChatFunctionCall{Name: "approve_purchase", Arguments: `{"item":"gpu"}`},
	}, {
		name:     "no shared word picks the first tool; key=value sets an argument",
		req:      looptest.ChatRequest{Messages: []looptest.ChatMessage{{Role: "user", Content: text("remove user=mallory now")}}, Tools: []looptest.ChatTool{deleteUser, purchase}},
		wantCall: &looptest.ChatFunctionCall{Name: "delete_user", Arguments: `{"user":"mallory"}`},
	}, {
		name:     "question gets the whole prompt",
		req:      looptest.ChatRequest{Messages: []looptest.ChatMessage{{Role: "user", Content: text("Which colour should the t-shirt be?")}}, Tools: []looptest.ChatTool{question}},
		wantCall: &looptest.ChatFunctionCall{Name: "question", Arguments: `{"questions":[{"question":"Which colour should the t-shirt be?"}]}`},
	}, {
		name:     "numbers, enums and defaults; all properties when none is required",
		req:      looptest.ChatRequest{Messages: []looptest.ChatMessage{{Role: "user", Content: text("set a budget of 1500")}}, Tools: []looptest.ChatTool{budget}},
		wantCall: &looptest.ChatFunctionCall{Name: "set_budget", Arguments: `{"amount":1500,"currency":"EUR","team":"core"}`},
	}, {
		name: "a tool result ends the run with a summary",
		req: looptest.ChatRequest{Tools: []looptest.ChatTool{purchase}, Messages: []looptest.ChatMessage{
			{Role: "user", Content: text("buy a gpu")},
			{Role: "assistant", ToolCalls: []looptest.ChatToolCall{{ID: "call_1", Type: "function", Function: looptest.ChatFunctionCall{Name: "approve_purchase", Arguments: `{"item":"gpu"}`}}}},
			{Role: "tool", ToolCallID: "call_1", Content: text("purchase of gpu approved")},
		}},
		wantText: "Stand-in model: approve_purchase returned: purchase of gpu approved",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decide(tt.req)
			if got.Content != tt.wantText {
				t.Errorf("text = %q, want %q", got.Content, tt.wantText)
			}
			var gotCall *looptest.ChatFunctionCall
			if len(got.ToolCalls) == 1 {
				gotCall = &got.ToolCalls[0].Function
			}
			if diff := cmp.Diff(tt.wantCall, gotCall); diff != "" {
				t.Errorf("tool call (-want +got):\n%s", diff)
			}
		})
	}
}

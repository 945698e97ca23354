package looptest

import "encoding/json"

// Scripted replies in the Anthropic Messages wire format.

var anthropicUsage = map[string]any{"input_tokens": PromptTokens, "output_tokens": CompletionTokens}

// AnthropicText is a message that ends the run with text.
func AnthropicText(text string) Reply {
	return Reply{Body: mustJSON(map[string]any{
		"id": "msg_text", "type": "message", "role": "assistant", "model": "fake", "stop_reason": "end_turn",
		"content": []any{map[string]any{"type": "text", "text": text}},
		"usage":   anthropicUsage,
	})}
}

// AnthropicToolUse is a message requesting tool calls.
func AnthropicToolUse(calls ...ToolCall) Reply {
	blocks := make([]any, len(calls))
	for i, c := range calls {
		blocks[i] = map[string]any{"type": "tool_use", "id": c.ID, "name": c.Name, "input": json.RawMessage(c.Arguments)}
	}
	return Reply{Body: mustJSON(map[string]any{
		"id": "msg_tools", "type": "message", "role": "assistant", "model": "fake", "stop_reason": "tool_use",
		"content": blocks, "usage": anthropicUsage,
	})}
}

package loop

import (
	"context"
	"fmt"

	openai "github.com/sashabaranov/go-openai"
)

// openAIModel speaks POST {base}/chat/completions via go-openai.
type openAIModel struct{ client *openai.Client }

func newOpenAIModel(opts Options, doer wireDoer) *openAIModel {
	cfg := openai.DefaultConfig(opts.APIKey) // go-openai omits Authorization for an empty key
	cfg.BaseURL = opts.BaseURL
	cfg.HTTPClient = doer
	return &openAIModel{client: openai.NewClientWithConfig(cfg)}
}

func (m *openAIModel) complete(ctx context.Context, req modelRequest) (modelResponse, error) {
	body := openai.ChatCompletionRequest{Model: req.Model, Messages: openAIMessages(req)}
	// No tools means no tools and no tool_choice keys at all (toolnexus TestD1_NilToolkitCompletes):
	// both fields are omitempty in go-openai.
	for _, t := range req.Tools {
		body.Tools = append(body.Tools, openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{
			Name: t.Name, Description: t.Description, Parameters: t.InputSchema,
		}})
	}
	if len(body.Tools) > 0 {
		body.ToolChoice = "auto"
	}
	resp, err := m.client.CreateChatCompletion(ctx, body)
	if err != nil {
		return modelResponse{}, err
	}
	if len(resp.Choices) == 0 {
		return modelResponse{}, fmt.Errorf("%w: no choices", ErrInvalidResponse)
	}
	msg := resp.Choices[0].Message
	out := modelResponse{Text: msg.Content, Usage: Usage{
		PromptTokens: resp.Usage.PromptTokens, CompletionTokens: resp.Usage.CompletionTokens, TotalTokens: resp.Usage.TotalTokens,
	}, Model: resp.Model, FinishReason: string(resp.Choices[0].FinishReason)}
	for _, tc := range msg.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, MessageToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	return out, nil
}

func openAIMessages(req modelRequest) []openai.ChatCompletionMessage {
	out := make([]openai.ChatCompletionMessage, 0, len(req.Messages)+1)
	if req.System != "" {
		out = append(out, openai.ChatCompletionMessage{Role: openai.ChatMessageRoleSystem, Content: req.System})
	}
	for _, m := range req.Messages {
		msg := openai.ChatCompletionMessage{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, openai.ToolCall{ID: tc.ID, Type: openai.ToolTypeFunction,
				Function: openai.FunctionCall{Name: tc.Name, Arguments: tc.Arguments}})
		}
		out = append(out, msg)
	}
	return out
}

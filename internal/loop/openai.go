package loop

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

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
	// The SDK sends the request; the answer is decoded from the exchange (see exchange).
	if _, err := m.client.CreateChatCompletion(ctx, body); err != nil {
		return modelResponse{}, err
	}
	var resp openAIResponse
	if err := decodeAnswer(ctx, &resp); err != nil {
		return modelResponse{}, err
	}
	if len(resp.Choices) == 0 {
		return modelResponse{}, fmt.Errorf("%w: no choices", ErrInvalidResponse)
	}
	msg := resp.Choices[0].Message
	out := modelResponse{Text: string(msg.Content), Usage: Usage{
		PromptTokens: resp.Usage.PromptTokens, CompletionTokens: resp.Usage.CompletionTokens, TotalTokens: resp.Usage.TotalTokens,
	}, Model: resp.Model, FinishReason: resp.Choices[0].FinishReason}
	for _, tc := range msg.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, MessageToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	return out, nil
}

// openAIResponse is what the loop reads of a chat completion.
type openAIResponse struct {
	Model   string `json:"model"`
	Choices []struct {
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Content   openAIContent `json:"content"`
			ToolCalls []struct {
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

// openAIContent is a message's content: a string, null, or (from some compatible servers) a list
// of parts whose texts are joined.
type openAIContent string

func (c *openAIContent) UnmarshalJSON(data []byte) error {
	if !bytes.HasPrefix(bytes.TrimSpace(data), []byte("[")) {
		return json.Unmarshal(data, (*string)(c))
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal(data, &parts); err != nil {
		return err
	}
	texts := make([]string, len(parts))
	for i, p := range parts {
		texts[i] = p.Text
	}
	*c = openAIContent(strings.Join(texts, ""))
	return nil
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

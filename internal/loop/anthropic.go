package loop

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	anthropic "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/toolnexus/operator/internal/loop/state"
)

// anthropicMaxTokens is the toolnexus max_tokens for the anthropic style.
const anthropicMaxTokens = 4096

// anthropicModel speaks POST {base}/v1/messages (or {base}/messages when base ends in /v1) via
// anthropic-sdk-go.
type anthropicModel struct{ client anthropic.Client }

func newAnthropicModel(opts Options, doer wireDoer) *anthropicModel {
	// The SDK always appends v1/messages, so a base that already names /v1 loses it here.
	base := strings.TrimSuffix(opts.BaseURL, "/v1") + "/"
	ro := []option.RequestOption{
		// No ANTHROPIC_* environment: the run's own key or none, never the manager's.
		option.WithoutEnvironmentDefaults(),
		option.WithBaseURL(base),
		option.WithHTTPClient(doer),
		option.WithMaxRetries(0), // the loop owns retries
		// The SDK pins a newer version; toolnexus speaks 2023-06-01.
		option.WithHeader("anthropic-version", "2023-06-01"),
	}
	if opts.APIKey != "" {
		// The SDK's WithAPIKey sends a Bearer token; the Messages API wants x-api-key.
		ro = append(ro, option.WithHeader("x-api-key", opts.APIKey))
	}
	return &anthropicModel{client: anthropic.NewClient(ro...)}
}

func (m *anthropicModel) complete(ctx context.Context, req modelRequest) (modelResponse, error) {
	params := anthropic.MessageNewParams{
		Model:     req.Model,
		MaxTokens: anthropicMaxTokens,
		Messages:  anthropicMessages(req.Messages),
	}
	if req.System != "" {
		params.System = []anthropic.TextBlockParam{{Text: req.System}}
	}
	for _, t := range req.Tools {
		tool := anthropic.ToolParam{Name: t.Name, InputSchema: anthropicSchema(t.InputSchema)}
		if t.Description != "" {
			tool.Description = anthropic.String(t.Description)
		}
		params.Tools = append(params.Tools, anthropic.ToolUnionParam{OfTool: &tool})
	}
	// The SDK sends the request; the answer is decoded from the exchange (see exchange).
	if _, err := m.client.Messages.New(ctx, params); err != nil {
		return modelResponse{}, err
	}
	var msg anthropicResponse
	if err := decodeAnswer(ctx, &msg); err != nil {
		return modelResponse{}, err
	}
	if msg.Content == nil {
		return modelResponse{}, fmt.Errorf("%w: no content", ErrInvalidResponse)
	}
	in, outTok := msg.Usage.InputTokens, msg.Usage.OutputTokens
	out := modelResponse{Usage: Usage{PromptTokens: in, CompletionTokens: outTok, TotalTokens: in + outTok},
		Model: msg.Model, FinishReason: msg.StopReason}
	var text []string
	for _, b := range *msg.Content {
		switch b.Type {
		case "text":
			text = append(text, b.Text)
		case "tool_use":
			out.ToolCalls = append(out.ToolCalls, MessageToolCall{ID: b.ID, Name: b.Name, Arguments: string(b.Input)})
		}
	}
	out.Text = strings.Join(text, "")
	return out, nil
}

// anthropicResponse is what the loop reads of a Messages API answer; Content is nil when the
// answer has none (absent or null).
type anthropicResponse struct {
	Model      string `json:"model"`
	StopReason string `json:"stop_reason"`
	Content    *[]struct {
		Type  string          `json:"type"`
		Text  string          `json:"text"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	} `json:"content"`
	Usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
}

// anthropicMessages folds each run of tool messages into one user message of tool_result blocks,
// as the Messages API requires.
func anthropicMessages(msgs []Message) []anthropic.MessageParam {
	var out []anthropic.MessageParam
	for i := 0; i < len(msgs); i++ {
		m := msgs[i]
		switch m.Role {
		case RoleTool:
			var blocks []anthropic.ContentBlockParamUnion
			for ; i < len(msgs) && msgs[i].Role == RoleTool; i++ {
				blocks = append(blocks, toolResultBlock(msgs[i]))
			}
			i--
			out = append(out, anthropic.NewUserMessage(blocks...))
		case RoleAssistant:
			var blocks []anthropic.ContentBlockParamUnion
			if m.Content != "" {
				blocks = append(blocks, anthropic.NewTextBlock(m.Content))
			}
			for _, tc := range m.ToolCalls {
				blocks = append(blocks, anthropic.NewToolUseBlock(tc.ID, toolUseInput(tc.Arguments), tc.Name))
			}
			out = append(out, anthropic.NewAssistantMessage(blocks...))
		default:
			out = append(out, anthropic.NewUserMessage(anthropic.NewTextBlock(m.Content)))
		}
	}
	return out
}

// toolResultBlock leaves an empty output out: the API refuses empty text blocks.
func toolResultBlock(m Message) anthropic.ContentBlockParamUnion {
	if m.Content != "" {
		return anthropic.NewToolResultBlock(m.ToolCallID, m.Content, m.IsError)
	}
	return anthropic.ContentBlockParamUnion{OfToolResult: &anthropic.ToolResultBlockParam{
		ToolUseID: m.ToolCallID, IsError: anthropic.Bool(m.IsError),
	}}
}

// toolUseInput replays the model's arguments; input must be an object, so anything else (only a
// hook or another style could have put it there) is sent as {}.
func toolUseInput(args string) json.RawMessage {
	raw := json.RawMessage(args)
	var obj map[string]any
	if json.Unmarshal(raw, &obj) != nil || obj == nil {
		return json.RawMessage("{}")
	}
	return raw
}

// anthropicSchema maps a JSON Schema object onto the SDK's input_schema, keeping every keyword.
func anthropicSchema(schema map[string]any) anthropic.ToolInputSchemaParam {
	var p anthropic.ToolInputSchemaParam
	for k, v := range schema {
		switch k {
		case "type":
		case "properties":
			p.Properties = v
		case "required":
			p.Required = state.StringList(v)
		default:
			if p.ExtraFields == nil {
				p.ExtraFields = map[string]any{}
			}
			p.ExtraFields[k] = v
		}
	}
	return p
}

package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// QuestionToolName is the name of the built-in that asks the user (toolnexus §4A).
const QuestionToolName = "question"

// Question is one entry of the question tool's input.
type Question struct {
	Question string   `json:"question"`
	Header   string   `json:"header,omitempty"`
	Options  []string `json:"options,omitempty"`
	Multiple bool     `json:"multiple,omitempty"`
}

var questionSchema = map[string]any{
	"type":     "object",
	"required": []any{"questions"},
	"properties": map[string]any{
		"questions": map[string]any{
			"type":     "array",
			"minItems": 1,
			"items": map[string]any{
				"type":     "object",
				"required": []any{"question"},
				"properties": map[string]any{
					"question": map[string]any{"type": "string", "description": "The question to ask."},
					"header":   map[string]any{"type": "string", "description": "A short label for the question."},
					"options":  map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "description": "Choices to offer, if any."},
					"multiple": map[string]any{"type": "boolean", "description": "Whether several options may be chosen."},
				},
			},
		},
	},
}

// QuestionTool returns the built-in that parks the call on the user: the first call suspends
// with kind question, and the retry returns the answer's data as JSON.
//
// The Request id is "question:<call id>", and the retry takes an answer only when it echoes that
// id: an answer to another request of the same call (an approval gate's, "toolguard:<call id>")
// must ask the question rather than be mistaken for the user's reply.
func QuestionTool() Tool {
	return Tool{
		Name:        QuestionToolName,
		Description: "Ask the user one or more questions and wait for the answers.",
		InputSchema: questionSchema,
		Source:      SourceBuiltin,
		Execute: func(_ context.Context, args map[string]any, tc *ToolContext) (ToolResult, error) {
			if tc == nil {
				tc = &ToolContext{}
			}
			id := ""
			if tc.CallID != "" {
				id = "question:" + tc.CallID
			}
			if a := tc.Answer; a != nil && (id == "" || a.ID == id) {
				return answerDataResult(a.Data), nil
			}
			qs, err := parseQuestions(args)
			if err != nil {
				return ToolResult{Output: "question: " + err.Error(), IsError: true}, nil
			}
			return Pending(Request{ID: id, Kind: KindQuestion, Prompt: renderQuestions(qs),
				Data: map[string]any{"questions": jsonNative(qs)}}), nil
		},
	}
}

func parseQuestions(args map[string]any) ([]Question, error) {
	raw, err := json.Marshal(args["questions"])
	if err != nil {
		return nil, fmt.Errorf("questions is not JSON: %w", err)
	}
	var qs []Question
	if err := json.Unmarshal(raw, &qs); err != nil {
		return nil, fmt.Errorf(`invalid input: "questions" must be an array of {question, header?, options?, multiple?}: %v`, err)
	}
	if len(qs) == 0 {
		return nil, errors.New(`invalid input: "questions" needs at least one question`)
	}
	for i, q := range qs {
		if strings.TrimSpace(q.Question) == "" {
			return nil, fmt.Errorf("invalid input: questions[%d].question is empty", i)
		}
	}
	return qs, nil
}

// renderQuestions is each question, with its options in parentheses, one per line. The header
// is a display label for UIs and is left out, as in toolnexus.
func renderQuestions(qs []Question) string {
	lines := make([]string, len(qs))
	for i, q := range qs {
		lines[i] = q.Question
		if len(q.Options) > 0 {
			lines[i] += " (options: " + strings.Join(q.Options, ", ") + ")"
		}
	}
	return strings.Join(lines, "\n")
}

// answerDataResult is the answer's data as the tool output, "{}" when there is none.
func answerDataResult(data map[string]any) ToolResult {
	if data == nil {
		return ToolResult{Output: "{}"}
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return ToolResult{Output: fmt.Sprintf("answer data is not JSON: %v", err), IsError: true}
	}
	return ToolResult{Output: string(raw)}
}

// jsonNative converts v to the types encoding/json decodes into, so Request data compares equal
// before and after it is stored and read back.
func jsonNative(v any) any {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var out any
	_ = json.Unmarshal(raw, &out)
	return out
}

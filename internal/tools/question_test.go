package tools

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestQuestionTool(t *testing.T) {
	colour := map[string]any{"questions": []any{
		map[string]any{"question": "Pick a color?", "options": []any{"red", "green"}},
	}}
	two := map[string]any{"questions": []any{
		map[string]any{"question": "Name?", "header": "Who"},
		map[string]any{"question": "Sizes?", "options": []any{"S", "M", "L"}, "multiple": true},
	}}
	tests := []struct {
		name string
		args map[string]any
		tc   ToolContext
		want suspensionView
	}{
		{name: "one question with options", args: colour, tc: ToolContext{CallID: "c1"},
			want: suspensionView{Output: "Pick a color? (options: red, green)", IsError: true,
				Pending: &Request{ID: "question:c1", Kind: KindQuestion, Prompt: "Pick a color? (options: red, green)",
					Data: map[string]any{"questions": []any{map[string]any{"question": "Pick a color?", "options": []any{"red", "green"}}}}}}},
		{name: "several questions, header not rendered", args: two, tc: ToolContext{CallID: "c2"},
			want: suspensionView{Output: "Name?\nSizes? (options: S, M, L)", IsError: true,
				Pending: &Request{ID: "question:c2", Kind: KindQuestion, Prompt: "Name?\nSizes? (options: S, M, L)",
					Data: map[string]any{"questions": []any{
						map[string]any{"question": "Name?", "header": "Who"},
						map[string]any{"question": "Sizes?", "options": []any{"S", "M", "L"}, "multiple": true},
					}}}}},
		{name: "retry returns the answer data", args: colour,
			tc:   ToolContext{CallID: "c1", Answer: &Answer{ID: "question:c1", OK: true, Data: map[string]any{"color": "red"}}},
			want: suspensionView{Output: `{"color":"red"}`}},
		{name: "retry without data returns an empty object", args: colour,
			tc:   ToolContext{CallID: "c1", Answer: &Answer{ID: "question:c1", OK: true}},
			want: suspensionView{Output: `{}`}},
		{name: "an approval answer still asks the question", args: colour,
			tc: ToolContext{CallID: "c1", Answer: &Answer{ID: "toolguard:c1", OK: true}},
			want: suspensionView{Output: "Pick a color? (options: red, green)", IsError: true,
				Pending: &Request{ID: "question:c1", Kind: KindQuestion, Prompt: "Pick a color? (options: red, green)",
					Data: map[string]any{"questions": []any{map[string]any{"question": "Pick a color?", "options": []any{"red", "green"}}}}}}},
		{name: "without a call id any answer is the reply", args: colour,
			tc:   ToolContext{Answer: &Answer{ID: "whatever", OK: true, Data: map[string]any{"color": "green"}}},
			want: suspensionView{Output: `{"color":"green"}`}},
		{name: "no questions key", args: map[string]any{},
			want: suspensionView{Output: `question: invalid input: "questions" needs at least one question`, IsError: true}},
		{name: "empty list", args: map[string]any{"questions": []any{}},
			want: suspensionView{Output: `question: invalid input: "questions" needs at least one question`, IsError: true}},
		{name: "empty question", args: map[string]any{"questions": []any{map[string]any{"question": " "}}},
			want: suspensionView{Output: `question: invalid input: questions[0].question is empty`, IsError: true}},
		{name: "wrong type", args: map[string]any{"questions": "what?"},
			want: suspensionView{Output: `question: invalid input: "questions" must be an array of {question, header?, options?, multiple?}: json: cannot unmarshal string into Go value of type []tools.Question`, IsError: true}},
		{name: "options not strings", args: map[string]any{"questions": []any{map[string]any{"question": "q", "options": []any{1}}}},
			want: suspensionView{Output: `question: invalid input: "questions" must be an array of {question, header?, options?, multiple?}: json: cannot unmarshal number into Go struct field Question.options of type string`, IsError: true}},
	}
	tool := QuestionTool()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := tool.Execute(context.Background(), tt.args, &tt.tc)
			if err != nil {
				t.Fatalf("Execute: %v", err)
			}
			if diff := cmp.Diff(tt.want, viewOf(res)); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
		})
	}
	if tool.Name != "question" || tool.Source != SourceBuiltin {
		t.Errorf("tool = %s/%s, want question/builtin", tool.Name, tool.Source)
	}
}

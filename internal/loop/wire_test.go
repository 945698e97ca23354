package loop

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
)

var echoSchema = map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"type": "number"}}, "required": []any{"x"}}

func echoTool() tools.Tool {
	return tools.NativeTool("echo", "Echoes x", echoSchema, func(_ context.Context, args map[string]any, _ *tools.ToolContext) (any, error) {
		return args, nil
	})
}

func decode(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("bad golden JSON: %v", err)
	}
	return v
}

func TestOpenAIWire(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "c1", Name: "echo", Arguments: `{"x":1}`}),
		looptest.OpenAIText("done"))
	c := newClient(t, srv.URL+"/v1/", func(o *Options) { o.SystemPrompt = "Be brief." })
	res, err := c.Run(context.Background(), "go", toolkit(t, echoTool()))
	if err != nil {
		t.Fatal(err)
	}
	reqs := srv.Requests()
	for _, r := range reqs {
		if r.Method != "POST" || r.Path != "/v1/chat/completions" || r.Header.Get("Authorization") != "Bearer test-key" {
			t.Errorf("request %s %s auth %q, want POST /v1/chat/completions with the bearer key", r.Method, r.Path, r.Header.Get("Authorization"))
		}
	}
	want := decode(t, `{
		"model": "gpt-4o-mini", "stream": false, "tool_choice": "auto",
		"tools": [{"type": "function", "function": {"name": "echo", "description": "Echoes x",
			"parameters": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}}}],
		"messages": [
			{"role": "system", "content": "Be brief."},
			{"role": "user", "content": "go"},
			{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "echo", "arguments": "{\"x\":1}"}}]},
			{"role": "tool", "tool_call_id": "c1", "content": "{\"x\":1}"}
		]}`)
	if diff := cmp.Diff(want, any(reqs[1].JSON(t))); diff != "" {
		t.Errorf("second request body (-want +got):\n%s", diff)
	}
	wantUsage := Usage{PromptTokens: 20, CompletionTokens: 10, TotalTokens: 30}
	if diff := cmp.Diff(wantUsage, res.Usage); diff != "" {
		t.Errorf("usage (-want +got):\n%s", diff)
	}
}

// TestOpenAINoToolsOnTheWire: without tools the body carries neither tools nor tool_choice, and
// without a key no Authorization header.
func TestOpenAINoToolsOnTheWire(t *testing.T) {
	for name, tk := range map[string]*tools.Toolkit{"nil toolkit": nil, "empty toolkit": toolkit(t)} {
		t.Run(name, func(t *testing.T) {
			srv := looptest.New(t, looptest.OpenAIText("hi"))
			c := newClient(t, srv.URL, func(o *Options) { o.APIKey = "" })
			if _, err := c.Run(context.Background(), "hello", tk); err != nil {
				t.Fatal(err)
			}
			req := srv.Requests()[0]
			want := decode(t, `{"model": "gpt-4o-mini", "stream": false, "messages": [{"role": "user", "content": "hello"}]}`)
			if diff := cmp.Diff(want, any(req.JSON(t))); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
			if _, ok := req.Header["Authorization"]; ok {
				t.Errorf("Authorization sent without a key")
			}
		})
	}
}

func TestAnthropicURL(t *testing.T) {
	for _, tc := range []struct{ suffix, want string }{
		{"", "/v1/messages"},
		{"/", "/v1/messages"},
		{"/v1", "/v1/messages"},
		{"/v1/", "/v1/messages"},
		{"/proxy/anthropic", "/proxy/anthropic/v1/messages"},
	} {
		srv := looptest.New(t, looptest.AnthropicText("hi"))
		c := newClient(t, srv.URL+tc.suffix, anthropicStyle)
		if _, err := c.Run(context.Background(), "hello", nil); err != nil {
			t.Fatalf("base %q: %v", tc.suffix, err)
		}
		if got := srv.Requests()[0].Path; got != tc.want {
			t.Errorf("base …%q: path %q, want %q", tc.suffix, got, tc.want)
		}
	}
}

func TestAnthropicWire(t *testing.T) {
	t.Setenv("ANTHROPIC_API_KEY", "from-the-environment")
	t.Setenv("ANTHROPIC_AUTH_TOKEN", "from-the-environment")
	srv := looptest.New(t,
		looptest.AnthropicToolUse(
			looptest.ToolCall{ID: "t1", Name: "echo", Arguments: `{"x":1}`},
			looptest.ToolCall{ID: "t2", Name: "missing", Arguments: `{}`}),
		looptest.AnthropicText("done"))
	c := newClient(t, srv.URL, anthropicStyle, func(o *Options) { o.SystemPrompt = "Be brief." })
	res, err := c.Run(context.Background(), "go", toolkit(t, echoTool()))
	if err != nil {
		t.Fatal(err)
	}
	reqs := srv.Requests()
	for _, r := range reqs {
		got := []string{r.Header.Get("X-Api-Key"), r.Header.Get("Anthropic-Version"), r.Header.Get("Authorization")}
		if diff := cmp.Diff([]string{"test-key", "2023-06-01", ""}, got); diff != "" {
			t.Errorf("x-api-key, anthropic-version, authorization (-want +got):\n%s", diff)
		}
	}
	want := decode(t, `{
		"model": "claude-test", "max_tokens": 4096,
		"system": [{"type": "text", "text": "Be brief."}],
		"tools": [{"name": "echo", "description": "Echoes x",
			"input_schema": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}}],
		"messages": [
			{"role": "user", "content": [{"type": "text", "text": "go"}]},
			{"role": "assistant", "content": [
				{"type": "tool_use", "id": "t1", "name": "echo", "input": {"x": 1}},
				{"type": "tool_use", "id": "t2", "name": "missing", "input": {}}]},
			{"role": "user", "content": [
				{"type": "tool_result", "tool_use_id": "t1", "is_error": false, "content": [{"type": "text", "text": "{\"x\":1}"}]},
				{"type": "tool_result", "tool_use_id": "t2", "is_error": true, "content": [{"type": "text", "text": "Unknown tool: missing"}]}]}
		]}`)
	if diff := cmp.Diff(want, any(reqs[1].JSON(t))); diff != "" {
		t.Errorf("second request body (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(Usage{PromptTokens: 20, CompletionTokens: 10, TotalTokens: 30}, res.Usage); diff != "" {
		t.Errorf("usage (-want +got):\n%s", diff)
	}
}

func TestAnthropicEmptyToolOutput(t *testing.T) {
	srv := looptest.New(t,
		looptest.AnthropicToolUse(looptest.ToolCall{ID: "t1", Name: "quiet", Arguments: `{}`}),
		looptest.AnthropicText("done"))
	quiet := tools.NativeTool("quiet", "", nil, func(context.Context, map[string]any, *tools.ToolContext) (any, error) { return "", nil })
	if _, err := newClient(t, srv.URL, anthropicStyle).Run(context.Background(), "go", toolkit(t, quiet)); err != nil {
		t.Fatal(err)
	}
	msgs := srv.Requests()[1].JSON(t)["messages"].([]any)
	want := decode(t, `{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": false}]}`)
	if diff := cmp.Diff(want, msgs[2]); diff != "" {
		t.Errorf("tool result without output (-want +got):\n%s", diff)
	}
}

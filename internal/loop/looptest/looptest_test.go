package looptest_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/loop/looptest"
)

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

func TestServeAnswersFromTheRequest(t *testing.T) {
	srv := looptest.Serve(t, func(r looptest.Request) looptest.Reply {
		req, err := r.Chat()
		if err != nil {
			return looptest.OpenAIError(http.StatusBadRequest, err.Error())
		}
		return looptest.NewCompletion("c1", req.Model, looptest.AssistantText(req.Messages[len(req.Messages)-1].Text()), looptest.ChatUsage{}).Reply()
	})
	body := `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hel"},{"type":"text","text":"lo"}]}]}`
	status, got := post(t, srv.URL, body)
	want := `{"id":"c1","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hello"}}],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}`
	if status != http.StatusOK || got != want {
		t.Errorf("got %d %s\nwant 200 %s", status, got, want)
	}
	reqs := srv.Requests()
	if len(reqs) != 1 || reqs[0].Path != "/v1/chat/completions" || string(reqs[0].Body) != body {
		t.Errorf("recorded %+v", reqs)
	}
}

func TestOversizedRequestGetsAnOpenAIError(t *testing.T) {
	srv := looptest.Serve(t, func(looptest.Request) looptest.Reply { return looptest.OpenAIText("read") })
	status, body := post(t, srv.URL, strings.Repeat(" ", looptest.MaxRequestBytes+1))
	if status != http.StatusRequestEntityTooLarge || !strings.Contains(body, `"type":"invalid_request_error"`) {
		t.Errorf("oversized request: %d %s, want a 413 OpenAI error", status, body)
	}
	if n := len(srv.Requests()); n != 0 {
		t.Errorf("recorded %d requests, want none: the oversized one was not read", n)
	}
}

func TestNewAnswersInScriptOrder(t *testing.T) {
	srv := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "buy", Arguments: `{"item":"gpu"}`}),
		looptest.Reply{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"1"}}, Body: "slow down"},
	)
	var got []int
	for range 2 {
		status, _ := post(t, srv.URL, "{}")
		got = append(got, status)
	}
	if diff := cmp.Diff([]int{http.StatusOK, http.StatusTooManyRequests}, got); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
}

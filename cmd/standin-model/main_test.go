package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestStandinWire checks what a client of the stand-in sees on the wire: the completion names the
// stand-in, and every refusal is an OpenAI error object.
func TestStandinWire(t *testing.T) {
	srv := httptest.NewServer(newStandin(slog.New(slog.DiscardHandler)))
	t.Cleanup(srv.Close)
	tests := []struct {
		name, method, path, body string
		wantStatus               int
		want                     map[string]any // top-level fields the response must hold
	}{{
		name: "a tool call", method: "POST", path: "/v1/chat/completions",
		body:       `{"model":"x","messages":[{"role":"user","content":"buy a gpu"}],"tools":[{"type":"function","function":{"name":"approve_purchase","parameters":{"type":"object","properties":{"item":{"type":"string"}},"required":["item"]}}}]}`,
		wantStatus: http.StatusOK,
		want: map[string]any{"model": standinModel, "system_fingerprint": standinFingerprint, "object": "chat.completion", "id": "chatcmpl-standin-1",
			"choices": []any{map[string]any{"index": 0.0, "finish_reason": "tool_calls", "message": map[string]any{"role": "assistant", "content": nil,
				"tool_calls": []any{map[string]any{"id": "call_1", "type": "function", "function": map[string]any{"name": "approve_purchase", "arguments": `{"item":"gpu"}`}}}}}}},
	}, {
		name: "no messages", method: "POST", path: "/v1/chat/completions", body: `{"model":"x","messages":[]}`,
		wantStatus: http.StatusBadRequest,
		want:       map[string]any{"error": map[string]any{"message": "stand-in model: messages is empty", "type": "invalid_request_error"}},
	}, {
		name: "no route", method: "GET", path: "/v1/nothing",
		wantStatus: http.StatusNotFound,
		want: map[string]any{"error": map[string]any{"type": "invalid_request_error",
			"message": "stand-in model: no route GET /v1/nothing; it serves POST /v1/chat/completions and GET /v1/models"}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			raw, _ := io.ReadAll(resp.Body)
			var got map[string]any
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatalf("response is not JSON: %s", raw)
			}
			if resp.StatusCode != tt.wantStatus || resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("status %d, content type %q; want %d, JSON", resp.StatusCode, resp.Header.Get("Content-Type"), tt.wantStatus)
			}
			for k, want := range tt.want {
				if diff := cmp.Diff(want, got[k]); diff != "" {
					t.Errorf("%s (-want +got):\n%s", k, diff)
				}
			}
		})
	}
}

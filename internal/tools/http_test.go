package tools

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/toolnexus/operator/internal/netguard"
	"github.com/toolnexus/operator/internal/netguard/netguardtest"
)

// ignoreRequestID ignores generated suspension ids, which are unique per call by design.
var ignoreRequestID = cmpopts.IgnoreFields(Request{}, "ID")

// suspensionView flattens a result so one cmp.Diff covers output, error flag and suspension.
type suspensionView struct {
	Output  string
	IsError bool
	Pending *Request
}

func viewOf(r ToolResult) suspensionView {
	return suspensionView{Output: r.Output, IsError: r.IsError, Pending: PendingOf(r)}
}

func mustHTTPTool(t *testing.T, spec HTTPToolSpec) Tool {
	t.Helper()
	tool, err := HTTPTool(spec)
	if err != nil {
		t.Fatalf("HTTPTool: %v", err)
	}
	return tool
}

func TestHTTPToolResponseShapes(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   suspensionView
	}{
		{name: "plain text", status: 200, body: "sunny", want: suspensionView{Output: "sunny"}},
		{name: "ordinary JSON is output", status: 200, body: `{"temp":21}`, want: suspensionView{Output: `{"temp":21}`}},
		{name: "JSON with output and other keys is output", status: 200, body: `{"output":"x","id":7}`,
			want: suspensionView{Output: `{"output":"x","id":7}`}},
		{name: "non-2xx", status: 404, body: "no such city", want: suspensionView{Output: "HTTP 404: no such city", IsError: true}},
		{name: "non-2xx JSON stays an error", status: 500, body: `{"auth_required":true,"auth_url":"u"}`,
			want: suspensionView{Output: `HTTP 500: {"auth_required":true,"auth_url":"u"}`, IsError: true}},
		{name: "auth required with id", status: 200,
			body: `{"auth_required": true, "auth_url": "https://auth.example.com/start", "auth_id": "opaque-1"}`,
			want: suspensionView{Output: DefaultAuthPrompt + "\nhttps://auth.example.com/start", IsError: true,
				Pending: &Request{Kind: KindAuthorization, Prompt: DefaultAuthPrompt, URL: "https://auth.example.com/start",
					Data: map[string]any{"auth_id": "opaque-1"}}}},
		{name: "auth required without id", status: 201, body: `{"auth_required":true,"auth_url":"https://a/b"}`,
			want: suspensionView{Output: DefaultAuthPrompt + "\nhttps://a/b", IsError: true,
				Pending: &Request{Kind: KindAuthorization, Prompt: DefaultAuthPrompt, URL: "https://a/b"}}},
		{name: "auth_required false is output", status: 200, body: `{"auth_required":false}`,
			want: suspensionView{Output: `{"auth_required":false}`}},
		{name: "tool result", status: 200, body: `{"output":"done","isError":false,"metadata":{"k":1}}`,
			want: suspensionView{Output: "done"}},
		{name: "tool result error", status: 200, body: `{"output":"quota exceeded","isError":true}`,
			want: suspensionView{Output: "quota exceeded", IsError: true}},
		{name: "tool result suspension of any kind", status: 200,
			body: `{"output":"ignored","isError":true,"metadata":{"pending":{"id":"r1","kind":"input","prompt":"Which region?","data":{"schema":{"type":"object"}}}}}`,
			want: suspensionView{Output: "Which region?", IsError: true,
				Pending: &Request{ID: "r1", Kind: KindInput, Prompt: "Which region?", Data: map[string]any{"schema": map[string]any{"type": "object"}}}}},
		{name: "tool result with a pending that is no request", status: 200, body: `{"output":"o","metadata":{"pending":{}}}`,
			want: suspensionView{Output: "o"}},
		{name: "malformed JSON is output", status: 200, body: `{"output":`, want: suspensionView{Output: `{"output":`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			tool := mustHTTPTool(t, HTTPToolSpec{Name: "weather", URL: srv.URL})
			res, err := tool.Execute(context.Background(), map[string]any{}, &ToolContext{})
			if err != nil {
				t.Fatalf("Execute: %v", err)
			}
			if diff := cmp.Diff(tt.want, viewOf(res), ignoreRequestID); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
			if p := PendingOf(res); p != nil && p.ID == "" {
				t.Errorf("suspension has no id")
			}
		})
	}
}

// seenRequest is what the fake tool server records of a request.
type seenRequest struct {
	Method, RawPath, RawQuery, ContentType, IdempotencyKey string
	Body                                                   map[string]any
	Answer                                                 *Answer
}

func recordingServer(t *testing.T, seen *[]seenRequest) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := seenRequest{Method: r.Method, RawPath: r.URL.EscapedPath(), RawQuery: r.URL.RawQuery,
			ContentType: r.Header.Get("Content-Type"), IdempotencyKey: r.Header.Get(IdempotencyKeyHeader)}
		if raw, _ := io.ReadAll(r.Body); len(raw) > 0 {
			if err := json.Unmarshal(raw, &s.Body); err != nil {
				t.Errorf("body is not a JSON object: %q", raw)
			}
		}
		if h := r.Header.Get(AnswerHeader); h != "" {
			raw, err := base64.RawURLEncoding.DecodeString(h)
			if err != nil {
				t.Errorf("%s is not base64url without padding: %v", AnswerHeader, err)
			}
			s.Answer = new(Answer)
			if err := json.Unmarshal(raw, s.Answer); err != nil {
				t.Errorf("%s is not an Answer: %v", AnswerHeader, err)
			}
		}
		*seen = append(*seen, s)
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestHTTPToolRequest(t *testing.T) {
	tests := []struct {
		name   string
		method string
		path   string
		args   map[string]any
		want   seenRequest
	}{
		{
			name: "placeholders substituted, escaped and removed from the body",
			path: "/users/{user}/items/{id}",
			args: map[string]any{"user": "a b/c?x=1&y", "id": float64(42), "note": "hi", "n": 1.5},
			want: seenRequest{Method: "POST", RawPath: "/users/a%20b%2Fc%3Fx%3D1%26y/items/42",
				ContentType: "application/json", Body: map[string]any{"note": "hi", "n": 1.5}},
		},
		{
			name: "no arguments is an empty object",
			path: "/ping",
			want: seenRequest{Method: "POST", RawPath: "/ping", ContentType: "application/json", Body: map[string]any{}},
		},
		{
			name:   "GET carries the rest as query parameters",
			method: "get",
			path:   "/search/{kind}?v=1",
			args:   map[string]any{"kind": "books", "q": "go & k8s", "limit": float64(3)},
			want:   seenRequest{Method: "GET", RawPath: "/search/books", RawQuery: "v=1&limit=3&q=go+%26+k8s"},
		},
		{
			name:   "PUT with a placeholder in the query",
			method: "PUT",
			path:   "/doc?id={id}",
			args:   map[string]any{"id": "x&admin=true", "text": "t"},
			want: seenRequest{Method: "PUT", RawPath: "/doc", RawQuery: "id=x%26admin%3Dtrue",
				ContentType: "application/json", Body: map[string]any{"text": "t"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen []seenRequest
			srv := recordingServer(t, &seen)
			tool := mustHTTPTool(t, HTTPToolSpec{Name: "t", Method: tt.method, URL: srv.URL + tt.path})
			res, err := tool.Execute(context.Background(), tt.args, &ToolContext{})
			if err != nil || res.IsError {
				t.Fatalf("Execute = %+v, %v", res, err)
			}
			if diff := cmp.Diff([]seenRequest{tt.want}, seen); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHTTPToolMissingPlaceholder(t *testing.T) {
	tool := mustHTTPTool(t, HTTPToolSpec{Name: "t", URL: "http://127.0.0.1:1/users/{user}"})
	res, _ := tool.Execute(context.Background(), map[string]any{"other": 1}, &ToolContext{})
	want := ToolResult{Output: "HTTP tool t: missing argument for URL placeholder {user}", IsError: true}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
}

func TestHTTPToolRetryCarriesAnswerAndKeys(t *testing.T) {
	var seen []seenRequest
	srv := recordingServer(t, &seen)
	tool := mustHTTPTool(t, HTTPToolSpec{Name: "t", URL: srv.URL})
	answer := Answer{ID: "pnd-1", OK: true, Data: map[string]any{"region": "eu-west-1", "n": float64(2), "nested": map[string]any{"a": []any{"b"}}}}
	gate := Answer{ID: ApprovalIDPrefix + "call_1", OK: true}
	calls := []ToolContext{
		{CallID: "call_1", IdempotencyKey: "run-uid/call_1", Answer: &gate}, // the first run after a gate's approval
		{CallID: "call_1", IdempotencyKey: "run-uid/call_1"},                // a re-execution after a restart
		{CallID: "call_1", IdempotencyKey: "run-uid/call_1/answer", Answer: &answer},
	}
	for i := range calls {
		if res, err := tool.Execute(context.Background(), map[string]any{"q": "x"}, &calls[i]); err != nil || res.IsError {
			t.Fatalf("call %d: %+v, %v", i, res, err)
		}
	}
	body := map[string]any{"q": "x"}
	want := []seenRequest{
		{Method: "POST", RawPath: "/", ContentType: "application/json", IdempotencyKey: "run-uid/call_1", Body: body},
		{Method: "POST", RawPath: "/", ContentType: "application/json", IdempotencyKey: "run-uid/call_1", Body: body},
		{Method: "POST", RawPath: "/", ContentType: "application/json", IdempotencyKey: "run-uid/call_1/answer", Body: body, Answer: &answer},
	}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
}

func TestHTTPToolSecretsNeverLeak(t *testing.T) {
	const secret = "Bearer s3cr3t-t0ken"
	const apiKey = "key-4f9a"
	// The server echoes every request header, the way debugging endpoints and some error pages do.
	echo := func(status int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(status)
			_ = r.Header.Write(w)
		}
	}
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	static := []Header{{Name: "Authorization", Value: secret}, {Name: "X-Api-Key", Value: apiKey}}
	resolved := []Header{
		{Name: "Authorization", Resolve: func(context.Context) (string, error) { return secret, nil }},
		{Name: "X-Api-Key", Value: apiKey},
	}
	failing := []Header{{Name: "Authorization", Resolve: func(context.Context) (string, error) {
		return "", errors.New(`secret "default/weather" has no key "token"`)
	}}}
	tests := []struct {
		name    string
		url     string
		headers []Header
		// wantIn must appear in the output, so the test proves it looked at the right text.
		wantIn string
	}{
		{name: "2xx echo", url: serve(t, echo(200)), headers: static, wantIn: "Authorization: " + redacted},
		{name: "non-2xx echo", url: serve(t, echo(401)), headers: static, wantIn: "HTTP 401: "},
		{name: "resolved at call time", url: serve(t, echo(200)), headers: resolved, wantIn: "X-Api-Key: " + redacted},
		{name: "resolver error names the header", url: serve(t, echo(200)), headers: failing,
			wantIn: `cannot resolve header "Authorization": secret "default/weather" has no key "token"`},
		{name: "server down", url: down.URL + "/{tok}", headers: static, wantIn: "HTTP tool leaky: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tool := mustHTTPTool(t, HTTPToolSpec{Name: "leaky", URL: tt.url, Headers: tt.headers})
			// The model may even put the secret in an argument; it must not come back either.
			res, err := tool.Execute(context.Background(), map[string]any{"tok": apiKey}, &ToolContext{})
			if err != nil {
				t.Fatalf("Execute: %v", err)
			}
			for _, s := range []string{"s3cr3t-t0ken", apiKey} {
				if strings.Contains(res.Output, s) {
					t.Errorf("output leaks %q:\n%s", s, res.Output)
				}
			}
			if !strings.Contains(res.Output, tt.wantIn) {
				t.Errorf("output %q does not contain %q", res.Output, tt.wantIn)
			}
		})
	}
}

func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestHTTPToolTruncatesLargeBodies(t *testing.T) {
	const size = 10 << 20
	const limit = 1000
	chunk := strings.Repeat("x", 1<<16)
	tests := []struct {
		name          string
		contentLength bool
		status        int
		want          string
	}{
		{name: "known length", contentLength: true, status: 200,
			want: strings.Repeat("x", limit) + fmt.Sprintf("\n[truncated: %d of %d bytes]", limit, size)},
		{name: "chunked", status: 200,
			want: strings.Repeat("x", limit) + fmt.Sprintf("\n[truncated: %d of more than %d bytes]", limit, limit)},
		{name: "error body", contentLength: true, status: 502,
			want: "HTTP 502: " + strings.Repeat("x", limit) + fmt.Sprintf("\n[truncated: %d of %d bytes]", limit, size)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var written int
			url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if tt.contentLength {
					w.Header().Set("Content-Length", fmt.Sprint(size))
				}
				w.WriteHeader(tt.status)
				for written < size {
					n, err := io.WriteString(w, chunk)
					written += n
					if err != nil {
						return // the client stopped reading: the point of the cap
					}
				}
			}))
			tool := mustHTTPTool(t, HTTPToolSpec{Name: "big", URL: url, MaxOutputBytes: limit})
			res, err := tool.Execute(context.Background(), nil, &ToolContext{})
			if err != nil {
				t.Fatalf("Execute: %v", err)
			}
			if res.Output != tt.want {
				t.Errorf("output = %.80q… (%d bytes), want %.80q… (%d bytes)", res.Output, len(res.Output), tt.want, len(tt.want))
			}
		})
	}
}

func TestCapOutputKeepsRunesWhole(t *testing.T) {
	got := capOutput("ab€", 3, false, -1) // € is 3 bytes; the cut falls inside it
	if want := "ab\n[truncated: 2 of 5 bytes]"; got != want {
		t.Errorf("capOutput = %q, want %q", got, want)
	}
}

func TestHTTPToolTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	url := serve(t, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	tool := mustHTTPTool(t, HTTPToolSpec{Name: "slow", URL: url, Timeout: 50 * time.Millisecond})
	start := time.Now()
	res, err := tool.Execute(context.Background(), nil, &ToolContext{})
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	want := ToolResult{Output: fmt.Sprintf("HTTP tool slow: no response from %s within 50ms", url), IsError: true}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("timeout took %s", d)
	}
}

func TestHTTPToolSpecErrors(t *testing.T) {
	tests := []struct {
		name string
		spec HTTPToolSpec
		want string
	}{
		{name: "no name", spec: HTTPToolSpec{URL: "http://x"}, want: "http tool: name is empty"},
		{name: "relative URL", spec: HTTPToolSpec{Name: "t", URL: "/x/{y}"}, want: `http tool t: url "/x/{y}" is not an absolute http(s) URL`},
		{name: "other scheme", spec: HTTPToolSpec{Name: "t", URL: "file:///etc/passwd"}, want: `http tool t: url "file:///etc/passwd" is not an absolute http(s) URL`},
		{name: "bad method", spec: HTTPToolSpec{Name: "t", URL: "http://x", Method: "PO ST"}, want: `http tool t: method "PO ST" is not an HTTP method token`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := HTTPTool(tt.spec)
			if err == nil || err.Error() != tt.want {
				t.Errorf("HTTPTool error = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestHTTPToolThroughToolkit(t *testing.T) {
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "hi") }))
	tool := mustHTTPTool(t, HTTPToolSpec{Name: "greet.v1", URL: url})
	tk, err := NewToolkit(tool)
	if err != nil {
		t.Fatal(err)
	}
	got := tk.Execute(context.Background(), "greet_v1", nil, nil)
	if diff := cmp.Diff(ToolResult{Output: "hi"}, got); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
}

// TestHTTPToolNetworkGuard: a refused connection or redirect is an error result that names the
// refusal, and configured headers never reach another origin, whatever client the tool is given.
func TestHTTPToolNetworkGuard(t *testing.T) {
	const secret = "Bearer redirect-s3cret"
	const apiKey = "key-7c1e"
	servers := netguardtest.NewRedirects(t)
	denied, accepted := netguardtest.Serve(t, "127.0.0.2:0", http.NotFoundHandler())
	headers := []Header{
		{Name: "Authorization", Resolve: func(context.Context) (string, error) { return secret, nil }},
		{Name: "X-Api-Key", Value: apiKey},
	}
	crossOrigin := fmt.Sprintf("netguard: redirect from %s to %s refused: a redirect may not leave the origin", servers.Origin, servers.Other)
	tests := []struct {
		name   string
		url    string
		client *http.Client
		want   string // in the output
		isErr  bool
	}{
		{name: "cross-origin redirect, default client", url: servers.Origin + "/cross", want: crossOrigin, isErr: true},
		{name: "cross-origin redirect, Go's default redirect policy", url: servers.Origin + "/cross", client: &http.Client{},
			want: crossOrigin, isErr: true},
		{name: "same-origin redirect is followed", url: servers.Origin + "/same", want: "X-Api-Key: " + redacted},
		{name: "denied address", url: denied, client: netguard.Config{Deny: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}}.Client(),
			want: "refused: 127.0.0.2/32 is denied (deny list)", isErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tool := mustHTTPTool(t, HTTPToolSpec{Name: "guarded", URL: tt.url, Headers: headers, Client: tt.client})
			res, err := tool.Execute(context.Background(), nil, &ToolContext{})
			if err != nil {
				t.Fatalf("Execute: %v", err)
			}
			if res.IsError != tt.isErr || !strings.Contains(res.Output, tt.want) {
				t.Errorf("result = %+v, want isError %v and an output containing %q", res, tt.isErr, tt.want)
			}
			for _, s := range []string{"redirect-s3cret", apiKey} {
				if strings.Contains(res.Output, s) {
					t.Errorf("output leaks %q: %s", s, res.Output)
				}
			}
		})
	}
	if n := servers.OtherRequests.Load(); n != 0 {
		t.Errorf("the other origin received %d requests, and so the headers; want none", n)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the denied server accepted %d connections, want none", n)
	}
}

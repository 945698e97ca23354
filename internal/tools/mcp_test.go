package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolnexus/operator/internal/netguard"
)

// Protocol generations a call must serve: the stateless one asks for input in input-required
// results (rounds, mcp_round_test.go), the legacy one sends elicitations in the middle of the call
// (the bridge). The legacy one is last.
var protocolModes = []struct {
	name     string
	versions []string
}{
	{name: "stateless 2026-07-28"},
	{name: "legacy 2025-11-25", versions: []string{"2025-11-25"}},
}

const loginURL = "https://auth.example.com/login"

var regionSchema = map[string]any{
	"type":       "object",
	"properties": map[string]any{"region": map[string]any{"type": "string", "enum": []any{"eu", "us"}}},
	"required":   []any{"region"},
}

// fakeMCP is a tool server built with the SDK, speaking the real protocol over HTTP.
type fakeMCP struct {
	url        string
	authorized atomic.Bool  // the user completed the login URL flow
	calls      atomic.Int32 // tools/call requests that reached a handler
	lastAuth   atomic.Value // the Authorization header of the last call
}

func startFakeMCP(t *testing.T, versions []string) *fakeMCP {
	t.Helper()
	f := &fakeMCP{}
	server := mcp.NewServer(&mcp.Implementation{Name: "fake", Version: "v0"},
		&mcp.ServerOptions{PageSize: 2, SupportedProtocolVersions: versions})
	object := map[string]any{"type": "object"}
	add := func(name string, h func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error)) {
		server.AddTool(&mcp.Tool{Name: name, Description: "the " + name + " tool", InputSchema: object},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				f.calls.Add(1)
				if req.Extra != nil {
					f.lastAuth.Store(req.Extra.Header.Get("Authorization"))
				}
				return h(ctx, req)
			})
	}
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	add("echo", func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var args struct{ Text string }
		_ = json.Unmarshal(req.Params.Arguments, &args)
		return text("echo: " + args.Text), nil
	})
	add("weather", func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "21 degrees"}},
			StructuredContent: map[string]any{"temp": 21, "sky": "clear"}}, nil
	})
	add("fail", func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "boom"}, &mcp.TextContent{Text: "quota exceeded"}}}, nil
	})
	add("mixed", func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{
			&mcp.TextContent{Text: "a chart:"},
			&mcp.ImageContent{MIMEType: "image/png", Data: []byte("12345")},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///notes.txt", MIMEType: "text/plain", Text: "notes"}},
			&mcp.ResourceLink{URI: "https://example.com/report", Name: "report"},
		}}, nil
	})
	add("whoami", func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return text("you sent " + req.Extra.Header.Get("Authorization")), nil
	})
	add("ask", func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if r, ok := req.Params.InputResponses["region"].(*mcp.ElicitResult); ok {
			if r.Action == "accept" {
				return text(fmt.Sprintf("region=%v", r.Content["region"])), nil
			}
			return text(r.Action), nil
		}
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{
			"region": &mcp.ElicitParams{Message: "Which region?", RequestedSchema: regionSchema}}}, nil
	})
	add("consent", func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if r, ok := req.Params.InputResponses["consent"].(*mcp.ElicitResult); ok {
			return text("consent: " + r.Action), nil
		}
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"consent": &mcp.ElicitParams{
			Mode: "url", Message: "Grant access to your calendar", URL: "https://consent.example.com/x?state=1", ElicitationID: "el-1"}}}, nil
	})
	add("login", func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if !f.authorized.Load() {
			return nil, mcp.URLElicitationRequiredError([]*mcp.ElicitParams{{Mode: "url", URL: loginURL,
				Message: "Sign in to continue", ElicitationID: "el-login"}})
		}
		return text("logged in"), nil
	})
	// The SDK server may never hear of a call the client gave up on (its cancellation notice
	// races the session's end), so the slow tool also ends with the test.
	stop := make(chan struct{})
	add("slow", func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		select {
		case <-ctx.Done():
		case <-stop:
		}
		return text("too late"), nil
	})
	var srv *httptest.Server
	add("die", func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		// The process "dies" with the call in flight: its connections drop, no response is sent.
		srv.CloseClientConnections()
		return &mcp.CallToolResult{}, nil
	})
	// Without versions the server speaks the stateless revision, which only a stateless handler
	// offers (server/discover); a stateful one negotiates 2025-11-25 with every client.
	opts := &mcp.StreamableHTTPOptions{Stateless: versions == nil}
	srv = httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, opts))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) }) // runs first: cleanups are last in, first out
	f.url = srv.URL
	return f
}

func connect(t *testing.T, spec MCPServerSpec) *Toolkit {
	t.Helper()
	srv, err := ConnectMCP(context.Background(), spec)
	if err != nil {
		t.Fatalf("ConnectMCP: %v", err)
	}
	tk, err := NewToolkit(srv.Tools()...)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestConnectMCPListsAllPagesAndFilters(t *testing.T) {
	for _, mode := range protocolModes {
		t.Run(mode.name, func(t *testing.T) {
			fake := startFakeMCP(t, mode.versions)
			all, err := ConnectMCP(context.Background(), MCPServerSpec{Name: "my.server", URL: fake.url})
			if err != nil {
				t.Fatalf("ConnectMCP: %v", err)
			}
			var names []string
			for _, tool := range all.Tools() {
				names = append(names, tool.Name)
			}
			// Ten tools in pages of two: every page was followed.
			want := []string{"my_server_ask", "my_server_consent", "my_server_die", "my_server_echo", "my_server_fail",
				"my_server_login", "my_server_mixed", "my_server_slow", "my_server_weather", "my_server_whoami"}
			if diff := cmp.Diff(want, names); diff != "" {
				t.Errorf("tools (-want +got):\n%s", diff)
			}
			echo := all.Tools()[3]
			// What it reaches is the server and the server's own name for it, whatever the prefix.
			if diff := cmp.Diff(Tool{Name: "my_server_echo", Description: "the echo tool", InputSchema: map[string]any{"type": "object"}, Source: SourceMCP,
				URL: fake.url, Remote: "echo"},
				echo, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Execute" }, cmp.Ignore())); diff != "" {
				t.Errorf("echo tool (-want +got):\n%s", diff)
			}

			some, err := ConnectMCP(context.Background(), MCPServerSpec{Name: "s", URL: fake.url, AllowTools: []string{"weather", "nope", "echo"}})
			if err != nil {
				t.Fatalf("ConnectMCP: %v", err)
			}
			names = nil
			for _, tool := range some.Tools() {
				names = append(names, tool.Name)
			}
			if diff := cmp.Diff([]string{"s_echo", "s_weather"}, names); diff != "" {
				t.Errorf("allow-listed tools (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"nope"}, some.MissingTools()); diff != "" {
				t.Errorf("missing tools (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMCPCallResults(t *testing.T) {
	fake := startFakeMCP(t, nil)
	tk := connect(t, MCPServerSpec{Name: "fake", URL: fake.url})
	tests := []struct {
		tool string
		args map[string]any
		want ToolResult
	}{
		{tool: "fake_echo", args: map[string]any{"text": "hi"}, want: ToolResult{Output: "echo: hi"}},
		{tool: "fake_weather", want: ToolResult{Output: `{"sky":"clear","temp":21}`}},
		{tool: "fake_fail", want: ToolResult{Output: "boom\nquota exceeded", IsError: true}},
		{tool: "fake_mixed", want: ToolResult{Output: "a chart:\n[image (image/png, 5 bytes)]\nnotes\n[resource link https://example.com/report]"}},
	}
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			got := tk.Execute(context.Background(), tt.tool, tt.args, &ToolContext{CallID: "c"})
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMCPElicitationBridge: only a 2025-11-25 server elicits within the call; a 2026-07-28 server
// asks in rounds instead (mcp_round_test.go).
func TestMCPElicitationBridge(t *testing.T) {
	for _, mode := range protocolModes[len(protocolModes)-1:] {
		t.Run(mode.name, func(t *testing.T) {
			fake := startFakeMCP(t, mode.versions)
			tk := connect(t, MCPServerSpec{Name: "fake", URL: fake.url})
			ctx := context.Background()

			form := tk.Execute(ctx, "fake_ask", nil, &ToolContext{CallID: "call_1"})
			formReq := PendingOf(form)
			wantForm := &Request{Kind: KindInput, Prompt: "Which region?", Data: map[string]any{"schema": regionSchema}}
			if diff := cmp.Diff(wantForm, formReq, ignoreRequestID); diff != "" {
				t.Fatalf("form suspension (-want +got):\n%s", diff)
			}
			again := PendingOf(tk.Execute(ctx, "fake_ask", nil, &ToolContext{CallID: "call_1"}))
			if again == nil || again.ID != formReq.ID || !strings.HasPrefix(formReq.ID, "elc-") {
				t.Errorf("re-execution suspended as %+v, want the same id %q", again, formReq.ID)
			}

			url := tk.Execute(ctx, "fake_consent", nil, &ToolContext{CallID: "call_2"})
			urlReq := PendingOf(url)
			wantURL := &Request{Kind: KindAuthorization, Prompt: "Grant access to your calendar",
				URL: "https://consent.example.com/x?state=1", Data: map[string]any{"elicitationId": "el-1"}}
			if diff := cmp.Diff(wantURL, urlReq, ignoreRequestID); diff != "" {
				t.Fatalf("URL suspension (-want +got):\n%s", diff)
			}

			answered := []struct {
				name   string
				tool   string
				answer Answer
				want   suspensionView
			}{
				{name: "form accepted with data", tool: "fake_ask",
					answer: Answer{ID: formReq.ID, OK: true, Data: map[string]any{"region": "eu"}}, want: suspensionView{Output: "region=eu"}},
				{name: "form declined", tool: "fake_ask",
					answer: AnswerDeclined(formReq.ID, ""), want: suspensionView{Output: "decline"}},
				{name: "form expired cancels", tool: "fake_ask",
					answer: AnswerDeclined(formReq.ID, ReasonExpired), want: suspensionView{Output: "cancel"}},
				{name: "answer to another request asks again", tool: "fake_ask",
					answer: Answer{ID: "toolguard:call_1", OK: true},
					want:   suspensionView{Output: "Which region?", IsError: true, Pending: formReq}},
				{name: "URL accepted", tool: "fake_consent",
					answer: Answer{ID: urlReq.ID, OK: true}, want: suspensionView{Output: "consent: accept"}},
			}
			for _, tt := range answered {
				t.Run(tt.name, func(t *testing.T) {
					callID := map[string]string{"fake_ask": "call_1", "fake_consent": "call_2"}[tt.tool]
					got := tk.Execute(ctx, tt.tool, nil, &ToolContext{CallID: callID, Answer: &tt.answer})
					if diff := cmp.Diff(tt.want, viewOf(got)); diff != "" {
						t.Errorf("result (-want +got):\n%s", diff)
					}
				})
			}
		})
	}
}

func TestMCPURLElicitationRequiredError(t *testing.T) {
	fake := startFakeMCP(t, nil)
	tk := connect(t, MCPServerSpec{Name: "fake", URL: fake.url})
	ctx := context.Background()
	first := tk.Execute(ctx, "fake_login", nil, &ToolContext{CallID: "call_3"})
	req := PendingOf(first)
	want := &Request{Kind: KindAuthorization, Prompt: "Sign in to continue", URL: loginURL, Data: map[string]any{"elicitationId": "el-login"}}
	if diff := cmp.Diff(want, req, ignoreRequestID); diff != "" {
		t.Fatalf("suspension (-want +got):\n%s", diff)
	}
	fake.authorized.Store(true) // the person completes the flow at the URL
	got := tk.Execute(ctx, "fake_login", nil, &ToolContext{CallID: "call_3", Answer: &Answer{ID: req.ID, OK: true}})
	if diff := cmp.Diff(ToolResult{Output: "logged in"}, got); diff != "" {
		t.Errorf("retry (-want +got):\n%s", diff)
	}
}

func TestMCPFailuresAreResults(t *testing.T) {
	for _, mode := range protocolModes {
		t.Run(mode.name, func(t *testing.T) {
			fake := startFakeMCP(t, mode.versions)
			tk := connect(t, MCPServerSpec{Name: "fake", URL: fake.url, Timeout: 2 * time.Second})
			tests := []struct {
				name   string
				tool   string
				prefix string
			}{
				{name: "server dies mid-call", tool: "fake_die", prefix: "MCP server fake: tool die: "},
				{name: "call times out", tool: "fake_slow", prefix: "MCP server fake: tool slow: no result within 2s"},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					start := time.Now()
					got := tk.Execute(context.Background(), tt.tool, nil, &ToolContext{CallID: "c"})
					if !got.IsError || !strings.HasPrefix(got.Output, tt.prefix) {
						t.Errorf("result = %+v, want an error starting %q", got, tt.prefix)
					}
					if d := time.Since(start); d > 5*time.Second {
						t.Errorf("took %s, want the 2s timeout to bound it", d)
					}
				})
			}
			// Nothing was left broken: the next call works.
			if got := tk.Execute(context.Background(), "fake_echo", map[string]any{"text": "still here"}, nil); got.Output != "echo: still here" {
				t.Errorf("after the failures: %+v", got)
			}
		})
	}
}

func TestMCPToolRemovedAfterListing(t *testing.T) {
	fake := startFakeMCP(t, nil)
	srv, err := ConnectMCP(context.Background(), MCPServerSpec{Name: "fake", URL: fake.url})
	if err != nil {
		t.Fatal(err)
	}
	// As if the server was upgraded between listing and the call.
	got := srv.call(context.Background(), "gone", nil, nil)
	if want := `MCP server fake: tool gone: calling "tools/call": `; !strings.HasPrefix(got.Output, want) || !strings.Contains(got.Output, `unknown tool "gone"`) || !got.IsError {
		t.Errorf("result = %+v, want an error starting %q and naming the unknown tool", got, want)
	}
}

func TestMCPHeadersAreSentAndRedacted(t *testing.T) {
	const token = "Bearer mcp-s3cret"
	fake := startFakeMCP(t, nil)
	var resolved atomic.Int32
	tk := connect(t, MCPServerSpec{Name: "fake", URL: fake.url, Headers: []Header{{Name: "Authorization",
		Resolve: func(context.Context) (string, error) { resolved.Add(1); return token, nil }}}})
	got := tk.Execute(context.Background(), "fake_whoami", nil, nil)
	if diff := cmp.Diff(ToolResult{Output: "you sent " + redacted}, got); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	if v, _ := fake.lastAuth.Load().(string); v != token {
		t.Errorf("server saw Authorization %q, want the resolved token", v)
	}
	if n := resolved.Load(); n != 2 {
		t.Errorf("headers resolved %d times, want once for listing and once for the call", n)
	}
}

func TestConnectMCPFailures(t *testing.T) {
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	notMCP := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "teapot", http.StatusTeapot)
	}))
	defer notMCP.Close()
	failing := []Header{{Name: "X-Key", Resolve: func(context.Context) (string, error) { return "", fmt.Errorf("secret gone") }}}
	tests := []struct {
		name   string
		spec   MCPServerSpec
		prefix string
	}{
		{name: "no name", spec: MCPServerSpec{URL: down.URL}, prefix: "mcp server: name is empty"},
		{name: "bad url", spec: MCPServerSpec{Name: "x", URL: "localhost:8080"}, prefix: `mcp server x: url "localhost:8080" is not an absolute http(s) URL`},
		{name: "server down", spec: MCPServerSpec{Name: "x", URL: down.URL}, prefix: "mcp server x: connecting to " + down.URL + ": "},
		{name: "not an MCP server", spec: MCPServerSpec{Name: "x", URL: notMCP.URL}, prefix: "mcp server x: connecting to " + notMCP.URL + ": "},
		{name: "header resolver", spec: MCPServerSpec{Name: "x", URL: notMCP.URL, Headers: failing}, prefix: `mcp server x: cannot resolve header "X-Key": secret gone`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, err := ConnectMCP(context.Background(), tt.spec)
			if err == nil || !strings.HasPrefix(err.Error(), tt.prefix) {
				t.Errorf("ConnectMCP = %v, %v; want an error starting %q", srv, err, tt.prefix)
			}
		})
	}
}

// startFloodingMCP is an SDK server whose tools/call responses are floods of the given shape,
// written from one reused chunk: the server holds none of it. Everything else is the SDK's.
func startFloodingMCP(t *testing.T, shape string, size int) string {
	t.Helper()
	server := mcp.NewServer(&mcp.Implementation{Name: "flood", Version: "v0"}, nil)
	server.AddTool(&mcp.Tool{Name: "flood", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{}, nil
		})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	return serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var msg struct{ Method string }
		if json.Unmarshal(body, &msg) != nil || msg.Method != "tools/call" {
			r.Body = io.NopCloser(bytes.NewReader(body))
			sdk.ServeHTTP(w, r)
			return
		}
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		switch shape {
		case "a JSON result that never ends":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"`)
		case "one SSE event that never ends":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, `data: {"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"`)
		case "SSE comments the SDK skips":
			w.Header().Set("Content-Type", "text/event-stream")
			chunk = append([]byte(": "), append(chunk, '\n')...)
		}
		for written := 0; written < size; written += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return // the client stopped reading
			}
		}
	}))
}

// TestMCPResponseBodyLimit: a server that streams 512 MiB into a response ends the call with the
// body bound's error, and the manager's memory stays bounded whatever the shape of the flood
// (go test -v -run TestMCPResponseBodyLimit ./internal/tools/ prints the figures).
func TestMCPResponseBodyLimit(t *testing.T) {
	const flood = 512 << 20
	const maxAlloc = 64 << 20
	for _, shape := range []string{"a JSON result that never ends", "one SSE event that never ends", "SSE comments the SDK skips"} {
		t.Run(shape, func(t *testing.T) {
			url := startFloodingMCP(t, shape, flood)
			tk := connect(t, MCPServerSpec{Name: "flood", URL: url, Timeout: 20 * time.Second, HTTPClient: netguard.Config{}.Client()})
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			got := tk.Execute(context.Background(), "flood_flood", nil, &ToolContext{CallID: "c"})
			elapsed := time.Since(start)
			runtime.ReadMemStats(&after)
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%s: %s, %.1f MiB allocated", shape, elapsed.Round(time.Millisecond), float64(alloc)/(1<<20))
			want := fmt.Sprintf("MCP server flood: tool flood: netguard: response body from %s exceeds 16 MiB", url)
			if diff := cmp.Diff(ToolResult{Output: want, IsError: true}, got); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
			if alloc > maxAlloc {
				t.Errorf("allocated %d MiB for a %d MiB flood, want under %d MiB", alloc>>20, flood>>20, maxAlloc>>20)
			}
		})
	}
}

package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// everythingEntry locates the npm reference server: $MCP_EVERYTHING (the Makefile sets it), else
// hack/mcp-everything.sh installs it. Without npm the test is skipped, loudly; any other failure
// to get the server fails the test.
func everythingEntry(t *testing.T) string {
	t.Helper()
	if entry := os.Getenv("MCP_EVERYTHING"); entry != "" {
		return entry
	}
	for _, bin := range []string{"node", "npm"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("SKIPPING the MCP reference-server test: %s is not on PATH (install Node.js 20+ and npm, or set MCP_EVERYTHING)", bin)
		}
	}
	var stderr bytes.Buffer
	cmd := exec.Command("../../hack/mcp-everything.sh")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/mcp-everything.sh: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// startEverything runs `node <entry> streamableHttp` on a free loopback port and returns its
// MCP endpoint once it accepts connections.
func startEverything(t *testing.T) string {
	t.Helper()
	entry := everythingEntry(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	var logs bytes.Buffer
	cmd := exec.Command("node", entry, "streamableHttp")
	cmd.Env = append(os.Environ(), fmt.Sprintf("PORT=%d", port))
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting node: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("server-everything output:\n%s", logs.String())
		}
	})
	endpoint := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			_ = conn.Close()
			return endpoint
		}
		if time.Now().After(deadline) {
			t.Fatalf("server-everything did not listen on port %d within 20s:\n%s", port, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestMCPEverything(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Node.js process")
	}
	endpoint := startEverything(t)
	ctx := context.Background()
	srv, err := ConnectMCP(ctx, MCPServerSpec{Name: "everything", URL: endpoint, Timeout: 10 * time.Second, HTTPClient: &http.Client{}})
	if err != nil {
		t.Fatalf("ConnectMCP: %v", err)
	}
	var names []string
	for _, tool := range srv.Tools() {
		names = append(names, tool.Name)
	}
	for _, want := range []string{"everything_echo", "everything_get-sum", "everything_trigger-elicitation-request", "everything_trigger-url-elicitation"} {
		if !slices.Contains(names, want) {
			t.Errorf("tool %s not listed; got %v", want, names)
		}
	}
	tk, err := NewToolkit(srv.Tools()...)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("echo", func(t *testing.T) {
		got := tk.Execute(ctx, "everything_echo", map[string]any{"message": "hello"}, &ToolContext{CallID: "c1"})
		if diff := cmp.Diff(ToolResult{Output: "Echo: hello"}, got); diff != "" {
			t.Errorf("result (-want +got):\n%s", diff)
		}
	})

	t.Run("structured content", func(t *testing.T) {
		got := tk.Execute(ctx, "everything_get-structured-content", map[string]any{"location": "Chicago"}, &ToolContext{CallID: "c2"})
		var weather map[string]any
		if got.IsError || json.Unmarshal([]byte(got.Output), &weather) != nil || weather["temperature"] == nil {
			t.Errorf("result = %+v, want the structured content as JSON", got)
		}
	})

	t.Run("form elicitation answered through the bridge", func(t *testing.T) {
		tc := &ToolContext{CallID: "c3"}
		req := PendingOf(tk.Execute(ctx, "everything_trigger-elicitation-request", nil, tc))
		if req == nil || req.Kind != KindInput || req.Prompt != "Please provide inputs for the following fields:" {
			t.Fatalf("first execution = %+v, want an input suspension", req)
		}
		schema, _ := req.Data["schema"].(map[string]any)
		if props, _ := schema["properties"].(map[string]any); props["name"] == nil {
			t.Fatalf("data.schema = %v, want the requested schema", req.Data["schema"])
		}
		tc.Answer = &Answer{ID: req.ID, OK: true, Data: map[string]any{"name": "Ada Lovelace", "check": true}}
		got := tk.Execute(ctx, "everything_trigger-elicitation-request", nil, tc)
		for _, want := range []string{"User provided the requested information", `"name": "Ada Lovelace"`, `"action": "accept"`} {
			if got.IsError || !strings.Contains(got.Output, want) {
				t.Errorf("retry output lacks %q:\n%s", want, got.Output)
			}
		}
	})

	t.Run("URL elicitation answered through the bridge", func(t *testing.T) {
		tc := &ToolContext{CallID: "c4"}
		args := map[string]any{"url": "https://example.com/consent", "message": "Consent, please"}
		req := PendingOf(tk.Execute(ctx, "everything_trigger-url-elicitation", args, tc))
		if diff := cmp.Diff(&Request{Kind: KindAuthorization, Prompt: "Consent, please", URL: "https://example.com/consent"},
			req, ignoreRequestID, cmpopts.IgnoreFields(Request{}, "Data")); diff != "" {
			t.Fatalf("first execution (-want +got):\n%s", diff)
		}
		if id, _ := req.Data["elicitationId"].(string); id == "" {
			t.Errorf("data.elicitationId missing: %v", req.Data)
		}
		tc.Answer = &Answer{ID: req.ID, OK: true}
		got := tk.Execute(ctx, "everything_trigger-url-elicitation", args, tc)
		if got.IsError || !strings.Contains(got.Output, "User completed the URL elicitation flow") {
			t.Errorf("retry = %+v", got)
		}
	})

	t.Run("URLElicitationRequired error", func(t *testing.T) {
		args := map[string]any{"url": "https://example.com/consent", "errorPath": true}
		got := tk.Execute(ctx, "everything_trigger-url-elicitation", args, &ToolContext{CallID: "c5"})
		// The server asks for a prerequisite URL through the -32042 error. Its one-shot retry
		// marker is keyed on the MCP session, which does not outlive a call here (see
		// MCPServer), so the retry is exercised against the Go fake server instead.
		want := &Request{Kind: KindAuthorization, Prompt: "Open this link to satisfy the prerequisite, then retry the request.",
			URL: "https://modelcontextprotocol.io"}
		if diff := cmp.Diff(want, PendingOf(got), ignoreRequestID, cmpopts.IgnoreFields(Request{}, "Data")); diff != "" {
			t.Errorf("suspension (-want +got):\n%s", diff)
		}
	})
}

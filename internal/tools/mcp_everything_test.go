package tools

import (
	"bytes"
	"context"
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
	t.Logf("tools: %v", names)
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

	t.Run("form elicitation through the bridge", func(t *testing.T) {
		tc := &ToolContext{CallID: "c2"}
		first := tk.Execute(ctx, "everything_trigger-elicitation-request", nil, tc)
		req := PendingOf(first)
		if req == nil {
			t.Fatalf("first execution did not suspend: %+v", first)
		}
		t.Logf("request: %+v", req)
		tc.Answer = &Answer{ID: req.ID, OK: true, Data: map[string]any{"name": "Ada", "check": true, "email": "ada@example.com"}}
		second := tk.Execute(ctx, "everything_trigger-elicitation-request", nil, tc)
		t.Logf("second: %+v", second)
	})

	t.Run("url elicitation", func(t *testing.T) {
		tc := &ToolContext{CallID: "c3"}
		args := map[string]any{"url": "https://example.com/consent", "message": "Consent, please"}
		first := tk.Execute(ctx, "everything_trigger-url-elicitation", args, tc)
		t.Logf("first: %+v", first)
		req := PendingOf(first)
		if req == nil {
			t.Fatalf("did not suspend")
		}
		tc.Answer = &Answer{ID: req.ID, OK: true}
		second := tk.Execute(ctx, "everything_trigger-url-elicitation", args, tc)
		t.Logf("second: %+v", second)
		args["errorPath"] = true
		third := tk.Execute(ctx, "everything_trigger-url-elicitation", args, &ToolContext{CallID: "c4"})
		t.Logf("third: %+v %+v", third, PendingOf(third))
	})
}

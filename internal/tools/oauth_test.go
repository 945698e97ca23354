package tools

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fakeLogins is the host side of OAuth for these tests: tokens by target, a refresh that hands out
// the next token, and the logins begun.
type fakeLogins struct {
	mu        sync.Mutex
	token     string
	refreshed string // what a refresh of a rejected token gives; "" refuses it
	logins    [][]string
	rejected  []string
}

func (f *fakeLogins) Token(_ context.Context, _, rejected string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rejected != "" {
		f.rejected = append(f.rejected, rejected)
		f.token, f.refreshed = f.refreshed, ""
	}
	return f.token, nil
}

func (f *fakeLogins) Login(_ context.Context, target string, challenges []string) (Request, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logins = append(f.logins, challenges)
	return Request{ID: LoginIDPrefix + "l1", Kind: KindAuthorization, URL: "http://127.0.0.1:1/authorize?for=" + target, Prompt: "Sign in"}, nil
}

// bearerEndpoint answers 200 with the body echo(token) to the bearer token valid, 401 with a
// challenge to anything else, and records the Authorization and answer headers it saw.
func bearerEndpoint(t *testing.T, valid *string, echo func(string) string) (*httptest.Server, *[]string, *[]string) {
	var mu sync.Mutex
	var seen, answers []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		answers = append(answers, r.Header.Get(AnswerHeader))
		want := "Bearer " + *valid
		mu.Unlock()
		if r.Header.Get("Authorization") != want {
			w.Header().Set("WWW-Authenticate", `Bearer resource_metadata="http://`+r.Host+`/.well-known/oauth-protected-resource", scope="read"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte(echo(*valid)))
	}))
	t.Cleanup(srv.Close)
	return srv, &seen, &answers
}

func TestHTTPToolSignsIn(t *testing.T) {
	valid := "tok-2"
	srv, seen, answers := bearerEndpoint(t, &valid, func(tok string) string { return `{"output":"hello ` + tok + `"}` })
	logins := &fakeLogins{token: "tok-1", refreshed: "tok-2"}
	tool := mustHTTPTool(t, HTTPToolSpec{Name: "cal", URL: srv.URL + "/today", OAuth: logins})

	// A 401 to the kept token has it refreshed, and the call made again with the new one; the
	// token the endpoint echoes is redacted from what the model sees.
	res, err := tool.Execute(context.Background(), map[string]any{}, &ToolContext{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(suspensionView{Output: "hello [redacted]"}, viewOf(res)); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"Bearer tok-1", "Bearer tok-2"}, *seen); diff != "" {
		t.Errorf("Authorization headers sent (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"tok-1"}, logins.rejected); diff != "" {
		t.Errorf("tokens reported rejected (-want +got):\n%s", diff)
	}

	// A refused refresh leaves no token: the call parks on a login with the endpoint's challenge.
	valid = "tok-3"
	res, err = tool.Execute(context.Background(), map[string]any{}, &ToolContext{})
	if err != nil {
		t.Fatal(err)
	}
	req := PendingOf(res)
	if req == nil || req.Kind != KindAuthorization || !strings.HasPrefix(req.ID, LoginIDPrefix) {
		t.Fatalf("want a login suspension, got %+v", viewOf(res))
	}
	if len(logins.logins) != 1 || len(logins.logins[0]) != 1 || !strings.Contains(logins.logins[0][0], "resource_metadata=") {
		t.Errorf("the login was begun with challenges %q, want the endpoint's one", logins.logins)
	}

	// The retry after the login carries the login's answer, which is the operator's, not the
	// endpoint's: the endpoint never sees it.
	logins.token = "tok-3"
	*answers = nil
	res, err = tool.Execute(context.Background(), map[string]any{}, &ToolContext{Answer: &Answer{ID: req.ID, OK: true}})
	if err != nil || res.IsError {
		t.Fatalf("retry: %v %+v", err, res)
	}
	if diff := cmp.Diff([]string{""}, *answers); diff != "" {
		t.Errorf("answer headers the endpoint saw (-want +got):\n%s", diff)
	}
}

func TestHTTPToolWithoutOAuthKeepsA401(t *testing.T) {
	valid := "x"
	srv, _, _ := bearerEndpoint(t, &valid, func(string) string { return "" })
	tool := mustHTTPTool(t, HTTPToolSpec{Name: "cal", URL: srv.URL})
	res, err := tool.Execute(context.Background(), nil, &ToolContext{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || !strings.HasPrefix(res.Output, "HTTP 401") || PendingOf(res) != nil {
		t.Errorf("a tool without auth.oauth must report the 401 as it is, got %+v", viewOf(res))
	}
}

// bearerMCP serves an MCP server behind the SDK's bearer middleware, accepting the token valid.
func bearerMCP(t *testing.T, valid *string) *httptest.Server {
	server := mcp.NewServer(&mcp.Implementation{Name: "guarded"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "whoami"}, func(ctx context.Context, req *mcp.CallToolRequest, _ map[string]any) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "you are " + req.Extra.TokenInfo.UserID}}}, nil, nil
	})
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	var srv *httptest.Server
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		if token != *valid {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: "alice", Expiration: time.Now().Add(time.Hour)}, nil
	}
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{ResourceMetadataURL: srv.URL + "/.well-known/oauth-protected-resource/mcp"})(handler).ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestMCPSignsIn(t *testing.T) {
	valid := "tok-1"
	srv := bearerMCP(t, &valid)
	ctx := context.Background()

	// Without a token the tools cannot be listed: they are stood in for.
	logins := &fakeLogins{}
	spec := MCPServerSpec{Name: "gh", URL: srv.URL + "/mcp", OAuth: logins, AllowTools: []string{"whoami"}}
	if _, err := ConnectMCP(ctx, spec); err == nil || !strings.Contains(err.Error(), "once someone signs in") {
		t.Fatalf("ConnectMCP without a login: %v, want a LoginRequiredError", err)
	}
	if len(logins.logins) != 0 {
		t.Errorf("listing began %d logins; only a call may", len(logins.logins))
	}
	standIns, err := SignInTools(spec)
	if err != nil || len(standIns) != 1 || standIns[0].Name != "gh_whoami" || standIns[0].Remote != "whoami" {
		t.Fatalf("SignInTools: %v %+v", err, standIns)
	}
	res, _ := standIns[0].Execute(ctx, map[string]any{}, &ToolContext{})
	if req := PendingOf(res); req == nil || !strings.HasPrefix(req.ID, LoginIDPrefix) {
		t.Fatalf("the stand-in's call: %+v, want a login suspension", viewOf(res))
	}
	if len(logins.logins) != 1 || !strings.Contains(strings.Join(logins.logins[0], ""), "/.well-known/oauth-protected-resource/mcp") {
		t.Errorf("login challenges %q, want the SDK middleware's resource_metadata", logins.logins)
	}

	// Signed in, the stand-in's retry runs the tool on the server, and listing works.
	logins.token = "tok-1"
	res, _ = standIns[0].Execute(ctx, map[string]any{}, &ToolContext{Answer: &Answer{ID: LoginIDPrefix + "l1", OK: true}})
	if diff := cmp.Diff(suspensionView{Output: "you are alice"}, viewOf(res)); diff != "" {
		t.Errorf("stand-in retry (-want +got):\n%s", diff)
	}
	server, err := ConnectMCP(ctx, spec)
	if err != nil || len(server.Tools()) != 1 {
		t.Fatalf("ConnectMCP signed in: %v", err)
	}

	// A token the server stops taking is refreshed once, and the call made with the new one.
	valid, logins.refreshed = "tok-2", "tok-2"
	res, _ = server.Tools()[0].Execute(ctx, map[string]any{}, &ToolContext{})
	if diff := cmp.Diff(suspensionView{Output: "you are alice"}, viewOf(res)); diff != "" {
		t.Errorf("call after a refresh (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"tok-1"}, logins.rejected); diff != "" {
		t.Errorf("rejected tokens (-want +got):\n%s", diff)
	}
}

func TestSignInToolWithoutAllowList(t *testing.T) {
	valid := "tok-1"
	srv := bearerMCP(t, &valid)
	logins := &fakeLogins{}
	standIns, err := SignInTools(MCPServerSpec{Name: "gh", URL: srv.URL + "/mcp", OAuth: logins})
	if err != nil || len(standIns) != 1 || standIns[0].Name != "gh_sign_in" {
		t.Fatalf("SignInTools: %v %+v", err, standIns)
	}
	res, _ := standIns[0].Execute(context.Background(), nil, &ToolContext{})
	if PendingOf(res) == nil {
		t.Fatalf("sign_in without a login: %+v, want a login suspension", viewOf(res))
	}
	logins.token = "tok-1"
	res, _ = standIns[0].Execute(context.Background(), nil, &ToolContext{Answer: &Answer{ID: LoginIDPrefix + "l1", OK: true}})
	if res.IsError || !strings.Contains(res.Output, "gh_whoami") {
		t.Errorf("sign_in after the login: %+v, want the tools it offers", viewOf(res))
	}
}

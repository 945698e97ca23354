package oauthtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"github.com/zitadel/oidc/v3/pkg/client/rp"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"

	"github.com/toolnexus/operator/internal/tools/wire"
)

// WhoamiTool is the one tool of both resources: it answers with the subject of the bearer token.
const WhoamiTool = "whoami"

// ResourceOptions configure a resource server. Every field is optional.
type ResourceOptions struct {
	// Path of the endpoint: "/mcp" for an MCP server, "/tool" for an HTTP tool by default.
	Path string
	// Scopes a token must carry (the SDK middleware answers 403 without them); they are also the
	// metadata's scopes_supported.
	Scopes []string
	// AuthorizationServers replace the AS's issuer in the protected resource metadata, for a test
	// of a document that points elsewhere. Tokens are still verified against the AS.
	AuthorizationServers []string
}

// SeenToken is one bearer token a resource accepted.
type SeenToken struct {
	// Raw is the token itself, for a test that searches for leaks.
	Raw                       string
	Subject, Issuer, ClientID string
	Audience, Scopes          []string
	Expiry                    time.Time
}

// Resource is a running resource server that requires the AS's bearer tokens.
type Resource struct {
	// URL is the endpoint, which is also the resource identifier (RFC 8707, RFC 9728): the MCP
	// server's streamable HTTP endpoint, or the HTTP tool's URL (POST, JSON arguments).
	URL string
	// MetadataURL is its protected resource metadata (RFC 9728), which the WWW-Authenticate
	// header of each 401 names.
	MetadataURL string

	verifier *op.AccessTokenVerifier

	mu           sync.Mutex
	tokens       []SeenToken
	unauthorized int
}

// StartMCPResource starts an MCP server (the MCP Go SDK, streamable HTTP) with the tool
// WhoamiTool, behind the SDK's bearer token middleware.
func StartMCPResource(t T, as *AuthServer, opts ResourceOptions) *Resource {
	t.Helper()
	if opts.Path == "" {
		opts.Path = "/mcp"
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "oauthtest", Version: "v1.0.0"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: WhoamiTool, Description: "Tells who the bearer token belongs to."},
		func(_ context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: req.Extra.TokenInfo.UserID}}}, nil, nil
		})
	return startResource(t, as, opts, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
}

// StartHTTPResource starts an HTTP tool (SPEC §4.1): a POST with JSON arguments is answered
// with the toolnexus ToolResult {"output": <the token's subject>}.
func StartHTTPResource(t T, as *AuthServer, opts ResourceOptions) *Resource {
	t.Helper()
	if opts.Path == "" {
		opts.Path = "/tool"
	}
	return startResource(t, as, opts, http.HandlerFunc(whoami))
}

// maxArgumentBytes bounds the arguments the HTTP tool reads.
const maxArgumentBytes = 64 << 10

func whoami(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "oauthtest: POST the JSON arguments", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxArgumentBytes))
	if err != nil || (len(body) > 0 && !json.Valid(body)) {
		http.Error(w, "oauthtest: the arguments are not a JSON document", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(wire.ToolResult{Output: auth.TokenInfoFromContext(r.Context()).UserID})
}

func startResource(t T, as *AuthServer, opts ResourceOptions, endpoint http.Handler) *Resource {
	srv := httptest.NewUnstartedServer(nil)
	base := "http://" + srv.Listener.Addr().String()
	prmPath := "/.well-known/oauth-protected-resource" + opts.Path
	res := &Resource{
		URL:         base + opts.Path,
		MetadataURL: base + prmPath,
		verifier:    op.NewAccessTokenVerifier(as.Issuer, rp.NewRemoteKeySet(http.DefaultClient, as.JWKSURL())),
	}
	servers := opts.AuthorizationServers
	if len(servers) == 0 {
		servers = []string{as.Issuer}
	}
	mux := http.NewServeMux()
	mux.Handle(prmPath, auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource:               res.URL,
		AuthorizationServers:   servers,
		ScopesSupported:        opts.Scopes,
		BearerMethodsSupported: []string{"header"},
	}))
	mux.Handle(opts.Path, res.countUnauthorized(auth.RequireBearerToken(res.verify, &auth.RequireBearerTokenOptions{
		ResourceMetadataURL: res.MetadataURL,
		Scopes:              opts.Scopes,
	})(endpoint)))
	srv.Config.Handler = mux
	srv.Start()
	t.Cleanup(srv.Close)
	return res
}

// verify checks a bearer token as a resource server must (MCP authorization, "Token
// Validation"): signed by the AS (its JWKS), issued by it, not expired, and for this resource.
func (res *Resource) verify(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	claims, err := op.VerifyAccessToken[*oidc.AccessTokenClaims](ctx, token, res.verifier)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", auth.ErrInvalidToken, err)
	}
	if !oauthex.MatchesResource(claims.Audience, res.URL) {
		return nil, fmt.Errorf("%w: the token's audience %q does not hold %s", auth.ErrInvalidToken, claims.Audience, res.URL)
	}
	res.mu.Lock()
	res.tokens = append(res.tokens, SeenToken{
		Raw: token, Subject: claims.Subject, Issuer: claims.Issuer, ClientID: claims.ClientID,
		Audience: slices.Clone(claims.Audience), Scopes: slices.Clone(claims.Scopes), Expiry: claims.GetExpiration(),
	})
	res.mu.Unlock()
	return &auth.TokenInfo{Scopes: claims.Scopes, Expiration: claims.GetExpiration(), UserID: claims.Subject}, nil
}

func (res *Resource) countUnauthorized(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		if rec.status == http.StatusUnauthorized {
			res.mu.Lock()
			res.unauthorized++
			res.mu.Unlock()
		}
	})
}

// Tokens are the tokens the resource accepted, one per request, in order.
func (res *Resource) Tokens() []SeenToken {
	res.mu.Lock()
	defer res.mu.Unlock()
	return slices.Clone(res.tokens)
}

// Unauthorized counts the requests the resource answered 401 (no token, or one it refused).
func (res *Resource) Unauthorized() int {
	res.mu.Lock()
	defer res.mu.Unlock()
	return res.unauthorized
}

// statusRecorder keeps the status of a response it passes on.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (w *statusRecorder) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush passes a flush on: the MCP SDK streams its answers as server-sent events.
func (w *statusRecorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

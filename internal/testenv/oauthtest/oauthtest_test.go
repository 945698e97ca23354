package oauthtest_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"golang.org/x/oauth2"

	"github.com/toolnexus/operator/internal/testenv/oauthtest"
)

// callback is the client's redirect endpoint, as the manager's would be: it only says so.
func callback(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "signed in")
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/callback"
}

// discover walks from a resource's 401 to the authorization server's metadata with the MCP SDK's
// helpers, as an MCP client does, and returns the client configuration it leads to.
func discover(ctx context.Context, t *testing.T, res *oauthtest.Resource, clientID, secret, redirect string) (oauth2.Config, *oauthex.AuthServerMeta) {
	t.Helper()
	resp, err := http.Post(res.URL, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a call without a token got %d, want 401", resp.StatusCode)
	}
	challenges, err := oauthex.ParseWWWAuthenticate(resp.Header.Values("WWW-Authenticate"))
	if err != nil || len(challenges) != 1 || challenges[0].Scheme != "bearer" {
		t.Fatalf("WWW-Authenticate %q: %v, %v", resp.Header.Values("WWW-Authenticate"), challenges, err)
	}
	if got := challenges[0].Params["resource_metadata"]; got != res.MetadataURL {
		t.Fatalf("resource_metadata %q, want %q", got, res.MetadataURL)
	}
	prm, err := oauthex.GetProtectedResourceMetadata(ctx, res.MetadataURL, res.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(prm.AuthorizationServers) != 1 {
		t.Fatalf("authorization_servers %q, want one", prm.AuthorizationServers)
	}
	asm, err := auth.GetAuthServerMetadata(ctx, prm.AuthorizationServers[0], nil)
	if err != nil || asm == nil {
		t.Fatalf("authorization server metadata of %s: %v, %v", prm.AuthorizationServers[0], asm, err)
	}
	// Left to detect the style, x/oauth2 sends a refused request twice, which the counts would see.
	style := oauth2.AuthStyleInHeader
	if secret == "" {
		style = oauth2.AuthStyleInParams
	}
	return oauth2.Config{
		ClientID: clientID, ClientSecret: secret, RedirectURL: redirect,
		Endpoint: oauth2.Endpoint{AuthURL: asm.AuthorizationEndpoint, TokenURL: asm.TokenEndpoint, AuthStyle: style},
		Scopes:   append([]string{"openid", "offline_access"}, prm.ScopesSupported...),
	}, asm
}

// signIn runs the authorization code flow with PKCE for resource up to the code, signing in
// through the browser as user, and returns the code and the verifier.
func signIn(ctx context.Context, t *testing.T, as *oauthtest.AuthServer, conf oauth2.Config, resource, user string) (code, verifier string, response url.Values) {
	t.Helper()
	verifier, state := oauth2.GenerateVerifier(), rand.Text()
	authURL := conf.AuthCodeURL(state, oauth2.S256ChallengeOption(verifier), oauth2.SetAuthURLParam("resource", resource))
	final, text, err := oauthtest.Login(ctx, t, authURL, user, as.Password(t, user))
	if err != nil {
		t.Fatalf("signing in as %s: %v", user, err)
	}
	if !strings.HasPrefix(final, conf.RedirectURL+"?") || text != "signed in" {
		t.Fatalf("the browser ended at %s showing %q, want the callback", final, text)
	}
	u, _ := url.Parse(final)
	response = u.Query()
	if response.Get("state") != state || response.Get("code") == "" {
		t.Fatalf("authorization response %v, want state %q and a code", response, state)
	}
	return response.Get("code"), verifier, response
}

func whoamiMCP(ctx context.Context, res *oauthtest.Resource, tok *oauth2.Token) (string, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "oauthtest-test", Version: "v1.0.0"}, nil)
	session, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: res.URL, HTTPClient: oauth2.NewClient(ctx, oauth2.StaticTokenSource(tok)),
	}, nil)
	if err != nil {
		return "", err
	}
	defer func() { _ = session.Close() }()
	result, err := session.CallTool(ctx, &mcp.CallToolParams{Name: oauthtest.WhoamiTool})
	if err != nil {
		return "", err
	}
	if len(result.Content) != 1 {
		return "", errors.New("whoami answered no text")
	}
	return result.Content[0].(*mcp.TextContent).Text, nil
}

// whoamiHTTP calls the HTTP tool with tok and returns the status and the body.
func whoamiHTTP(t *testing.T, res *oauthtest.Resource, tok string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, res.URL, strings.NewReader(`{"q":"who"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}

// A public client signs alice in through the browser with PKCE and the resource indicator; the
// MCP server accepts the token, the HTTP tool (another resource) refuses it.
func TestPublicClientLoginReachesTheMCPServer(t *testing.T) {
	ctx := t.Context()
	redirect := callback(t)
	as := oauthtest.StartAuthServer(t, oauthtest.AuthServerOptions{RedirectURIs: []string{redirect}, Iss: oauthtest.IssSent})
	mcpRes := oauthtest.StartMCPResource(t, as, oauthtest.ResourceOptions{})
	httpRes := oauthtest.StartHTTPResource(t, as, oauthtest.ResourceOptions{})

	conf, asm := discover(ctx, t, mcpRes, as.ClientID, "", redirect)
	if asm.Issuer != as.Issuer || !asm.AuthorizationResponseIssParameterSupported || !slices.Contains(asm.CodeChallengeMethodsSupported, "S256") {
		t.Fatalf("metadata issuer %q, iss supported %v, PKCE %q", asm.Issuer, asm.AuthorizationResponseIssParameterSupported, asm.CodeChallengeMethodsSupported)
	}
	// Both well-known documents are served, RFC 8414's and OpenID's.
	for _, path := range []string{"/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"} {
		if m, err := oauthex.GetAuthServerMeta(ctx, as.Issuer+path, as.Issuer, nil); err != nil || m == nil || m.TokenEndpoint != as.TokenEndpoint() {
			t.Fatalf("%s: %v, %v", path, m, err)
		}
	}

	code, verifier, response := signIn(ctx, t, as, conf, mcpRes.URL, "alice")
	if response.Get("iss") != as.Issuer {
		t.Errorf("authorization response iss %q, want %q", response.Get("iss"), as.Issuer)
	}
	if a := as.Authorizations(); len(a) != 1 || !slices.Equal(a[0].Resources, []string{mcpRes.URL}) || a[0].CodeChallengeMethod != "S256" {
		t.Errorf("authorizations %+v, want one for %s with S256", a, mcpRes.URL)
	}
	tok, err := conf.Exchange(ctx, code, oauth2.VerifierOption(verifier), oauth2.SetAuthURLParam("resource", mcpRes.URL))
	if err != nil {
		t.Fatal(err)
	}
	if tok.RefreshToken == "" {
		t.Error("no refresh token for offline_access")
	}
	if got := as.Grants(oidc.GrantTypeCode); got != (oauthtest.GrantCount{OK: 1}) {
		t.Errorf("code grants %+v, want one granted", got)
	}
	if !slices.Contains(as.Issued(), tok.AccessToken) || !slices.Contains(as.Issued(), tok.RefreshToken) {
		t.Error("Issued does not list the tokens of the exchange")
	}

	who, err := whoamiMCP(ctx, mcpRes, tok)
	if err != nil || who != "alice" {
		t.Fatalf("whoami on the MCP server: %q, %v; want alice", who, err)
	}
	seen := mcpRes.Tokens()
	if len(seen) == 0 {
		t.Fatal("the MCP server recorded no token")
	}
	last := seen[len(seen)-1]
	if last.Raw != tok.AccessToken || last.Subject != "alice" || last.Issuer != as.Issuer || last.ClientID != as.ClientID ||
		!slices.Contains(last.Audience, mcpRes.URL) {
		t.Errorf("the MCP server saw %+v", last)
	}

	// RFC 7009: the public client revokes its refresh token itself.
	resp, err := http.PostForm(as.RevocationEndpoint(), url.Values{
		"token": {tok.RefreshToken}, "token_type_hint": {"refresh_token"}, "client_id": {as.ClientID},
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("revocation answered %d", resp.StatusCode)
	}
	if _, err := conf.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token(); !isInvalidGrant(err) {
		t.Errorf("a refresh token revoked at the revocation endpoint: %v, want invalid_grant", err)
	}

	// The same token is not the HTTP tool's: refused, and the refusal names the tool's metadata.
	unauthorized := httpRes.Unauthorized()
	status, body, header := whoamiHTTP(t, httpRes, tok.AccessToken)
	if status != http.StatusUnauthorized || !strings.Contains(body, "audience") ||
		header.Get("WWW-Authenticate") != `Bearer resource_metadata="`+httpRes.MetadataURL+`"` {
		t.Errorf("the HTTP tool answered a token for another resource with %d %q %q", status, body, header.Get("WWW-Authenticate"))
	}
	if httpRes.Unauthorized() != unauthorized+1 || len(httpRes.Tokens()) != 0 {
		t.Errorf("the HTTP tool counted %d refusals and accepted %d tokens", httpRes.Unauthorized()-unauthorized, len(httpRes.Tokens()))
	}
	// A code is single use.
	if _, err := conf.Exchange(ctx, code, oauth2.VerifierOption(verifier)); err == nil {
		t.Error("a spent code was exchanged again")
	}
}

// A confidential client signs bob in for the HTTP tool; its short-lived token expires and is
// refreshed (the refresh token rotates), and once bob's refresh tokens are revoked the refresh is
// refused.
func TestConfidentialClientRefreshAndRevocation(t *testing.T) {
	ctx := t.Context()
	redirect := callback(t)
	const lifetime = 2 * time.Second
	as := oauthtest.StartAuthServer(t, oauthtest.AuthServerOptions{
		ClientID: "confidential", Confidential: true, RedirectURIs: []string{redirect}, AccessTokenLifetime: lifetime,
	})
	if as.Secret == "" {
		t.Fatal("a confidential client without a secret")
	}
	httpRes := oauthtest.StartHTTPResource(t, as, oauthtest.ResourceOptions{Path: "/tools/whoami", Scopes: []string{"tools.call"}})
	conf, asm := discover(ctx, t, httpRes, as.ClientID, as.Secret, redirect)
	if asm.AuthorizationResponseIssParameterSupported {
		t.Error("a server that sends no iss claims authorization_response_iss_parameter_supported")
	}

	code, verifier, response := signIn(ctx, t, as, conf, httpRes.URL, "bob")
	if response.Has("iss") {
		t.Errorf("IssOmitted sent iss %q", response.Get("iss"))
	}
	// The secret is required: without it the code is refused, and stays usable.
	public := conf
	public.ClientSecret = ""
	if _, err := public.Exchange(ctx, code, oauth2.VerifierOption(verifier)); err == nil {
		t.Fatal("a confidential client's code was exchanged without its secret")
	}
	tok, err := conf.Exchange(ctx, code, oauth2.VerifierOption(verifier), oauth2.SetAuthURLParam("resource", httpRes.URL))
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(tok.Expiry); left <= 0 || left > lifetime {
		t.Errorf("the access token expires in %v, want at most %v", left, lifetime)
	}
	status, body, _ := whoamiHTTP(t, httpRes, tok.AccessToken)
	var result struct{ Output string }
	if status != http.StatusOK || json.Unmarshal([]byte(body), &result) != nil || result.Output != "bob" {
		t.Fatalf("the HTTP tool answered %d %q, want output bob", status, body)
	}

	time.Sleep(time.Until(tok.Expiry.Add(time.Second)))
	if status, body, _ := whoamiHTTP(t, httpRes, tok.AccessToken); status != http.StatusUnauthorized {
		t.Fatalf("an expired token got %d %q, want 401", status, body)
	}
	refreshed, err := conf.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token()
	if err != nil {
		t.Fatal(err)
	}
	if refreshed.AccessToken == tok.AccessToken || refreshed.RefreshToken == "" || refreshed.RefreshToken == tok.RefreshToken {
		t.Fatal("the refresh did not issue a new access token and a rotated refresh token")
	}
	if status, body, _ := whoamiHTTP(t, httpRes, refreshed.AccessToken); status != http.StatusOK || !strings.Contains(body, `"bob"`) {
		t.Fatalf("the refreshed token got %d %q", status, body)
	}
	if seen := httpRes.Tokens(); len(seen) != 2 || !slices.Contains(seen[1].Audience, httpRes.URL) || seen[1].Subject != "bob" ||
		!slices.Contains(seen[1].Scopes, "tools.call") {
		t.Errorf("the HTTP tool accepted %+v", seen)
	}
	// A spent refresh token is refused.
	if _, err := conf.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token(); !isInvalidGrant(err) {
		t.Errorf("the spent refresh token: %v, want invalid_grant", err)
	}

	if n := as.RevokeRefresh("bob"); n != 1 {
		t.Errorf("revoked %d refresh tokens, want 1", n)
	}
	if _, err := conf.TokenSource(ctx, &oauth2.Token{RefreshToken: refreshed.RefreshToken}).Token(); !isInvalidGrant(err) {
		t.Errorf("a revoked refresh token: %v, want invalid_grant", err)
	}
	if got := as.Grants(oidc.GrantTypeRefreshToken); got != (oauthtest.GrantCount{OK: 1, Refused: 2}) {
		t.Errorf("refresh grants %+v, want 1 granted and 2 refused", got)
	}
	if got := as.Grants(oidc.GrantTypeCode); got != (oauthtest.GrantCount{OK: 1, Refused: 1}) {
		t.Errorf("code grants %+v, want 1 granted and 1 refused", got)
	}
}

func isInvalidGrant(err error) bool {
	var re *oauth2.RetrieveError
	return errors.As(err, &re) && re.ErrorCode == "invalid_grant"
}

// PKCE is enforced: a wrong verifier is refused, the right one then succeeds, and a resource the
// person did not authorize is refused at the token endpoint.
func TestPKCEAndResourceAreEnforced(t *testing.T) {
	ctx := t.Context()
	redirect := callback(t)
	as := oauthtest.StartAuthServer(t, oauthtest.AuthServerOptions{RedirectURIs: []string{redirect}})
	mcpRes := oauthtest.StartMCPResource(t, as, oauthtest.ResourceOptions{})
	conf, _ := discover(ctx, t, mcpRes, as.ClientID, "", redirect)
	code, verifier, _ := signIn(ctx, t, as, conf, mcpRes.URL, "alice")

	if _, err := conf.Exchange(ctx, code, oauth2.VerifierOption(oauth2.GenerateVerifier())); !isInvalidGrant(err) {
		t.Errorf("a wrong PKCE verifier: %v, want invalid_grant", err)
	}
	if _, err := conf.Exchange(ctx, code); err == nil {
		t.Error("a code was exchanged without its PKCE verifier")
	}
	if _, err := conf.Exchange(ctx, code, oauth2.VerifierOption(verifier), oauth2.SetAuthURLParam("resource", "http://127.0.0.1:1/other")); !isInvalidGrant(err) {
		t.Errorf("a resource that was not authorized: %v, want invalid_grant", err)
	}
	tok, err := conf.Exchange(ctx, code, oauth2.VerifierOption(verifier))
	if err != nil {
		t.Fatal(err)
	}
	if who, err := whoamiMCP(ctx, mcpRes, tok); err != nil || who != "alice" {
		t.Errorf("whoami: %q, %v", who, err)
	}
	if got := as.Grants(oidc.GrantTypeCode); got != (oauthtest.GrantCount{OK: 1, Refused: 3}) {
		t.Errorf("code grants %+v, want 1 granted and 3 refused", got)
	}
}

// The authorization endpoint itself, without a browser: a request without PKCE is sent back with
// an error and the iss the mode asks for; a redirect URI that is not registered is not followed.
func TestAuthorizationEndpointRefusals(t *testing.T) {
	redirect := callback(t)
	as := oauthtest.StartAuthServer(t, oauthtest.AuthServerOptions{RedirectURIs: []string{redirect}})
	noRedirects := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	authorize := func(redirectURI string, pkce bool) *http.Response {
		conf := oauth2.Config{ClientID: as.ClientID, RedirectURL: redirectURI, Scopes: []string{"openid"},
			Endpoint: oauth2.Endpoint{AuthURL: as.AuthorizationEndpoint()}}
		var opts []oauth2.AuthCodeOption
		if pkce {
			opts = append(opts, oauth2.S256ChallengeOption(oauth2.GenerateVerifier()))
		}
		resp, err := noRedirects.Get(conf.AuthCodeURL("s", opts...))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp
	}
	for _, c := range []struct {
		mode oauthtest.IssMode
		iss  string
	}{{oauthtest.IssOmitted, ""}, {oauthtest.IssSent, as.Issuer}, {oauthtest.IssMismatched, oauthtest.MismatchedIssuer}} {
		as.SetIss(c.mode)
		resp := authorize(redirect, false)
		loc, err := url.Parse(resp.Header.Get("Location"))
		if resp.StatusCode != http.StatusFound || err != nil || !strings.HasPrefix(loc.String(), redirect+"?") {
			t.Fatalf("mode %d: a request without PKCE got %d to %q, want a redirect to the callback", c.mode, resp.StatusCode, loc)
		}
		q := loc.Query()
		if q.Get("error") != "invalid_request" || q.Get("state") != "s" || q.Get("iss") != c.iss || q.Has("iss") != (c.iss != "") {
			t.Errorf("mode %d: error response %v, want invalid_request with iss %q", c.mode, q, c.iss)
		}
	}
	as.SetIss(oauthtest.IssOmitted)
	if resp := authorize(redirect, true); resp.StatusCode != http.StatusFound || !strings.HasPrefix(resp.Header.Get("Location"), "/login?") {
		t.Errorf("a good request got %d to %q, want the login page", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp := authorize(strings.Replace(redirect, "/callback", "/elsewhere", 1), true); resp.StatusCode == http.StatusFound {
		t.Errorf("a redirect URI that is not registered was followed to %q", resp.Header.Get("Location"))
	}
}

// A wrong password keeps the browser on the login page, and Login says so.
func TestLoginWithAWrongPassword(t *testing.T) {
	redirect := callback(t)
	as := oauthtest.StartAuthServer(t, oauthtest.AuthServerOptions{RedirectURIs: []string{redirect}})
	conf := oauth2.Config{ClientID: as.ClientID, RedirectURL: redirect, Scopes: []string{"openid"},
		Endpoint: oauth2.Endpoint{AuthURL: as.AuthorizationEndpoint()}}
	authURL := conf.AuthCodeURL("s", oauth2.S256ChallengeOption(oauth2.GenerateVerifier()))
	final, text, err := oauthtest.Login(t.Context(), t, authURL, "alice", "not-the-password")
	if err == nil || !strings.HasPrefix(final, as.Issuer+"/login") || !strings.Contains(text, "wrong username or password") {
		t.Errorf("Login with a wrong password: %q %q %v", final, text, err)
	}
	if as.Grants(oidc.GrantTypeCode) != (oauthtest.GrantCount{}) {
		t.Error("a token request without a sign-in")
	}
}

// A resource's metadata can point at other authorization servers, and names its scopes.
func TestResourceMetadataOptions(t *testing.T) {
	as := oauthtest.StartAuthServer(t, oauthtest.AuthServerOptions{})
	elsewhere := []string{"http://169.254.169.254"}
	res := oauthtest.StartMCPResource(t, as, oauthtest.ResourceOptions{AuthorizationServers: elsewhere, Scopes: []string{"repo"}})
	resp, err := http.Get(res.MetadataURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var prm oauthex.ProtectedResourceMetadata
	if err := json.NewDecoder(resp.Body).Decode(&prm); err != nil {
		t.Fatal(err)
	}
	if prm.Resource != res.URL || !slices.Equal(prm.AuthorizationServers, elsewhere) || !slices.Equal(prm.ScopesSupported, []string{"repo"}) {
		t.Errorf("metadata %+v", prm)
	}
	if !strings.HasPrefix(res.MetadataURL, strings.TrimSuffix(res.URL, "/mcp")+"/.well-known/oauth-protected-resource/mcp") {
		t.Errorf("metadata URL %s is not RFC 9728's for %s", res.MetadataURL, res.URL)
	}
}

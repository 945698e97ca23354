// Package oauthtest runs, on loopback, the outside world of a login the operator completes itself
// (SPEC §12): a real OAuth 2.1 / OpenID authorization server (zitadel/oidc's op package, which
// no one here wrote, over an in-memory storage), an MCP server and an HTTP tool that require its
// bearer tokens (the MCP Go SDK's auth middleware and protected resource metadata), and a headless
// Chromium that signs in at its login page as a person would.
//
// The protocol is the libraries'. What the harness adds is what a deployment of op adds (the
// login page, the storage: users, the client, tokens) and three test knobs op has no notion of:
// the RFC 8707 resource indicator, carried through the storage into the access token's audience;
// the RFC 9207 iss parameter of the authorization response, sent right, wrong or (as op does)
// not at all; and a count of what the token endpoint granted and refused.
package oauthtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"

	"github.com/toolnexus/operator/internal/testenv/fakehttp"
)

// T is what the harness needs of a test, the fake servers' T: *testing.T and Ginkgo's GinkgoT()
// both have it. What the harness starts is stopped by t's cleanup, so a suite starts it with the T
// of its BeforeSuite and a plain test with its own.
type T = fakehttp.T

// IssMode says what the authorization response carries as RFC 9207's iss parameter.
type IssMode int32

const (
	// IssOmitted is op's own behaviour: no iss in the authorization response, and the metadata
	// does not claim authorization_response_iss_parameter_supported.
	IssOmitted IssMode = iota
	// IssSent adds iss (the issuer) to every authorization response that leaves the server,
	// success or error, and the metadata claims support.
	IssSent
	// IssMismatched claims support but sends the iss of another server (MismatchedIssuer), as a
	// mix-up attack would.
	IssMismatched
)

// MismatchedIssuer is the iss an IssMismatched server sends.
const MismatchedIssuer = "http://127.0.0.1:1/not-this-issuer"

// DefaultUsers are the users of a server whose options name none.
var DefaultUsers = []string{"alice", "bob"}

// AuthServerOptions configure StartAuthServer. Every field is optional.
type AuthServerOptions struct {
	// ClientID is the one registered client's ID; "toolnexus" by default.
	ClientID string
	// Confidential registers the client with a generated secret (Secret, client_secret_basic or
	// client_secret_post); otherwise it is a public client that proves itself by PKCE alone.
	Confidential bool
	// RedirectURIs the client may use, compared exactly (op's rule for a web client: scheme,
	// host, port, path and query; no loopback port wildcard).
	RedirectURIs []string
	// Users who can sign in; DefaultUsers when empty. Each gets a generated password (Password).
	// A user's subject (sub) is the user's name.
	Users []string
	// AccessTokenLifetime is how long an access token is valid; an hour by default.
	AccessTokenLifetime time.Duration
	// RefreshTokenLifetime is how long a refresh token is valid; a day by default.
	RefreshTokenLifetime time.Duration
	// Iss is the initial IssMode (SetIss changes it).
	Iss IssMode
}

// Authorization is one authorization request the server accepted (before the person signed in).
type Authorization struct {
	ClientID, RedirectURI, State string
	Scopes                       []string
	// Resources are the RFC 8707 resource indicators it named.
	Resources           []string
	CodeChallengeMethod string
}

// GrantCount counts the token endpoint's answers to one grant type.
type GrantCount struct{ OK, Refused int }

// AuthServer is a running authorization server.
type AuthServer struct {
	// Issuer is its issuer identifier and base URL, http://127.0.0.1:<port> (no trailing slash).
	Issuer string
	// ClientID is the registered client; Secret its secret ("" for a public client).
	ClientID, Secret string

	provider  *op.Provider
	storage   *storage
	passwords map[string]string
	iss       atomic.Int32

	mu             sync.Mutex
	grants         map[string]GrantCount
	authorizations []Authorization
	issued         []string
}

// StartAuthServer starts an authorization server on 127.0.0.1 at a random port; it stops when
// the test ends.
func StartAuthServer(t T, opts AuthServerOptions) *AuthServer {
	t.Helper()
	if opts.ClientID == "" {
		opts.ClientID = "toolnexus"
	}
	if len(opts.Users) == 0 {
		opts.Users = DefaultUsers
	}
	if opts.AccessTokenLifetime == 0 {
		opts.AccessTokenLifetime = time.Hour
	}
	if opts.RefreshTokenLifetime == 0 {
		opts.RefreshTokenLifetime = 24 * time.Hour
	}
	srv := httptest.NewUnstartedServer(nil)
	as := &AuthServer{
		Issuer:    "http://" + srv.Listener.Addr().String(),
		ClientID:  opts.ClientID,
		passwords: map[string]string{},
		grants:    map[string]GrantCount{},
	}
	if opts.Confidential {
		as.Secret = rand.Text()
	}
	for _, user := range opts.Users {
		as.passwords[user] = rand.Text()
	}
	as.iss.Store(int32(opts.Iss))
	st, err := newStorage(opts, as)
	if err != nil {
		t.Fatalf("oauthtest: %v", err)
	}
	as.storage = st

	// op encrypts its authorization codes with this key: random, since nothing outlives the test.
	config := &op.Config{
		CryptoKey:             sha256.Sum256([]byte(rand.Text())),
		CodeMethodS256:        true,
		AuthMethodPost:        true,
		GrantTypeRefreshToken: true,
	}
	as.provider, err = op.NewProvider(config, st, op.StaticIssuer(as.Issuer), op.WithAllowInsecure())
	if err != nil {
		t.Fatalf("oauthtest: starting the authorization server: %v", err)
	}
	issuerCtx := op.NewIssuerInterceptor(as.provider.IssuerFromRequest)
	// op's Provider serves OpenID discovery only; its MetadataHandler serves RFC 8414's
	// /.well-known/oauth-authorization-server as well, from the document op builds.
	wellKnown := op.RegisterMetadataServer(metadataServer{as: as}, op.WithHTTPMiddleware(issuerCtx.Handler))
	mux := http.NewServeMux()
	mux.Handle(loginPath, issuerCtx.Handler(http.HandlerFunc(as.login)))
	mux.Handle("/", as.intercept(as.provider))
	srv.Config.Handler = wellKnown.Intercept(mux)
	srv.Start()
	t.Cleanup(srv.Close)
	return as
}

// Password is user's password; it fails the test for a user the server does not have.
func (as *AuthServer) Password(t T, user string) string {
	t.Helper()
	p, ok := as.passwords[user]
	if !ok {
		t.Fatalf("oauthtest: the authorization server has no user %q", user)
	}
	return p
}

// SetIss changes what later authorization responses carry as iss, and what the metadata claims.
func (as *AuthServer) SetIss(mode IssMode) { as.iss.Store(int32(mode)) }

// RevokeRefresh forgets every refresh token issued to user: the next refresh_token grant with one
// is refused (invalid_grant). Access tokens already issued stay valid until they expire (they are
// JWTs, checked without the server). It returns how many refresh tokens it revoked.
func (as *AuthServer) RevokeRefresh(user string) int { return as.storage.revokeRefresh(user) }

// Grants counts the token endpoint's answers by grant type (oidc.GrantTypeCode,
// oidc.GrantTypeRefreshToken, ...): OK for a 200, Refused for any other status.
func (as *AuthServer) Grants(grantType oidc.GrantType) GrantCount {
	as.mu.Lock()
	defer as.mu.Unlock()
	return as.grants[string(grantType)]
}

// Authorizations are the authorization requests the server accepted, in order.
func (as *AuthServer) Authorizations() []Authorization {
	as.mu.Lock()
	defer as.mu.Unlock()
	return slices.Clone(as.authorizations)
}

// Issued are the credentials the server handed out so far: every access, refresh and ID token of
// its token responses and the users' passwords, for a test that searches for leaks.
func (as *AuthServer) Issued() []string {
	as.mu.Lock()
	defer as.mu.Unlock()
	out := slices.Clone(as.issued)
	for _, p := range as.passwords {
		out = append(out, p)
	}
	if as.Secret != "" {
		out = append(out, as.Secret)
	}
	return out
}

// Endpoint URLs, as the metadata documents name them.
func (as *AuthServer) AuthorizationEndpoint() string {
	return as.provider.AuthorizationEndpoint().Absolute(as.Issuer)
}
func (as *AuthServer) TokenEndpoint() string { return as.provider.TokenEndpoint().Absolute(as.Issuer) }
func (as *AuthServer) RevocationEndpoint() string {
	return as.provider.RevocationEndpoint().Absolute(as.Issuer)
}
func (as *AuthServer) JWKSURL() string { return as.provider.KeysEndpoint().Absolute(as.Issuer) }

func (as *AuthServer) recordAuthorization(a Authorization) {
	as.mu.Lock()
	defer as.mu.Unlock()
	as.authorizations = append(as.authorizations, a)
}

// maxFormBytes bounds the body of a request to the authorization and token endpoints that the
// harness reads before op does.
const maxFormBytes = 64 << 10

// resourcesKey carries a request's RFC 8707 resource parameters from the HTTP layer to the
// storage: op parses no resource parameter of its own, but hands the storage the request's context.
type resourcesKey struct{}

func resourcesFrom(ctx context.Context) []string {
	r, _ := ctx.Value(resourcesKey{}).([]string)
	return r
}

// intercept adds, around op, what op has no notion of: the resource parameter of the
// authorization and token requests, the iss of the authorization response, the count of grants and
// the record of the credentials issued.
func (as *AuthServer) intercept(next http.Handler) http.Handler {
	authorize := as.provider.AuthorizationEndpoint().Relative()
	callback := authorize + "/callback"
	token := as.provider.TokenEndpoint().Relative()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case authorize, callback, token:
		default:
			next.ServeHTTP(w, r)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "oauthtest: unreadable form: "+err.Error(), http.StatusBadRequest)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), resourcesKey{}, r.Form["resource"]))
		if r.URL.Path == token {
			rec := &tokenRecorder{statusRecorder: statusRecorder{ResponseWriter: w}}
			next.ServeHTTP(rec, r)
			as.recordToken(r.PostForm.Get("grant_type"), rec)
			return
		}
		next.ServeHTTP(&issWriter{ResponseWriter: w, as: as}, r)
	})
}

func (as *AuthServer) recordToken(grantType string, rec *tokenRecorder) {
	as.mu.Lock()
	defer as.mu.Unlock()
	c := as.grants[grantType]
	if rec.status == 0 || rec.status == http.StatusOK {
		c.OK++
	} else {
		c.Refused++
	}
	as.grants[grantType] = c
	var resp oidc.AccessTokenResponse
	if json.Unmarshal(rec.body.Bytes(), &resp) == nil {
		for _, s := range []string{resp.AccessToken, resp.RefreshToken, resp.IDToken} {
			if s != "" {
				as.issued = append(as.issued, s)
			}
		}
	}
}

// tokenRecorder keeps the status and body of a token response while passing them on.
type tokenRecorder struct {
	statusRecorder
	body bytes.Buffer
}

func (w *tokenRecorder) Write(p []byte) (int, error) {
	if w.body.Len() < maxFormBytes {
		w.body.Write(p)
	}
	return w.ResponseWriter.Write(p)
}

// issWriter adds the iss parameter (RFC 9207) to a redirect that leaves the server: the
// authorization response, success or error. Redirects to the server's own login page keep none.
type issWriter struct {
	http.ResponseWriter
	as *AuthServer
}

func (w *issWriter) WriteHeader(status int) {
	mode := IssMode(w.as.iss.Load())
	if (status == http.StatusFound || status == http.StatusSeeOther) && mode != IssOmitted {
		if loc, err := url.Parse(w.Header().Get("Location")); err == nil && loc.IsAbs() && !strings.HasPrefix(loc.String(), w.as.Issuer+"/") {
			iss := w.as.Issuer
			if mode == IssMismatched {
				iss = MismatchedIssuer
			}
			q := loc.Query()
			q.Set("iss", iss)
			loc.RawQuery = q.Encode()
			w.Header().Set("Location", loc.String())
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

// metadataServer answers both well-known documents with the one op builds, plus RFC 9207's flag.
type metadataServer struct {
	op.UnimplementedMetadataServer
	as *AuthServer
}

type discoveryDocument struct {
	*oidc.DiscoveryConfiguration
	IssParameterSupported bool `json:"authorization_response_iss_parameter_supported,omitempty"`
}

func (m metadataServer) document(ctx context.Context) *op.Response {
	return op.NewResponse(discoveryDocument{
		DiscoveryConfiguration: op.CreateDiscoveryConfig(ctx, m.as.provider, m.as.storage),
		IssParameterSupported:  IssMode(m.as.iss.Load()) != IssOmitted,
	})
}

func (m metadataServer) OpenIDConfiguration(ctx context.Context, _ *op.Request[op.MetadataRequest]) (*op.Response, error) {
	return m.document(ctx), nil
}

func (m metadataServer) AuthorizationServerMetadata(ctx context.Context, _ *op.Request[op.MetadataRequest]) (*op.Response, error) {
	return m.document(ctx), nil
}

// loginPath is the server's login page, where op sends the browser with the authorization
// request's id. op leaves the login to the deployment; this one asks for a name and a password.
const loginPath = "/login"

var loginPage = template.Must(template.New("login").Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Sign in</title></head>
<body><h1>Sign in</h1>
<form method="POST" action="/login">
<input type="hidden" name="authRequestID" value="{{.ID}}">
<label>Username <input id="username" name="username" autocomplete="username"></label>
<label>Password <input id="password" name="password" type="password" autocomplete="current-password"></label>
<p id="error">{{.Error}}</p>
<button id="sign-in" type="submit">Sign in</button>
</form></body></html>`))

func (as *AuthServer) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "oauthtest: unreadable form: "+err.Error(), http.StatusBadRequest)
		return
	}
	id := r.Form.Get("authRequestID")
	if r.Method != http.MethodPost {
		renderLogin(w, http.StatusOK, id, "")
		return
	}
	user, password := r.PostForm.Get("username"), r.PostForm.Get("password")
	if p, ok := as.passwords[user]; !ok || p != password {
		renderLogin(w, http.StatusUnauthorized, id, "wrong username or password")
		return
	}
	if err := as.storage.signIn(id, user); err != nil {
		renderLogin(w, http.StatusBadRequest, id, err.Error())
		return
	}
	http.Redirect(w, r, op.AuthCallbackURL(as.provider)(r.Context(), id), http.StatusFound)
}

func renderLogin(w http.ResponseWriter, status int, id, message string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := loginPage.Execute(w, struct{ ID, Error string }{id, message}); err != nil {
		fmt.Fprintf(w, "oauthtest: %v", err)
	}
}

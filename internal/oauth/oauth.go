// Package oauth is the operator's side of a login it completes itself (SPEC §12): discovery from
// a 401 (RFC 9728 protected resource metadata, then RFC 8414 or OpenID authorization server
// metadata, through the MCP Go SDK's helpers), the authorization code flow with PKCE S256 and
// the resource indicator (RFC 8707, through golang.org/x/oauth2), the callback's checks (state,
// RFC 9207 iss, single use) and the token vault's refresh. What lasts lives in a Store the host
// provides (the login room keeps it in Secrets only the manager reads); nothing here knows
// Kubernetes.
package oauth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"

	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/netguard"
	"github.com/toolnexus/operator/internal/tools"
)

// LoginLifetime bounds how long a sign-in link works: its request may wait longer, and then a new
// link is made when the call is made again.
const LoginLifetime = 24 * time.Hour

// expiryDelta is how long before its expiry an access token is refreshed rather than sent.
const expiryDelta = 30 * time.Second

// exchangeTimeout bounds a discovery, a code exchange or a refresh: a server that never answers
// holds the call that asked no longer.
const exchangeTimeout = 30 * time.Second

// maxURLLen bounds each URL discovery learns, which the store keeps and a request shows.
const maxURLLen = 2048

// Key names a login's tokens: whose they are (the token scope of the tool's spec: Scope and
// Subject, in Namespace), for which client, and where they may go (Base: the MCP server's URL, or
// the HTTP tool's URL up to its first placeholder).
type Key struct {
	Namespace, Scope, Subject, ClientID, Base string
}

// ID is the key's name in the Store: a digest, since a subject or a URL may hold any character.
func (k Key) ID() string {
	// JSON keeps the fields apart whatever characters they hold.
	raw, _ := json.Marshal([]string{k.Namespace, k.Scope, k.Subject, k.ClientID, k.Base})
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:20])
}

// SecretRef names a client secret: a key of a Secret in a namespace.
type SecretRef struct {
	Namespace, Name, Key string
}

// Client is what a tool's spec says about its OAuth client.
type Client struct {
	ID     string
	Secret *SecretRef
	Scopes []string
}

// Run is the run a login was begun for.
type Run struct {
	Namespace, Name, UID string
}

// Endpoints are what discovery found for a resource.
type Endpoints struct {
	// Resource is the protected resource's identifier (RFC 9728): tokens go only to URLs under it.
	Resource string `json:"resource"`
	// Issuer is the authorization server's; AuthURL and TokenURL its endpoints.
	Issuer   string `json:"issuer"`
	AuthURL  string `json:"authURL"`
	TokenURL string `json:"tokenURL"`
	// IssParameter says the server sends iss in its authorization response (RFC 9207).
	IssParameter bool `json:"issParameter,omitempty"`
	// AuthStyle is how the token endpoint takes the client's credentials (oauth2.AuthStyle).
	AuthStyle oauth2.AuthStyle `json:"authStyle"`
	// Offline says the server lists the scope offline_access, which its refresh tokens need.
	Offline bool `json:"offline,omitempty"`
}

// Login is a sign-in begun and not completed: what the callback needs to complete it.
type Login struct {
	// ID is the digest of the state sent to the authorization server: the state itself is only in
	// the sign-in link, so a Login read from the Store cannot be completed without it.
	ID        string    `json:"id"`
	Key       Key       `json:"key"`
	Client    Client    `json:"client"`
	Endpoints Endpoints `json:"endpoints"`
	Scopes    []string  `json:"scopes,omitempty"`
	// Verifier is the PKCE code verifier (RFC 7636), never sent until the code is exchanged.
	Verifier    string    `json:"verifier"`
	RedirectURL string    `json:"redirectURL"`
	Run         Run       `json:"run"`
	ExpiresAt   time.Time `json:"expiresAt"`
}

// RequestID is the id of the Request the call parks on, which the callback's answer echoes.
func (l *Login) RequestID() string { return tools.LoginIDPrefix + l.ID }

// Grant is a completed login: its tokens, and how to refresh them.
type Grant struct {
	Key       Key           `json:"key"`
	Client    Client        `json:"client"`
	Endpoints Endpoints     `json:"endpoints"`
	Token     *oauth2.Token `json:"token"`
}

// Store keeps logins and grants. Its Login and Grant return nil for what is not there.
type Store interface {
	Grant(ctx context.Context, id string) (*Grant, error)
	PutGrant(ctx context.Context, g *Grant) error
	DeleteGrant(ctx context.Context, id string) error
	PutLogin(ctx context.Context, l *Login) error
	// Login returns the login and its version; TakeLogin removes that version of it, and fails
	// when it is gone or changed, so only one callback completes a login.
	Login(ctx context.Context, id string) (*Login, string, error)
	TakeLogin(ctx context.Context, id, version string) error
}

// Host is the manager's side of every login: the store, the client that reaches authorization
// and resource servers (the network guard's, redirects within the origin), the redirect URL,
// and how a client secret is read.
type Host struct {
	Store       Store
	HTTPClient  *http.Client
	RedirectURL string
	// ClientSecret reads a client secret.
	ClientSecret func(ctx context.Context, ref SecretRef) (string, error)
	// Now defaults to time.Now.
	Now func() time.Time

	locks [64]sync.Mutex
}

func (h *Host) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

// lock serialises the refreshes of one grant in this process: with rotating refresh tokens, two
// at once would have the second refused and the login forgotten.
func (h *Host) lock(id string) *sync.Mutex {
	f := fnv.New32a()
	_, _ = f.Write([]byte(id))
	return &h.locks[f.Sum32()%uint32(len(h.locks))]
}

// For is the tools.OAuth of one tool of run: its logins are key's, made with client; what names
// the tool in prompts.
func (h *Host) For(key Key, client Client, run Run, what string) tools.OAuth {
	return &signer{host: h, key: key, client: client, run: run, what: what}
}

type signer struct {
	host   *Host
	key    Key
	client Client
	run    Run
	what   string
}

// Token implements tools.OAuth.
func (s *signer) Token(ctx context.Context, target, rejected string) (string, error) {
	id := s.key.ID()
	g, err := s.host.Store.Grant(ctx, id)
	if err != nil || g == nil || g.Token == nil || !Under(target, g.Endpoints.Resource) {
		return "", err
	}
	if rejected == "" && s.fresh(g) {
		return g.Token.AccessToken, nil
	}
	lock := s.host.lock(id)
	lock.Lock()
	defer lock.Unlock()
	// Another call may have refreshed it while this one waited.
	if g, err = s.host.Store.Grant(ctx, id); err != nil || g == nil || g.Token == nil {
		return "", err
	}
	if g.Token.AccessToken != rejected && s.fresh(g) {
		return g.Token.AccessToken, nil
	}
	if g.Token.RefreshToken == "" {
		return "", s.host.Store.DeleteGrant(ctx, id)
	}
	cfg, err := s.host.config(ctx, g.Client, g.Endpoints, "", nil)
	if err != nil {
		return "", err
	}
	refreshCtx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	defer cancel()
	tok, err := cfg.TokenSource(s.host.clientContext(refreshCtx), &oauth2.Token{RefreshToken: g.Token.RefreshToken}).Token()
	if retrieve := (*oauth2.RetrieveError)(nil); errors.As(err, &retrieve) {
		// The server refused the refresh (revoked, expired): the login is forgotten, and the
		// call parks on a new one.
		return "", s.host.Store.DeleteGrant(ctx, id)
	}
	if err != nil {
		return "", fmt.Errorf("refreshing the token at %s: %s", g.Endpoints.TokenURL, explain(err))
	}
	g.Token = tok
	if err := s.host.Store.PutGrant(ctx, g); err != nil {
		return "", err
	}
	return tok.AccessToken, nil
}

func (s *signer) fresh(g *Grant) bool {
	return g.Token.AccessToken != "" && (g.Token.Expiry.IsZero() || g.Token.Expiry.After(s.host.now().Add(expiryDelta)))
}

// Login implements tools.OAuth: discovery from the challenges, then a Login kept in the Store and
// the authorization request the call parks on, whose url is the sign-in link.
func (s *signer) Login(ctx context.Context, target string, challenges []string) (tools.Request, error) {
	if s.host.RedirectURL == "" {
		return tools.Request{}, errors.New("the manager has no --oauth-redirect-url, so it cannot complete a login; ask the platform team to set it")
	}
	discoverCtx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	defer cancel()
	ep, scopes, err := s.host.discover(discoverCtx, target, s.key.Base, challenges)
	if err != nil {
		return tools.Request{}, err
	}
	if len(s.client.Scopes) > 0 {
		scopes = s.client.Scopes
	}
	if ep.Offline && !slices.Contains(scopes, "offline_access") {
		scopes = append(slices.Clone(scopes), "offline_access") // a refresh token, so nobody signs in again soon
	}
	state := rand.Text() + rand.Text()
	l := &Login{
		ID: loginID(state), Key: s.key, Client: s.client, Endpoints: ep, Scopes: scopes,
		Verifier: oauth2.GenerateVerifier(), RedirectURL: s.host.RedirectURL, Run: s.run,
		ExpiresAt: s.host.now().Add(LoginLifetime).UTC().Truncate(time.Second),
	}
	if err := s.host.Store.PutLogin(ctx, l); err != nil {
		return tools.Request{}, err
	}
	cfg, err := s.host.config(ctx, l.Client, ep, l.RedirectURL, scopes)
	if err != nil {
		return tools.Request{}, err
	}
	link := cfg.AuthCodeURL(state, oauth2.S256ChallengeOption(l.Verifier), oauth2.SetAuthURLParam("resource", ep.Resource))
	// Whose login it becomes is shown, since it is whoever signs in at the issuer.
	data := map[string]any{"issuer": ep.Issuer, "resource": ep.Resource, "tokenScope": s.scopeText()}
	if len(scopes) > 0 {
		data["scopes"] = strings.Join(scopes, " ")
	}
	return tools.Request{
		ID: l.RequestID(), Kind: tools.KindAuthorization, URL: link, Data: data,
		Prompt: fmt.Sprintf("Sign in at %s so that %s can reach %s as you. The run goes on by itself once you have signed in.",
			hostOf(ep.Issuer), s.what, ep.Resource),
	}, nil
}

// scopeText says whose the login is: "Requester alice", "Agent triage", "Run" (a run's uid says
// nothing to a person).
func (s *signer) scopeText() string {
	if s.key.Scope == "Run" {
		return "Run " + s.run.Name
	}
	return clip.Bytes(s.key.Scope+" "+s.key.Subject, 300)
}

func loginID(state string) string {
	sum := sha256.Sum256([]byte(state))
	return hex.EncodeToString(sum[:20])
}

// discover finds the resource and its authorization server from target's 401 challenges, and the
// scopes to ask for when the spec names none: the challenge's, else the resource's.
func (h *Host) discover(ctx context.Context, target, base string, challenges []string) (Endpoints, []string, error) {
	cs, err := oauthex.ParseWWWAuthenticate(challenges)
	if err != nil {
		return Endpoints{}, nil, fmt.Errorf("%s answered 401 with a WWW-Authenticate header that cannot be read: %v", hostOf(target), err)
	}
	var metadataURL string
	var scopes []string
	for _, c := range cs {
		if c.Scheme == "bearer" {
			metadataURL, scopes = c.Params["resource_metadata"], strings.Fields(c.Params["scope"])
			break
		}
	}
	client := h.discoveryClient()
	var prm *oauthex.ProtectedResourceMetadata
	var tried []string
	for _, c := range metadataCandidates(metadataURL, base) {
		got, err := oauthex.GetProtectedResourceMetadata(ctx, c.url, c.resource, client)
		if err != nil {
			tried = append(tried, clip.Bytes(err.Error(), 300))
			continue
		}
		if !Under(target, got.Resource) {
			tried = append(tried, fmt.Sprintf("%s names the resource %s, which %s is not under", c.url, got.Resource, target))
			continue
		}
		prm = got
		break
	}
	if prm == nil {
		return Endpoints{}, nil, fmt.Errorf("no protected resource metadata (RFC 9728) found for %s: %s", target, strings.Join(tried, "; "))
	}
	if len(prm.AuthorizationServers) == 0 {
		return Endpoints{}, nil, fmt.Errorf("the protected resource metadata of %s names no authorization server", prm.Resource)
	}
	issuer := prm.AuthorizationServers[0]
	asm, err := auth.GetAuthServerMetadata(ctx, issuer, client)
	if err != nil {
		return Endpoints{}, nil, fmt.Errorf("authorization server %s: %s", issuer, clip.Bytes(err.Error(), 500))
	}
	if asm == nil {
		return Endpoints{}, nil, fmt.Errorf("authorization server %s serves no metadata (RFC 8414 or OpenID discovery)", issuer)
	}
	if !slices.Contains(asm.CodeChallengeMethodsSupported, "S256") {
		return Endpoints{}, nil, fmt.Errorf("authorization server %s does not support PKCE with S256", issuer)
	}
	for name, u := range map[string]string{"resource": prm.Resource, "issuer": asm.Issuer,
		"authorization_endpoint": asm.AuthorizationEndpoint, "token_endpoint": asm.TokenEndpoint} {
		if len(u) > maxURLLen || u == "" {
			return Endpoints{}, nil, fmt.Errorf("authorization server %s: its %s is empty or longer than %d bytes", issuer, name, maxURLLen)
		}
	}
	if len(scopes) == 0 {
		scopes = prm.ScopesSupported
	}
	if len(scopes) > 32 {
		scopes = scopes[:32] // a spec names at most 32; a resource that lists more gets the first
	}
	return Endpoints{
		Resource: prm.Resource, Issuer: asm.Issuer, AuthURL: asm.AuthorizationEndpoint, TokenURL: asm.TokenEndpoint,
		IssParameter: asm.AuthorizationResponseIssParameterSupported, AuthStyle: authStyle(asm.TokenEndpointAuthMethodsSupported),
		Offline: slices.Contains(asm.ScopesSupported, "offline_access"),
	}, scopes, nil
}

type candidate struct{ url, resource string }

// metadataCandidates are where a resource's metadata may be and which resource each must name
// (RFC 9728 §3.1, as the MCP specification orders them): the challenge's URL, for the resource
// its well-known path names and for base; then the well-known URLs of base's path and origin.
func metadataCandidates(metadataURL, base string) []candidate {
	const wellKnown = "/.well-known/oauth-protected-resource"
	var out []candidate
	if u, err := url.Parse(metadataURL); err == nil && metadataURL != "" {
		if rest, ok := strings.CutPrefix(u.Path, wellKnown); ok && (rest == "" || strings.HasPrefix(rest, "/")) {
			r := url.URL{Scheme: u.Scheme, Host: u.Host, Path: rest}
			out = append(out, candidate{metadataURL, r.String()})
		}
		if len(out) == 0 || out[0].resource != base {
			out = append(out, candidate{metadataURL, base})
		}
		return out
	}
	u, err := url.Parse(base)
	if err != nil {
		return nil
	}
	origin := url.URL{Scheme: u.Scheme, Host: u.Host}
	if p := strings.Trim(u.Path, "/"); p != "" {
		at := origin
		at.Path = wellKnown + "/" + p
		out = append(out, candidate{at.String(), base})
	}
	root := origin
	root.Path = wellKnown
	return append(out, candidate{root.String(), origin.String()})
}

// Under reports whether a token issued for resource may go to target: the same origin, and a path
// at or below the resource's.
func Under(target, resource string) bool {
	t, err1 := url.Parse(target)
	r, err2 := url.Parse(resource)
	if err1 != nil || err2 != nil || r.Host == "" || !strings.EqualFold(t.Scheme, r.Scheme) || !strings.EqualFold(t.Host, r.Host) {
		return false
	}
	prefix := strings.TrimSuffix(r.Path, "/")
	return t.Path == prefix || strings.HasPrefix(t.Path, prefix+"/") || prefix == ""
}

// authStyle is how to send a confidential client's credentials, from the methods the token
// endpoint supports. Never auto-detected: that sends a refused request twice.
func authStyle(methods []string) oauth2.AuthStyle {
	switch {
	case slices.Contains(methods, "client_secret_basic"):
		return oauth2.AuthStyleInHeader
	case slices.Contains(methods, "client_secret_post"):
		return oauth2.AuthStyleInParams
	}
	return oauth2.AuthStyleInHeader // RFC 6749 §2.3.1: what every server must take
}

// config is the oauth2 configuration of a login, its client secret read now.
func (h *Host) config(ctx context.Context, c Client, ep Endpoints, redirect string, scopes []string) (*oauth2.Config, error) {
	cfg := &oauth2.Config{
		ClientID: c.ID, RedirectURL: redirect, Scopes: scopes,
		Endpoint: oauth2.Endpoint{AuthURL: ep.AuthURL, TokenURL: ep.TokenURL, AuthStyle: ep.AuthStyle},
	}
	if c.Secret == nil {
		cfg.Endpoint.AuthStyle = oauth2.AuthStyleInParams // a public client sends its id alone
		return cfg, nil
	}
	secret, err := h.ClientSecret(ctx, *c.Secret)
	if err != nil {
		return nil, err
	}
	cfg.ClientSecret = secret
	return cfg, nil
}

// discoveryClient reaches metadata through the host's client, redirects within the origin.
func (h *Host) discoveryClient() *http.Client {
	c := *h.HTTPClient
	c.CheckRedirect = netguard.CheckRedirect
	return &c
}

func (h *Host) clientContext(ctx context.Context) context.Context {
	return context.WithValue(ctx, oauth2.HTTPClient, h.HTTPClient)
}

// explain is an oauth2 error without the response body the server sent.
func explain(err error) string {
	if retrieve := (*oauth2.RetrieveError)(nil); errors.As(err, &retrieve) {
		msg := retrieve.ErrorCode
		if msg == "" && retrieve.Response != nil {
			msg = retrieve.Response.Status
		}
		if retrieve.ErrorDescription != "" {
			msg += ": " + retrieve.ErrorDescription
		}
		return clip.Bytes(msg, 300)
	}
	return clip.Bytes(err.Error(), 300)
}

func hostOf(u string) string {
	if p, err := url.Parse(u); err == nil && p.Host != "" {
		return p.Host
	}
	return u
}

// Unusable is the tools.OAuth of a tool whose login cannot be kept, for why: each call fails
// with why, without sending a request.
func Unusable(why string) tools.OAuth { return unusable(why) }

type unusable string

func (u unusable) Token(context.Context, string, string) (string, error) {
	return "", errors.New(string(u))
}

func (u unusable) Login(context.Context, string, []string) (tools.Request, error) {
	return tools.Request{}, errors.New(string(u))
}

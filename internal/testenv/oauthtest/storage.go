package oauthtest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// authRequestLifetime bounds how long a person may take between the authorization request and
// the code exchange, as a real server's would.
const authRequestLifetime = 10 * time.Minute

// storage is the in-memory op.Storage of one server: one client, its users, the pending
// authorization requests, and the refresh tokens. Access tokens are JWTs op signs with key and
// keeps no state for.
type storage struct {
	as                              *AuthServer
	client                          *client
	key                             signingKey
	accessLifetime, refreshLifetime time.Duration

	mu       sync.Mutex
	requests map[string]*authRequest
	codes    map[string]string // code → authorization request ID
	refresh  map[string]*refreshToken
}

var (
	_ op.Storage                        = (*storage)(nil)
	_ op.CanGetPrivateClaimsFromRequest = (*storage)(nil)
	_ op.CanSetUserinfoFromRequest      = (*storage)(nil)
)

func newStorage(opts AuthServerOptions, as *AuthServer) (*storage, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("generating the signing key: %w", err)
	}
	for _, uri := range opts.RedirectURIs {
		if u, err := url.Parse(uri); err != nil || !u.IsAbs() {
			return nil, fmt.Errorf("redirect URI %q is not an absolute URL", uri)
		}
	}
	return &storage{
		as: as,
		client: &client{
			id: opts.ClientID, secret: as.Secret, redirectURIs: slices.Clone(opts.RedirectURIs),
			idTokenLifetime: opts.AccessTokenLifetime,
		},
		key:             signingKey{id: rand.Text(), key: key},
		accessLifetime:  opts.AccessTokenLifetime,
		refreshLifetime: opts.RefreshTokenLifetime,
		requests:        map[string]*authRequest{},
		codes:           map[string]string{},
		refresh:         map[string]*refreshToken{},
	}, nil
}

// CreateAuthRequest keeps a validated authorization request until the person signs in. OAuth 2.1
// makes PKCE mandatory, so a request without an S256 challenge is refused here, where op, which
// follows OAuth 2.0, would let a confidential client go without one.
func (s *storage) CreateAuthRequest(ctx context.Context, req *oidc.AuthRequest, _ string) (op.AuthRequest, error) {
	if req.CodeChallenge == "" || req.CodeChallengeMethod != oidc.CodeChallengeMethodS256 {
		return nil, oidc.ErrInvalidRequest().WithDescription("PKCE with code_challenge_method S256 is required")
	}
	resources := resourcesFrom(ctx)
	for _, r := range resources {
		if u, err := url.Parse(r); err != nil || !u.IsAbs() || u.Fragment != "" {
			return nil, oidc.ErrInvalidRequest().WithDescription("resource %q is not an absolute URI without a fragment (RFC 8707)", r)
		}
	}
	a := &authRequest{
		id: rand.Text(), created: time.Now(), req: *req, resources: slices.Clone(resources),
	}
	s.mu.Lock()
	s.requests[a.id] = a
	s.mu.Unlock()
	s.as.recordAuthorization(Authorization{
		ClientID: req.ClientID, RedirectURI: req.RedirectURI, State: req.State, Scopes: slices.Clone(req.Scopes),
		Resources: slices.Clone(resources), CodeChallengeMethod: string(req.CodeChallengeMethod),
	})
	return a, nil
}

// signIn marks the authorization request id as signed in by user.
func (s *storage) signIn(id, user string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.requests[id]
	if !ok || time.Since(a.created) > authRequestLifetime {
		return errors.New("this sign-in has expired or is unknown: start again from the application")
	}
	a.subject, a.authTime = user, time.Now()
	return nil
}

func (s *storage) AuthRequestByID(_ context.Context, id string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.requests[id]
	if !ok || time.Since(a.created) > authRequestLifetime {
		return nil, errors.New("authorization request not found or expired")
	}
	return a, nil
}

// AuthRequestByCode also holds the token request to RFC 8707: the resources it names, if any,
// must be among those the authorization request named.
func (s *storage) AuthRequestByCode(ctx context.Context, code string) (op.AuthRequest, error) {
	s.mu.Lock()
	id, ok := s.codes[code]
	s.mu.Unlock()
	if !ok {
		return nil, errors.New("authorization code not found or already used")
	}
	a, err := s.AuthRequestByID(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := withinResources(resourcesFrom(ctx), a.(*authRequest).resources); err != nil {
		return nil, err
	}
	return a, nil
}

func withinResources(asked, granted []string) error {
	for _, r := range asked {
		if !slices.Contains(granted, r) {
			return oidc.ErrInvalidGrant().WithDescription("resource %q was not authorized (invalid_target, RFC 8707)", r)
		}
	}
	return nil
}

func (s *storage) SaveAuthCode(_ context.Context, id, code string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.codes[code] = id
	return nil
}

// DeleteAuthRequest runs once the code is exchanged: the code is single use.
func (s *storage) DeleteAuthRequest(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.requests, id)
	for code, rid := range s.codes {
		if rid == id {
			delete(s.codes, code)
		}
	}
	return nil
}

func (s *storage) CreateAccessToken(context.Context, op.TokenRequest) (string, time.Time, error) {
	return rand.Text(), time.Now().Add(s.accessLifetime), nil
}

// CreateAccessAndRefreshTokens issues a refresh token with the access token, and rotates it on a
// refresh: the refresh token presented is spent, as OAuth 2.1 asks of a server whose public
// clients' refresh tokens are not sender-constrained.
func (s *storage) CreateAccessAndRefreshTokens(_ context.Context, req op.TokenRequest, current string) (string, string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rt := &refreshToken{
		token: rand.Text(), subject: req.GetSubject(), clientID: s.client.id,
		audience: slices.Clone(req.GetAudience()), scopes: slices.Clone(req.GetScopes()),
		expires: time.Now().Add(s.refreshLifetime),
	}
	switch r := req.(type) {
	case *authRequest:
		rt.authTime, rt.amr = r.authTime, r.GetAMR()
	case *refreshTokenRequest:
		rt.authTime, rt.amr = r.authTime, r.amr
	}
	if current != "" {
		if _, ok := s.refresh[current]; !ok {
			return "", "", time.Time{}, oidc.ErrInvalidGrant().WithDescription("refresh token revoked or already used")
		}
		delete(s.refresh, current)
	}
	s.refresh[rt.token] = rt
	return rand.Text(), rt.token, time.Now().Add(s.accessLifetime), nil
}

// TokenRequestByRefreshToken also holds a refresh to RFC 8707: the resources it names, if any,
// must be among the audience of the original grant.
func (s *storage) TokenRequestByRefreshToken(ctx context.Context, token string) (op.RefreshTokenRequest, error) {
	s.mu.Lock()
	rt, ok := s.refresh[token]
	s.mu.Unlock()
	if !ok {
		return nil, errors.New("refresh token revoked, already used or unknown")
	}
	if time.Now().After(rt.expires) {
		return nil, errors.New("refresh token expired")
	}
	if err := withinResources(resourcesFrom(ctx), rt.audience); err != nil {
		return nil, err
	}
	copied := *rt
	return &refreshTokenRequest{&copied}, nil
}

func (s *storage) revokeRefresh(user string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for token, rt := range s.refresh {
		if rt.subject == user {
			delete(s.refresh, token)
			n++
		}
	}
	return n
}

func (s *storage) TerminateSession(_ context.Context, userID, _ string) error {
	s.revokeRefresh(userID)
	return nil
}

// RevokeToken serves the revocation endpoint (RFC 7009): a refresh token is forgotten; an access
// token is a JWT the server cannot take back, which RFC 7009 allows. op has looked the refresh
// token up with GetRefreshTokenInfo, whose token ID is the token itself.
func (s *storage) RevokeToken(_ context.Context, token, _, clientID string) *oidc.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rt, ok := s.refresh[token]; ok {
		if rt.clientID != clientID {
			return oidc.ErrInvalidClient().WithDescription("token was not issued to this client")
		}
		delete(s.refresh, token)
	}
	return nil
}

func (s *storage) GetRefreshTokenInfo(_ context.Context, _, token string) (string, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rt, ok := s.refresh[token]
	if !ok {
		return "", "", op.ErrInvalidRefreshToken
	}
	return rt.subject, rt.token, nil
}

func (s *storage) SigningKey(context.Context) (op.SigningKey, error) { return &s.key, nil }

func (s *storage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

func (s *storage) KeySet(context.Context) ([]op.Key, error) {
	return []op.Key{&publicKey{s.key}}, nil
}

func (s *storage) GetClientByClientID(_ context.Context, id string) (op.Client, error) {
	if id != s.client.id {
		return nil, fmt.Errorf("client %q is not registered", id)
	}
	return s.client, nil
}

func (s *storage) AuthorizeClientIDSecret(_ context.Context, id, secret string) error {
	if id != s.client.id || s.client.secret == "" || secret != s.client.secret {
		return errors.New("wrong client ID or secret")
	}
	return nil
}

func (s *storage) SetUserinfoFromScopes(context.Context, *oidc.UserInfo, string, string, []string) error {
	return nil
}

// SetUserinfoFromRequest fills the ID token's claims.
func (s *storage) SetUserinfoFromRequest(_ context.Context, info *oidc.UserInfo, req op.IDTokenRequest, _ []string) error {
	info.Subject, info.PreferredUsername = req.GetSubject(), req.GetSubject()
	return nil
}

func (s *storage) SetUserinfoFromToken(_ context.Context, info *oidc.UserInfo, _, subject, _ string) error {
	info.Subject, info.PreferredUsername = subject, subject
	return nil
}

func (s *storage) SetIntrospectionFromToken(context.Context, *oidc.IntrospectionResponse, string, string, string) error {
	return errors.New("introspection is not offered: access tokens are JWTs, verified with the JWKS")
}

// GetPrivateClaimsFromRequest adds the scope claim (RFC 9068) to the JWT access token, which op
// leaves out: a resource server checks the token's scopes from it.
func (s *storage) GetPrivateClaimsFromRequest(_ context.Context, req op.TokenRequest, _ []string) (map[string]any, error) {
	return map[string]any{"scope": strings.Join(req.GetScopes(), " ")}, nil
}

func (s *storage) GetPrivateClaimsFromScopes(context.Context, string, string, []string) (map[string]any, error) {
	return nil, nil
}

func (s *storage) GetKeyByIDAndClientID(context.Context, string, string) (*jose.JSONWebKey, error) {
	return nil, errors.New("private_key_jwt is not offered")
}

func (s *storage) ValidateJWTProfileScopes(context.Context, string, []string) ([]string, error) {
	return nil, errors.New("the JWT profile grant is not offered")
}

func (s *storage) Health(context.Context) error { return nil }

// client is the one registered client. A confidential client authenticates with its secret; a
// public one is "web" to op too (so that an http redirect URI on loopback is compared exactly
// rather than with op's native-app port wildcard), with no authentication but PKCE.
type client struct {
	id, secret      string
	redirectURIs    []string
	idTokenLifetime time.Duration
}

var _ op.Client = (*client)(nil)

func (c *client) GetID() string                       { return c.id }
func (c *client) RedirectURIs() []string              { return c.redirectURIs }
func (c *client) PostLogoutRedirectURIs() []string    { return nil }
func (c *client) ApplicationType() op.ApplicationType { return op.ApplicationTypeWeb }
func (c *client) AuthMethod() oidc.AuthMethod {
	if c.secret == "" {
		return oidc.AuthMethodNone
	}
	return oidc.AuthMethodBasic
}
func (c *client) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c *client) GrantTypes() []oidc.GrantType {
	return []oidc.GrantType{oidc.GrantTypeCode, oidc.GrantTypeRefreshToken}
}
func (c *client) LoginURL(id string) string {
	return loginPath + "?authRequestID=" + url.QueryEscape(id)
}
func (c *client) AccessTokenType() op.AccessTokenType  { return op.AccessTokenTypeJWT }
func (c *client) IDTokenLifetime() time.Duration       { return c.idTokenLifetime }
func (c *client) DevMode() bool                        { return false }
func (c *client) IsScopeAllowed(string) bool           { return true }
func (c *client) IDTokenUserinfoClaimsAssertion() bool { return false }
func (c *client) ClockSkew() time.Duration             { return 0 }
func (c *client) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}

// authRequest is a pending authorization request; subject is set once the person signed in.
type authRequest struct {
	id        string
	created   time.Time
	req       oidc.AuthRequest
	resources []string
	subject   string
	authTime  time.Time
}

var _ op.AuthRequest = (*authRequest)(nil)

func (a *authRequest) GetID() string  { return a.id }
func (a *authRequest) GetACR() string { return "" }
func (a *authRequest) GetAMR() []string {
	if a.Done() {
		return []string{"pwd"}
	}
	return nil
}

// GetAudience is the audience of the tokens the request leads to: the resources it named
// (RFC 8707) and the client, which an ID token's audience must hold.
func (a *authRequest) GetAudience() []string {
	return append(slices.Clone(a.resources), a.req.ClientID)
}
func (a *authRequest) GetAuthTime() time.Time { return a.authTime }
func (a *authRequest) GetClientID() string    { return a.req.ClientID }
func (a *authRequest) GetCodeChallenge() *oidc.CodeChallenge {
	return &oidc.CodeChallenge{Challenge: a.req.CodeChallenge, Method: a.req.CodeChallengeMethod}
}
func (a *authRequest) GetNonce() string                   { return a.req.Nonce }
func (a *authRequest) GetRedirectURI() string             { return a.req.RedirectURI }
func (a *authRequest) GetResponseType() oidc.ResponseType { return a.req.ResponseType }
func (a *authRequest) GetResponseMode() oidc.ResponseMode { return a.req.ResponseMode }
func (a *authRequest) GetScopes() []string                { return a.req.Scopes }
func (a *authRequest) GetState() string                   { return a.req.State }
func (a *authRequest) GetSubject() string                 { return a.subject }
func (a *authRequest) Done() bool                         { return a.subject != "" }

type refreshToken struct {
	token, subject, clientID string
	audience, scopes, amr    []string
	authTime, expires        time.Time
}

type refreshTokenRequest struct{ *refreshToken }

var _ op.RefreshTokenRequest = (*refreshTokenRequest)(nil)

func (r *refreshTokenRequest) GetAMR() []string            { return r.amr }
func (r *refreshTokenRequest) GetAudience() []string       { return r.audience }
func (r *refreshTokenRequest) GetAuthTime() time.Time      { return r.authTime }
func (r *refreshTokenRequest) GetClientID() string         { return r.clientID }
func (r *refreshTokenRequest) GetScopes() []string         { return r.scopes }
func (r *refreshTokenRequest) GetSubject() string          { return r.subject }
func (r *refreshTokenRequest) SetCurrentScopes(s []string) { r.scopes = s }

type signingKey struct {
	id  string
	key *rsa.PrivateKey
}

func (k *signingKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k *signingKey) Key() any                                    { return k.key }
func (k *signingKey) ID() string                                  { return k.id }

type publicKey struct{ signingKey }

func (k *publicKey) ID() string                         { return k.id }
func (k *publicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k *publicKey) Use() string                        { return "sig" }
func (k *publicKey) Key() any                           { return &k.key.PublicKey }

package gateway

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Every request but the probes carries a Kubernetes bearer token. The gateway asks the API server
// who it is (a TokenReview, as the gateway's own ServiceAccount) and then acts as that user by
// impersonation, so RBAC, the admission policies and the API server's stamps (requestedBy,
// answeredBy) see the caller, never the gateway. The token itself is used for nothing else.

// maxTokenBytes bounds the bearer token a request may carry.
const maxTokenBytes = 16 << 10

// systemPrefix starts the identities Kubernetes reserves for itself: ServiceAccounts
// (system:serviceaccount:...), nodes, the anonymous user, system:masters and the other
// built-in groups. The gateway never acts as one of them (docs/security.md).
const systemPrefix = "system:"

// authenticationGVK is the TokenReview kind, for the gateway's own client.
var authenticationGVK = authenticationv1.SchemeGroupVersion.WithKind("TokenReview")

// caller is an authenticated user and a client that acts as them.
type caller struct {
	user   string
	groups []string
	client client.WithWatch
}

// authError is a request the gateway does not act on: no or a bad token (401), or an identity it
// never acts as (403).
type authError struct {
	status int
	msg    string
}

func (e *authError) Error() string { return e.msg }

// authenticate returns the caller r's bearer token authenticates as.
func (g *Gateway) authenticate(ctx context.Context, r *http.Request) (*caller, error) {
	token, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok {
		return nil, &authError{http.StatusUnauthorized, "a Kubernetes bearer token is required (Authorization: Bearer <token>)"}
	}
	review := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: g.opts.Audiences}}
	if err := g.own.Create(ctx, review); err != nil {
		return nil, fmt.Errorf("reviewing the bearer token: %w", err)
	}
	if !review.Status.Authenticated {
		// The API server's reason may describe the token; the caller only learns it was refused.
		return nil, &authError{http.StatusUnauthorized, "the bearer token is not valid"}
	}
	if len(g.opts.Audiences) > 0 && !slices.ContainsFunc(review.Status.Audiences, func(a string) bool {
		return slices.Contains(g.opts.Audiences, a)
	}) {
		return nil, &authError{http.StatusUnauthorized, "the bearer token is not issued for this gateway's audiences"}
	}
	user := review.Status.User
	if err := actsAs(user.Username); err != nil {
		return nil, err
	}
	groups := make([]string, 0, len(user.Groups))
	for _, group := range user.Groups {
		// The API server adds system:authenticated to an impersonated user itself; the other
		// system: groups (system:masters above all) are never passed on.
		if !strings.HasPrefix(group, systemPrefix) {
			groups = append(groups, group)
		}
	}
	c, err := g.clientAs(user.Username, groups)
	if err != nil {
		return nil, err
	}
	return &caller{user: user.Username, groups: groups, client: c}, nil
}

// actsAs refuses the identities the gateway never impersonates.
func actsAs(user string) error {
	switch {
	case user == "":
		return &authError{http.StatusUnauthorized, "the bearer token names no user"}
	case strings.HasPrefix(user, systemPrefix):
		return &authError{http.StatusForbidden, fmt.Sprintf(
			"the gateway does not act as %s: ServiceAccounts and other system: identities cannot call agents over A2A; use a person's token", user)}
	}
	return nil
}

// clientAs returns a client that impersonates user in groups. client-go shares the connections of
// configs that differ only in who they impersonate.
func (g *Gateway) clientAs(user string, groups []string) (client.WithWatch, error) {
	if err := actsAs(user); err != nil {
		return nil, err
	}
	for _, group := range groups {
		if strings.HasPrefix(group, systemPrefix) {
			return nil, fmt.Errorf("refusing to impersonate the group %s", group)
		}
	}
	cfg := rest.CopyConfig(g.opts.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return client.NewWithWatch(cfg, client.Options{Scheme: g.opts.Scheme, Mapper: g.mapper})
}

// bearerToken reads the token of an Authorization header.
func bearerToken(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || len(token) > maxTokenBytes {
		return "", false
	}
	return token, true
}

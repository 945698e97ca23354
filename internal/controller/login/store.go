package login

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/oauth"
)

// Labels and names of the Secrets that keep logins and grants, in the manager's namespace.
const (
	// KindLabel is "grant" or "login".
	KindLabel = "toolnexus.dev/oauth"
	// NamespaceLabel is the namespace of the runs a grant or login is for.
	NamespaceLabel = "toolnexus.dev/oauth-namespace"
	// ScopeAnnotation says whose a grant is ("Requester alice"), and ResourceAnnotation where
	// its tokens go: for a person deciding which Secret to delete to forget a login.
	ScopeAnnotation    = "toolnexus.dev/oauth-scope"
	ResourceAnnotation = "toolnexus.dev/oauth-resource"

	grantPrefix = "toolnexus-oauth-grant-"
	loginPrefix = "toolnexus-oauth-login-"
	dataKey     = "oauth"
)

// SecretStore is the oauth.Store in Secrets of one namespace (the manager's), which no role of
// the project grants tenants: a tenant's run can use a login, never read it. Reads go around the
// cache; the manager keeps no Secret values in memory.
type SecretStore struct {
	Client    client.Client
	Reader    client.Reader
	Namespace string
}

var _ oauth.Store = (*SecretStore)(nil)

// Grant implements oauth.Store.
func (s *SecretStore) Grant(ctx context.Context, id string) (*oauth.Grant, error) {
	var g oauth.Grant
	if _, found, err := s.read(ctx, grantPrefix+id, &g); err != nil || !found {
		return nil, err
	}
	return &g, nil
}

// PutGrant implements oauth.Store: the last login or refresh wins.
func (s *SecretStore) PutGrant(ctx context.Context, g *oauth.Grant) error {
	scope := clip.Bytes(g.Key.Scope+" "+g.Key.Subject, 256)
	return s.write(ctx, grantPrefix+g.Key.ID(), "grant", g.Key.Namespace,
		map[string]string{ScopeAnnotation: scope, ResourceAnnotation: clip.Bytes(g.Endpoints.Resource, 1024)}, g)
}

// DeleteGrant implements oauth.Store.
func (s *SecretStore) DeleteGrant(ctx context.Context, id string) error {
	err := s.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: grantPrefix + id}})
	return client.IgnoreNotFound(err)
}

// PutLogin implements oauth.Store.
func (s *SecretStore) PutLogin(ctx context.Context, l *oauth.Login) error {
	return s.write(ctx, loginPrefix+l.ID, "login", l.Key.Namespace, nil, l)
}

// Login implements oauth.Store.
func (s *SecretStore) Login(ctx context.Context, id string) (*oauth.Login, string, error) {
	var l oauth.Login
	version, found, err := s.read(ctx, loginPrefix+id, &l)
	if err != nil || !found {
		return nil, "", err
	}
	return &l, version, nil
}

// TakeLogin implements oauth.Store: a delete preconditioned on the version read.
func (s *SecretStore) TakeLogin(ctx context.Context, id, version string) error {
	return s.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: loginPrefix + id}},
		client.Preconditions{ResourceVersion: &version})
}

func (s *SecretStore) read(ctx context.Context, name string, into any) (version string, found bool, err error) {
	var sec corev1.Secret
	if err := s.Reader.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: name}, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("reading the login store: %w", err)
	}
	if err := json.Unmarshal(sec.Data[dataKey], into); err != nil {
		return "", false, fmt.Errorf("the login store's Secret %s/%s cannot be read (%v); delete it to forget the login", s.Namespace, name, err)
	}
	return sec.ResourceVersion, true, nil
}

func (s *SecretStore) write(ctx context.Context, name, kind, namespace string, annotations map[string]string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: name, Annotations: annotations,
			Labels: map[string]string{KindLabel: kind, NamespaceLabel: namespace}},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{dataKey: raw},
	}
	err = s.Client.Create(ctx, sec)
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	var old corev1.Secret
	if err := s.Reader.Get(ctx, client.ObjectKeyFromObject(sec), &old); err != nil {
		return err
	}
	sec.ResourceVersion = old.ResourceVersion
	return s.Client.Update(ctx, sec)
}

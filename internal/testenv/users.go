package testenv

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// User is a person or a program as the API server authenticates it: its name and groups, a
// rest.Config and a client that act as it, and a kubeconfig file for running kubectl or the plugin
// as it.
type User struct {
	envtest.User
	Config     *rest.Config
	Client     client.Client
	Kubeconfig string
}

// User provisions a certificate user: a client certificate, signed by the API server's client CA,
// whose common name is name and whose organizations are groups.
func (e *Env) User(t T, name string, groups ...string) *User {
	t.Helper()
	authenticated, err := e.Environment.AddUser(envtest.User{Name: name, Groups: groups}, e.Config)
	if err != nil {
		t.Fatalf("testenv: provisioning user %s: %v", name, err)
	}
	return e.authenticated(t, envtest.User{Name: name, Groups: groups}, authenticated.Config())
}

// tokenLifetime is how long a ServiceAccount token lasts: longer than any suite runs.
const tokenLifetime = 12 * time.Hour

// ServiceAccount authenticates as the ServiceAccount namespace/name, which must exist, with a token
// the API server issues for it (a TokenRequest): the identity a pod running as it has.
func (e *Env) ServiceAccount(t T, namespace, name string) *User {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	token := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(tokenLifetime / time.Second))}}
	if err := e.Client.SubResource("token").Create(context.Background(), sa, token); err != nil {
		t.Fatalf("testenv: requesting a token for ServiceAccount %s/%s: %v", namespace, name, err)
	}
	cfg := rest.AnonymousClientConfig(e.Config)
	cfg.BearerToken = token.Status.Token
	return e.authenticated(t, serviceAccountUser(namespace, name), cfg)
}

// Manager authenticates as the manager's ServiceAccount, which Install("rbac") creates and binds.
func (e *Env) Manager(t T) *User {
	t.Helper()
	return e.ServiceAccount(t, ManagerNamespace, managerServiceAccount)
}

// authenticated completes the User that cfg authenticates as, after checking with the API server
// that cfg is who it should be.
func (e *Env) authenticated(t T, user envtest.User, cfg *rest.Config) *User {
	t.Helper()
	c, err := client.New(cfg, client.Options{Scheme: e.Scheme})
	if err != nil {
		t.Fatalf("testenv: a client for %s: %v", user.Name, err)
	}
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(context.Background(), review); err != nil {
		t.Fatalf("testenv: asking the API server who %s is: %v", user.Name, err)
	}
	if got := review.Status.UserInfo; got.Username != user.Name || !containsAll(got.Groups, user.Groups) {
		t.Fatalf("testenv: the API server authenticates %s in groups %v, want %s in %v", got.Username, got.Groups, user.Name, user.Groups)
	}
	kubeconfig, err := writeKubeconfig(cfg, filepath.Join(e.dir, "kubeconfig-"+fileSafe.Replace(user.Name)))
	if err != nil {
		t.Fatalf("testenv: a kubeconfig for %s: %v", user.Name, err)
	}
	return &User{User: user, Config: cfg, Client: c, Kubeconfig: kubeconfig}
}

var fileSafe = strings.NewReplacer(":", "-", "/", "-")

func containsAll(have, want []string) bool {
	set := map[string]bool{}
	for _, g := range have {
		set[g] = true
	}
	for _, g := range want {
		if !set[g] {
			return false
		}
	}
	return true
}

// writeKubeconfig writes a kubeconfig that authenticates as cfg does (client certificate or
// bearer token) to path.
func writeKubeconfig(cfg *rest.Config, path string) (string, error) {
	kubeconfig := clientcmdapi.NewConfig()
	kubeconfig.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kubeconfig.AuthInfos["user"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kubeconfig.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "user"}
	kubeconfig.CurrentContext = "envtest"
	raw, err := clientcmd.Write(*kubeconfig)
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, raw, 0o600)
}

// Users are RBAC subjects for the users named.
func Users(names ...string) []rbacv1.Subject {
	subjects := make([]rbacv1.Subject, len(names))
	for i, name := range names {
		subjects[i] = rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
	}
	return subjects
}

// Group is the RBAC subject for the group named.
func Group(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: name}
}

// Bind binds the ClusterRole role to subjects in every namespace (a ClusterRoleBinding named
// name), as an administrator would.
func (e *Env) Bind(t T, name, role string, subjects ...rbacv1.Subject) {
	t.Helper()
	if err := e.Client.Create(context.Background(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   subjects,
	}); err != nil {
		t.Fatalf("testenv: binding ClusterRole %s: %v", role, err)
	}
}

// Allowed asks the authorizer whether user may do what attrs say.
func (e *Env) Allowed(ctx context.Context, user envtest.User, attrs authorizationv1.ResourceAttributes) (bool, error) {
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user.Name, Groups: user.Groups, ResourceAttributes: &attrs}}
	if err := e.Client.Create(ctx, review); err != nil {
		return false, err
	}
	return review.Status.Allowed, nil
}

// Access is verb on a toolnexus.dev resource, "name" or "name/subresource", in every namespace.
func Access(verb, resource string) authorizationv1.ResourceAttributes {
	name, sub, _ := strings.Cut(resource, "/")
	return authorizationv1.ResourceAttributes{Verb: verb, Group: toolnexusv1alpha1.GroupVersion.Group, Resource: name, Subresource: sub}
}

// grantTimeout bounds the wait for the authorizer to see new RBAC objects.
const grantTimeout = time.Minute

// WaitAllowed waits until the authorizer lets user do each of attrs. It sees new RBAC objects a
// moment after they are created, and objects of different kinds in no fixed order, so a suite
// waits for every permission its specs use before they run.
func (e *Env) WaitAllowed(t T, user envtest.User, attrs ...authorizationv1.ResourceAttributes) {
	t.Helper()
	for _, a := range attrs {
		err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, grantTimeout, true,
			func(ctx context.Context) (bool, error) { return e.Allowed(ctx, user, a) })
		if err != nil {
			t.Fatalf("testenv: %s may not %s within %s: %v", user.Name, describe(a), grantTimeout, err)
		}
	}
}

func describe(a authorizationv1.ResourceAttributes) string {
	what := a.Resource
	if a.Subresource != "" {
		what += "/" + a.Subresource
	}
	if a.Group != "" {
		what += "." + a.Group
	}
	if a.Namespace != "" {
		what += " in " + a.Namespace
	}
	return a.Verb + " " + what
}

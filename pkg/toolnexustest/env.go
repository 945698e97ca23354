package toolnexustest

import (
	"context"
	"fmt"
	"io"
	"slices"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller"
	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/internal/testenv/operator"
)

// The ClusterRoles config/rbac installs for people, to bind with Env.Grant.
const (
	// RoleAnswerer may read PendingRequests and answer them (patch pendingrequests/status).
	RoleAnswerer = "toolnexus-answerer"
	// RoleEditor may create, change and delete AgentRuns and Agents.
	RoleEditor = "toolnexus-agentrun-editor"
	// RoleViewer may read AgentRuns, Agents, PendingRequests and transcripts.
	RoleViewer = "toolnexus-agentrun-viewer"
)

// Options say how Start runs the operator.
type Options struct {
	// RequireSecretLabel runs the manager with --require-secret-label: runs read only Secrets
	// labelled toolnexus.dev/agentrun-access=true.
	RequireSecretLabel bool
	// Logs receives the manager's logs; nil discards them. Start sets controller-runtime's
	// process-wide logger to write there.
	Logs io.Writer
}

// Env is a control plane with the operator installed and running, for one test or suite.
type Env struct {
	// Admin is a client of the control plane's administrator (system:masters); Config authenticates
	// as it; Scheme holds the built-in types and toolnexus.dev/v1alpha1.
	Admin  client.Client
	Config *rest.Config
	Scheme *runtime.Scheme

	env     *testenv.Env
	manager *operator.Manager
}

// User is a certificate user of the control plane: the API server authenticates Client and
// Config as Name in Groups; Kubeconfig is a kubeconfig file that does too, for kubectl.
type User struct {
	Name       string
	Groups     []string
	Client     client.Client
	Config     *rest.Config
	Kubeconfig string
}

// Start starts a kube-apiserver and etcd, installs the operator's CRDs, admission policies and RBAC
// (config/crd, config/policies, config/rbac), and runs the operator's manager in-process as its
// ServiceAccount (config/rbac's toolnexus-controller-manager), as a deployment would. Everything
// stops when t ends.
func Start(t T, o Options) *Env {
	t.Helper()
	logs := o.Logs
	if logs == nil {
		logs = io.Discard
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logs)))
	env := testenv.Start(t, testenv.Options{Install: []string{"rbac", "policies"}})
	manager := operator.New(t, env.Manager(t).Config, func() controller.Options {
		return controller.Options{RequireSecretLabel: o.RequireSecretLabel, ManagerNamespace: testenv.ManagerNamespace}
	})
	manager.Start(t)
	return &Env{Admin: env.Client, Config: env.Config, Scheme: env.Scheme, env: env, manager: manager}
}

// RestartManager stops the manager and starts a new one, as a restarted pod would: runs parked on a
// PendingRequest stay parked and resume when it is answered.
func (e *Env) RestartManager(t T) {
	t.Helper()
	e.manager.Restart(t)
}

// Namespace creates a namespace named prefix and a random suffix and returns its name.
func (e *Env) Namespace(t T, prefix string) string {
	t.Helper()
	return e.env.Namespace(t, prefix)
}

// User provisions a certificate user named name in groups. It may do nothing until granted a role
// (Grant) or named in a run's spec.suspension.approvers with a role that lets it answer.
func (e *Env) User(t T, name string, groups ...string) *User {
	t.Helper()
	u := e.env.User(t, name, groups...)
	return &User{Name: u.Name, Groups: u.Groups, Client: u.Client, Config: u.Config, Kubeconfig: u.Kubeconfig}
}

// Grant binds the ClusterRole role (for example RoleAnswerer) to u in every namespace and waits
// until the API server's authorizer lets u do what the role's toolnexus.dev rules say.
func (e *Env) Grant(t T, role string, u *User) {
	t.Helper()
	ctx := context.Background()
	cr := &rbacv1.ClusterRole{}
	if err := e.Admin.Get(ctx, client.ObjectKey{Name: role}, cr); err != nil {
		t.Fatalf("toolnexustest: reading ClusterRole %s: %v", role, err)
	}
	e.env.Bind(t, fmt.Sprintf("%s-%s", role, u.Name), role, testenv.Users(u.Name)...)
	var attrs []authorizationv1.ResourceAttributes
	for _, rule := range cr.Rules {
		if !slices.Contains(rule.APIGroups, toolnexusv1alpha1.GroupVersion.Group) {
			continue
		}
		for _, resource := range rule.Resources {
			for _, verb := range rule.Verbs {
				attrs = append(attrs, testenv.Access(verb, resource))
			}
		}
	}
	e.env.WaitAllowed(t, envtest.User{Name: u.Name, Groups: u.Groups}, attrs...)
}

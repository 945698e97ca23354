// Package trust_test checks the trust boundary (docs/security.md) against a real API server: the manager
// runs as its ServiceAccount with the RBAC of config/rbac, the admission policies of
// config/policies are installed, and people act as distinct authenticated users. A namespace
// editor who is not an approver tries everything an editor can do to make a gated call run.
package trust_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/toolnexus/operator/internal/controller"
	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/internal/testenv/operator"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

var (
	testEnv *testenv.Env
	ctx     = context.Background()
	// admin is system:masters: it stands in for a bug or a disk fault where a test damages what
	// only the manager can write.
	admin client.Client
	// erin holds what the built-in edit role gives in a namespace: config/rbac's editor and viewer
	// roles (aggregated to edit) and every verb on ConfigMaps and Secrets. She is no answerer.
	// alice is an answerer (config/rbac's answerer role) and the runs' approver; bob and carol are
	// answerers too, named by some ApprovalPolicies. aliceUser has alice's kubeconfig, for kubectl.
	erin, alice, bob, carol client.Client
	aliceUser               *testenv.User
	// managerConfig authenticates as the manager's ServiceAccount.
	managerConfig *rest.Config
	// toolnexus is the operator, run as managerConfig; managerDone is closed once the running
	// manager has stopped.
	toolnexus   *operator.Manager
	managerDone <-chan struct{}
)

func TestTrustBoundary(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Trust boundary (envtest, real users)")
}

var _ = BeforeSuite(func() {
	ctrl.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	testEnv = testenv.Start(GinkgoT(), testenv.Options{Install: []string{"rbac", "policies"}})
	admin = clientAs(envtest.User{Name: "admin", Groups: []string{"system:masters"}})

	// envtest runs no controller-manager, so ClusterRole aggregation does not happen: bind erin
	// to what "edit" would aggregate, and give her ConfigMaps and Secrets as "edit" does.
	Expect(admin.Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "test-edit-core"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps", "secrets"}, Verbs: []string{"*"}}},
	})).To(Succeed())
	for _, role := range []string{"toolnexus-agentrun-editor", "toolnexus-agentrun-viewer", "test-edit-core"} {
		bind("erin-"+role, role, "erin")
	}
	for _, user := range []string{"alice", "bob", "carol"} {
		bind(user+"-answerer", "toolnexus-answerer", user)
	}
	erin = clientAs(envtest.User{Name: "erin"})
	aliceUser = testEnv.User(GinkgoT(), "alice")
	alice = aliceUser.Client
	bob = clientAs(envtest.User{Name: "bob"})
	carol = clientAs(envtest.User{Name: "carol"})
	managerConfig = testEnv.Manager(GinkgoT()).Config
	// The manager requires the Secret access label and holds at most 8 MiB of transcript per run.
	toolnexus = operator.New(GinkgoT(), managerConfig, func() controller.Options {
		return controller.Options{RequireSecretLabel: true, MaxTranscriptRawBytes: 8 << 20}
	})
	startManager()
})

func bind(name, role, user string) {
	testEnv.Bind(GinkgoT(), name, role, testenv.Users(user)...)
}

// clientAs provisions an authenticated user (a client certificate) and returns a client for it.
func clientAs(user envtest.User) client.Client {
	return testEnv.User(GinkgoT(), user.Name, user.Groups...).Client
}

// startManager runs the operator as the manager's ServiceAccount until stopManager is called.
func startManager() {
	toolnexus.Start(GinkgoT())
	managerDone = toolnexus.Done()
}

// stopManager stops the manager; managerDone is closed once it has.
func stopManager() {
	Expect(toolnexus.Stop()).To(Succeed())
}

// restartManager stops the manager and starts a new one, as a process restart would.
func restartManager() {
	stopManager()
	<-managerDone
	startManager()
}

func newNamespace() string {
	return testEnv.Namespace(GinkgoT(), "trust-")
}

// newToolServer is the fake HTTP tool of every spec: it answers "purchased" and records each call.
func newToolServer() *toolstest.Server {
	return toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return http.StatusOK, "purchased" })
}

const eventually = 30 * time.Second

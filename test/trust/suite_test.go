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
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/toolnexus/operator/internal/controller"
	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

var (
	env    *envtest.Environment
	cfg    *rest.Config
	scheme *runtime.Scheme
	ctx    = context.Background()
	// admin is system:masters: it stands in for a bug or a disk fault where a test damages what
	// only the manager can write.
	admin client.Client
	// erin holds what the built-in edit role gives in a namespace: config/rbac's editor and viewer
	// roles (aggregated to edit) and every verb on ConfigMaps and Secrets. She is no answerer.
	// alice is an answerer (config/rbac's answerer role) and the runs' approver.
	erin, alice client.Client
	// managerConfig authenticates as the manager's ServiceAccount.
	managerConfig *rest.Config
	stopManager   context.CancelFunc
	managerDone   chan struct{}
)

func TestTrustBoundary(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Trust boundary (envtest, real users)")
}

var _ = BeforeSuite(func() {
	ctrl.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	var err error
	env, err = testenv.New()
	Expect(err).NotTo(HaveOccurred())
	cfg, err = env.Start()
	Expect(err).NotTo(HaveOccurred())
	scheme, err = testenv.Scheme()
	Expect(err).NotTo(HaveOccurred())
	admin = clientAs(envtest.User{Name: "admin", Groups: []string{"system:masters"}})

	Expect(testenv.Install(ctx, admin, "rbac", "policies")).To(Succeed())
	// envtest runs no controller-manager, so ClusterRole aggregation does not happen: bind erin
	// to what "edit" would aggregate, and give her ConfigMaps and Secrets as "edit" does.
	Expect(admin.Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "test-edit-core"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps", "secrets"}, Verbs: []string{"*"}}},
	})).To(Succeed())
	for _, role := range []string{"toolnexus-agentrun-editor", "toolnexus-agentrun-viewer", "test-edit-core"} {
		bind("erin-"+role, role, "erin")
	}
	bind("alice-answerer", "toolnexus-answerer", "alice")
	erin = clientAs(envtest.User{Name: "erin"})
	alice = clientAs(envtest.User{Name: "alice"})
	manager, err := env.AddUser(testenv.ManagerUser, cfg)
	Expect(err).NotTo(HaveOccurred())
	managerConfig = manager.Config()
	startManager()
})

var _ = AfterSuite(func() {
	if stopManager != nil {
		stopManager()
		<-managerDone
	}
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

func bind(name, role, user string) {
	Expect(admin.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	})).To(Succeed())
}

// clientAs provisions an authenticated user (a client certificate) and returns a client for it.
func clientAs(user envtest.User) client.Client {
	authenticated, err := env.AddUser(user, cfg)
	Expect(err).NotTo(HaveOccurred())
	c, err := client.New(authenticated.Config(), client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// startManager runs the AgentRun controller as the manager's ServiceAccount, requiring the
// Secret access label and holding at most 8 MiB of transcript per run, until stopManager is called.
func startManager() {
	skip := true
	mgr, err := ctrl.NewManager(managerConfig, ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: &skip},
	})
	Expect(err).NotTo(HaveOccurred())
	Expect((&controller.AgentRunReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(),
		Recorder: mgr.GetEventRecorder("agentrun-controller"), Clock: clock.RealClock{},
		Metrics:               controller.NewMetrics(prometheus.NewRegistry(), mgr.GetClient()),
		RequireSecretLabel:    true,
		MaxTranscriptRawBytes: 8 << 20,
	}).SetupWithManager(mgr)).To(Succeed())
	runCtx, cancel := context.WithCancel(context.Background())
	stopManager, managerDone = cancel, make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(managerDone)
		Expect(mgr.Start(runCtx)).To(Succeed())
	}()
}

func restartManager() {
	stopManager()
	<-managerDone
	startManager()
}

func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "trust-"}}
	Expect(admin.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// newToolServer is the fake HTTP tool of every spec: it answers "purchased" and records each call.
func newToolServer() *toolstest.Server {
	return toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return http.StatusOK, "purchased" })
}

const eventually = 30 * time.Second

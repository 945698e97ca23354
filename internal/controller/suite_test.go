package controller_test

import (
	"bytes"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolnexus/operator/internal/controller"
	"github.com/toolnexus/operator/internal/controller/login"
	"github.com/toolnexus/operator/internal/notify"
	"github.com/toolnexus/operator/internal/telemetry"
	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/internal/testenv/operator"
)

var (
	testEnv   *testenv.Env
	env       *envtest.Environment
	cfg       *rest.Config
	k8sClient client.Client
	scheme    *runtime.Scheme
	// toolnexus is the operator the suite runs, as the control plane's administrator.
	toolnexus *operator.Manager
	// managerDone is closed once the running manager has stopped.
	managerDone <-chan struct{}
	// registry holds the metrics of the running manager.
	registry *prometheus.Registry
	// managerLog holds everything the managers of the suite logged.
	managerLog = &syncBuffer{}
	// spans holds every span the managers of the suite wrote, content included.
	spans = tracetest.NewInMemoryExporter()
)

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controllers (envtest)")
}

var _ = BeforeSuite(func() {
	// Every log line, at every verbosity, is also kept in managerLog so tests can search it.
	ctrl.SetLogger(zap.New(zap.WriteTo(io.MultiWriter(GinkgoWriter, managerLog)), zap.UseDevMode(true), zap.Level(zapcore.Level(-10))))
	testEnv = testenv.Start(GinkgoT(), testenv.Options{})
	env, cfg, k8sClient, scheme = testEnv.Environment, testEnv.Config, testEnv.Client, testEnv.Scheme
	// The manager "runs in" ManagerNamespace: a policy's sinks read their Secrets there, and the
	// login store keeps its Secrets there.
	Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testenv.ManagerNamespace}})).To(Succeed())
	callbackAddr = freeLoopbackAddr()
	toolnexus = operator.New(GinkgoT(), cfg, func() controller.Options {
		registry = prometheus.NewRegistry()
		return controller.Options{
			Registry:                registry,
			MaxConcurrentReconciles: 4,
			MaxTranscriptBytes:      4 << 20,
			// Each manager has a tracer provider of its own, as a restarted process would.
			Tracing:      telemetry.New(telemetry.NewProvider(sdktrace.WithSyncer(spans)), true),
			NotifyPolicy: notifyPolicy,
			// A policy's sinks read their Secrets there, as in a cluster.
			ManagerNamespace: testenv.ManagerNamespace,
			// Logins complete on a fixed loopback port, registered at each test's authorization server.
			OAuthRedirectURL: redirectURL(), OAuthCallbackAddr: callbackAddr,
		}
	})
	startManager()
})

// startManager starts the operator's manager; it runs until stopManager is called.
// callbackAddr is where the manager serves the OAuth login callback.
var callbackAddr string

func redirectURL() string { return "http://" + callbackAddr + login.CallbackPath }

// freeLoopbackAddr is a loopback address with a port nothing listens on now.
func freeLoopbackAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}

func startManager() {
	toolnexus.Start(GinkgoT())
	managerDone = toolnexus.Done()
}

// restartManager stops the running manager and starts a new one, as a process restart would.
func restartManager() {
	toolnexus.Restart(GinkgoT())
	managerDone = toolnexus.Done()
}

// stopManager stops the running manager; managerDone is closed once it has.
func stopManager() {
	Expect(toolnexus.Stop()).To(Succeed())
}

// newNamespace creates a namespace for one test.
func newNamespace() string {
	return testEnv.Namespace(GinkgoT(), "run-")
}

const eventually = 20 * time.Second

// notifyPolicy makes the notifier's retries quick: 4 attempts, 50ms apart and doubling. An attempt
// keeps the default bound (10s), so a hung sink holds its attempt well past a run's end.
var notifyPolicy = notify.Policy{MaxAttempts: 4, Base: 50 * time.Millisecond, Cap: time.Second, Timeout: 10 * time.Second}

// logLinesWith is every line the suite logged so far that contains s: what a test that searches
// the log for a secret prints when it finds one.
func logLinesWith(s string) []string {
	var out []string
	for _, line := range strings.Split(managerLog.String(), "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

package controller_test

import (
	"bytes"
	"context"
	"io"
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
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolnexus/operator/internal/controller"
	"github.com/toolnexus/operator/internal/notify"
	"github.com/toolnexus/operator/internal/telemetry"
	"github.com/toolnexus/operator/internal/testenv"
)

var (
	env       *envtest.Environment
	cfg       *rest.Config
	k8sClient client.Client
	scheme    *runtime.Scheme
	// stopManager stops the manager the suite runs; tests of durability restart it.
	stopManager context.CancelFunc
	managerDone chan struct{}
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
	var err error
	env, err = testenv.New()
	Expect(err).NotTo(HaveOccurred())
	cfg, err = env.Start()
	Expect(err).NotTo(HaveOccurred())
	scheme, err = testenv.Scheme()
	Expect(err).NotTo(HaveOccurred())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
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

// startManager runs a manager with the AgentRun controller until stopManager is called.
func startManager() {
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: ctrlConfigSkipNameValidation(),
	})
	Expect(err).NotTo(HaveOccurred())
	registry = prometheus.NewRegistry()
	runs := &controller.AgentRunReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(),
		Recorder: mgr.GetEventRecorder("agentrun-controller"), Clock: clock.RealClock{},
		Metrics:                 controller.NewMetrics(registry, mgr.GetClient()),
		MaxConcurrentReconciles: 4,
		MaxTranscriptBytes:      4 << 20,
		// Each manager has a tracer provider of its own, as a restarted process would.
		Tracing: telemetry.New(telemetry.NewProvider(sdktrace.WithSyncer(spans)), true),
	}
	Expect(runs.SetupWithManager(mgr)).To(Succeed())
	Expect((&controller.NotifyReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("notify-controller"),
		Clock: clock.RealClock{}, Metrics: runs.Metrics, Executor: runs.Executor, Policy: notifyPolicy,
	}).SetupWithManager(mgr)).To(Succeed())
	Expect((&controller.AgentReconciler{Client: mgr.GetClient(), Clock: clock.RealClock{}}).SetupWithManager(mgr)).To(Succeed())
	ctx, cancel := context.WithCancel(context.Background())
	stopManager, managerDone = cancel, make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(managerDone)
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
}

// restartManager stops the running manager and starts a new one, as a process restart would.
func restartManager() {
	stopManager()
	<-managerDone
	startManager()
}

// newNamespace creates a namespace for one test.
func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "run-"}}
	Expect(k8sClient.Create(context.Background(), ns)).To(Succeed())
	return ns.Name
}

const eventually = 20 * time.Second

// notifyPolicy makes the notifier's retries quick: 4 attempts, 50ms apart and doubling. An attempt
// keeps the default bound (10s), so a hung sink holds its attempt well past a run's end.
var notifyPolicy = notify.Policy{MaxAttempts: 4, Base: 50 * time.Millisecond, Cap: time.Second, Timeout: 10 * time.Second}

// ctrlConfigSkipNameValidation lets the suite start a second manager with the same controller
// name after a restart.
func ctrlConfigSkipNameValidation() config.Controller {
	return config.Controller{SkipNameValidation: ptr.To(true)}
}

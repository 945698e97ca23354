package controller

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/toolnexus/operator/internal/notify"
	"github.com/toolnexus/operator/internal/telemetry"
)

// Options configure the operator's controllers: what the manager's flags set, and what a test
// replaces (the clock, the HTTP client, the metrics registry). Zero values take the defaults.
type Options struct {
	// Clock is the controllers' clock; nil is the real one.
	Clock clock.PassiveClock
	// HTTPClient carries model, tool, MCP and notification traffic; nil is the network guard's
	// default client.
	HTTPClient *http.Client
	// Registry receives the operator's metrics; nil is controller-runtime's registry, which the
	// manager's metrics endpoint serves.
	Registry prometheus.Registerer
	// Tracing writes each run's trace; nil writes none.
	Tracing *telemetry.Tracing
	// MaxConcurrentReconciles is the number of runs reconciled at once.
	MaxConcurrentReconciles int
	// MaxTranscriptBytes and MaxTranscriptRawBytes bound a run's transcript, compressed and decoded.
	MaxTranscriptBytes, MaxTranscriptRawBytes int
	// MaxToolCallsPerTurn bounds the tool calls of one model turn that run.
	MaxToolCallsPerTurn int
	// RequireSecretLabel lets runs and sinks read only Secrets labelled
	// toolnexus.dev/agentrun-access=true.
	RequireSecretLabel bool
	// MaxInflight and MaxInflightPerNamespace bound the steps in flight, in total and per namespace.
	MaxInflight, MaxInflightPerNamespace int
	// MaxInflightBytes bounds the memory the steps in flight hold.
	MaxInflightBytes int64
	// NotifyPolicy bounds the attempts of a notification's delivery.
	NotifyPolicy notify.Policy
}

// Setup registers every controller of the operator with mgr: the AgentRun controller with its
// executor, the notifier (which shares that executor, its network guard and its bounds) and the
// Agent controller.
func Setup(mgr ctrl.Manager, o Options) error {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Registry == nil {
		o.Registry = metrics.Registry
	}
	runs := &AgentRunReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(),
		Recorder: mgr.GetEventRecorder("agentrun-controller"), Clock: o.Clock,
		Metrics:                 NewMetrics(o.Registry, mgr.GetClient()),
		MaxConcurrentReconciles: o.MaxConcurrentReconciles,
		MaxTranscriptBytes:      o.MaxTranscriptBytes,
		MaxTranscriptRawBytes:   o.MaxTranscriptRawBytes,
		MaxToolCallsPerTurn:     o.MaxToolCallsPerTurn,
		RequireSecretLabel:      o.RequireSecretLabel,
		MaxInflight:             o.MaxInflight,
		MaxInflightPerNamespace: o.MaxInflightPerNamespace,
		MaxInflightBytes:        o.MaxInflightBytes,
		HTTPClient:              o.HTTPClient,
		Tracing:                 o.Tracing,
	}
	if err := runs.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&NotifyReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("notify-controller"),
		Clock: o.Clock, HTTPClient: o.HTTPClient, Metrics: runs.Metrics, Executor: runs.Executor,
		RequireSecretLabel: o.RequireSecretLabel, Policy: o.NotifyPolicy,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	return (&AgentReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr)
}

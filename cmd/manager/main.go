// Command manager runs the Toolnexus Operator: the AgentRun controller and the notifier of its
// PendingRequests.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller"
	"github.com/toolnexus/operator/internal/executor"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/netguard"
	"github.com/toolnexus/operator/internal/runstore"
	"github.com/toolnexus/operator/internal/telemetry"
)

func main() {
	var (
		metricsAddr, probeAddr, pprofAddr string
		watchNamespaces, leaderElectionNS string
		secureMetrics, leaderElect        bool
		maxConcurrent, maxTranscriptMiB   int
		maxTranscriptRawMiB, maxToolCalls int
		maxInflight, maxInflightPerNS     int
		requireSecretLabel, traceContent  bool
		denyCIDRs, allowCIDRs             string
		maxResponseMiB                    int64
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", "Address of the metrics endpoint (:8443 for HTTPS, :8080 for HTTP); 0 disables it.")
	flag.BoolVar(&secureMetrics, "metrics-secure", true, "Serve metrics over HTTPS, authenticated and authorized by the API server.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of the liveness and readiness probes.")
	flag.BoolVar(&leaderElect, "leader-elect", false, "Elect a leader, so that only one manager replica takes steps.")
	flag.StringVar(&leaderElectionNS, "leader-election-namespace", "", "Namespace of the leader-election lease; defaults to the manager's own namespace in a cluster.")
	flag.StringVar(&pprofAddr, "pprof-bind-address", "", "Address of a pprof endpoint for profiling; empty disables it.")
	flag.IntVar(&maxConcurrent, "max-concurrent-reconciles", 8, "How many runs are reconciled at once (decisions and API writes; model and tool I/O runs apart, see --max-inflight).")
	flag.IntVar(&maxInflight, "max-inflight", executor.DefaultMaxInflight, "How many steps (a model request, a turn's tool calls) may be in flight at once, in total.")
	flag.IntVar(&maxInflightPerNS, "max-inflight-per-namespace", executor.DefaultPerShare, "How many steps of one namespace may be in flight at once; waiting steps are served round robin across namespaces.")
	flag.IntVar(&maxTranscriptMiB, "max-transcript-size", runstore.DefaultMaxBytes>>20, "How many MiB (compressed) of transcript a run may store; a run that needs more fails with TranscriptTooLarge.")
	flag.StringVar(&watchNamespaces, "watch-namespaces", "", "Comma-separated namespaces to watch; empty watches all.")
	flag.IntVar(&maxTranscriptRawMiB, "max-transcript-decoded-size", runstore.DefaultMaxRawBytes>>20, "How many MiB of transcript, decoded, a run may hold; a run that needs more fails with TranscriptTooLarge.")
	flag.IntVar(&maxToolCalls, "max-tool-calls-per-turn", loop.DefaultMaxToolCallsPerTurn, "How many tool calls of one model turn run; the model is told about the others.")
	flag.BoolVar(&requireSecretLabel, "require-secret-label", false, "Let runs read only Secrets labelled "+toolnexusv1alpha1.SecretAccessLabel+"=true; others make the run wait with reason SecretNotAllowed.")
	flag.StringVar(&denyCIDRs, "deny-cidrs", "", "Comma-separated CIDRs that model, HTTP tool, MCP and notification connections may not reach, in addition to link-local (169.254.0.0/16, fe80::/10).")
	flag.StringVar(&allowCIDRs, "allow-cidrs", "", "Comma-separated CIDRs that model, HTTP tool, MCP and notification connections may reach even when denied, link-local included.")
	flag.Int64Var(&maxResponseMiB, "max-response-size", netguard.DefaultMaxResponseBytes>>20, "How many MiB of one model, HTTP tool, MCP or notification response body the manager reads before it fails the request.")
	flag.BoolVar(&traceContent, "trace-content", false, "Record prompts, tool arguments and tool outputs (Secret values redacted) in trace spans; traces are on when the OTEL_* environment configures an OTLP exporter.")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")
	httpClient, err := guardedHTTPClient(denyCIDRs, allowCIDRs, maxResponseMiB, maxInflight)
	if err != nil {
		log.Error(err, "Invalid network guard flags")
		os.Exit(1)
	}

	tp, err := telemetry.ProviderFromEnv(context.Background())
	if err != nil {
		log.Error(err, "Invalid OpenTelemetry environment")
		os.Exit(1)
	}
	var tracing *telemetry.Tracing
	if tp != nil {
		tracing = telemetry.New(tp, traceContent)
		log.Info("Exporting traces over OTLP/HTTP", "recordContent", traceContent)
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(toolnexusv1alpha1.AddToScheme(scheme))

	metricsOpts := metricsserver.Options{
		BindAddress: metricsAddr, SecureServing: secureMetrics,
		// HTTP/2 stays off: it is exposed to the HTTP/2 rapid-reset and stream-cancellation CVEs.
		TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	}
	if secureMetrics {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	// Managed fields are never read here; stripping them keeps thousands of parked runs small.
	cacheOpts := cache.Options{DefaultTransform: cache.TransformStripManagedFields()}
	if watchNamespaces != "" {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range strings.Split(watchNamespaces, ",") {
			cacheOpts.DefaultNamespaces[strings.TrimSpace(ns)] = cache.Config{}
		}
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme: scheme, Metrics: metricsOpts, HealthProbeBindAddress: probeAddr, Cache: cacheOpts,
		LeaderElection: leaderElect, LeaderElectionID: "toolnexus-operator.toolnexus.dev",
		LeaderElectionNamespace: leaderElectionNS, LeaderElectionReleaseOnCancel: true,
		PprofBindAddress: pprofAddr,
	})
	if err != nil {
		log.Error(err, "Unable to create the manager")
		os.Exit(1)
	}
	if err := controller.Setup(mgr, controller.Options{
		HTTPClient: httpClient, Tracing: tracing,
		MaxConcurrentReconciles: maxConcurrent,
		MaxTranscriptBytes:      maxTranscriptMiB << 20,
		MaxTranscriptRawBytes:   maxTranscriptRawMiB << 20,
		MaxToolCallsPerTurn:     maxToolCalls,
		RequireSecretLabel:      requireSecretLabel,
		MaxInflight:             maxInflight,
		MaxInflightPerNamespace: maxInflightPerNS,
	}); err != nil {
		log.Error(err, "Unable to set up the controllers")
		os.Exit(1)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "Unable to set up the health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "Unable to set up the ready check")
		os.Exit(1)
	}
	log.Info("Starting the manager")
	err = mgr.Start(ctrl.SetupSignalHandler())
	if tp != nil {
		// The spans of the last steps are still batched: send them before the process goes.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := tp.Shutdown(ctx); err != nil {
			log.Error(err, "Flushing the last traces")
		}
		cancel()
	}
	if err != nil {
		log.Error(err, "The manager stopped with an error")
		os.Exit(1)
	}
}

// guardedHTTPClient is the client for model, HTTP tool, MCP and notification traffic, built from
// the network guard flags; it keeps a connection for every step that may be in flight.
func guardedHTTPClient(deny, allow string, maxResponseMiB int64, maxInflight int) (*http.Client, error) {
	if maxResponseMiB < 1 {
		return nil, fmt.Errorf("--max-response-size must be at least 1 (MiB), got %d", maxResponseMiB)
	}
	cfg := netguard.Config{MaxResponseBytes: maxResponseMiB << 20, MaxIdleConns: maxInflight}
	var err error
	if cfg.Deny, err = netguard.ParseCIDRs(deny); err != nil {
		return nil, fmt.Errorf("--deny-cidrs: %w", err)
	}
	if cfg.Allow, err = netguard.ParseCIDRs(allow); err != nil {
		return nil, fmt.Errorf("--allow-cidrs: %w", err)
	}
	return cfg.Client(), nil
}

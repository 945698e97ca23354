// Command manager runs the Toolnexus Operator: the AgentRun controller and the notifier of its
// PendingRequests.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller"
	"github.com/toolnexus/operator/internal/controller/login"
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
		maxResponseMiB, maxInflightMiB    int64
		auditSinkURL                      string
		oauthRedirectURL                  string
		oauthCallbackAddr                 string
		shard                             string
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
	flag.Int64Var(&maxInflightMiB, "max-inflight-memory", 0, "How many MiB the steps in flight may hold in total (their copies of the runs' state, the requests they send, the responses they read); steps wait for memory as they wait for a slot. 0 derives it: "+
		fmt.Sprintf("%.0f%% of GOMEMLIMIT or of the container's memory limit, whichever is smaller, else %d.", inflightShare*100, executor.DefaultMemoryBytes>>20))
	flag.IntVar(&maxTranscriptMiB, "max-transcript-size", runstore.DefaultMaxBytes>>20, "How many MiB (compressed) of transcript a run may store; a run that needs more fails with TranscriptTooLarge.")
	flag.StringVar(&watchNamespaces, "watch-namespaces", "", "Comma-separated namespaces to watch; empty watches all.")
	flag.IntVar(&maxTranscriptRawMiB, "max-transcript-decoded-size", runstore.DefaultMaxRawBytes>>20, "How many MiB of transcript, decoded, a run may hold; a run that needs more fails with TranscriptTooLarge.")
	flag.IntVar(&maxToolCalls, "max-tool-calls-per-turn", loop.DefaultMaxToolCallsPerTurn, "How many tool calls of one model turn run; the model is told about the others.")
	flag.BoolVar(&requireSecretLabel, "require-secret-label", false, "Let runs read only Secrets labelled "+toolnexusv1alpha1.SecretAccessLabel+"=true; others make the run wait with reason SecretNotAllowed.")
	flag.StringVar(&denyCIDRs, "deny-cidrs", "", "Comma-separated CIDRs that model, HTTP tool, MCP and notification connections may not reach, in addition to link-local (169.254.0.0/16, fe80::/10).")
	flag.StringVar(&allowCIDRs, "allow-cidrs", "", "Comma-separated CIDRs that model, HTTP tool, MCP and notification connections may reach even when denied, link-local included.")
	flag.Int64Var(&maxResponseMiB, "max-response-size", netguard.DefaultMaxResponseBytes>>20, "How many MiB of one model, HTTP tool, MCP or notification response body the manager reads before it fails the request.")
	flag.BoolVar(&traceContent, "trace-content", false, "Record prompts, tool arguments and tool outputs (Secret values redacted) in trace spans; traces are on when the OTEL_* environment configures an OTLP exporter.")
	flag.StringVar(&auditSinkURL, "audit-sink-url", "", "http(s) URL that receives the audit trail of every PendingRequest as CloudEvents (docs/audit.md), at least once; each request keeps the finalizer "+toolnexusv1alpha1.AuditFinalizer+" until its events are delivered. Empty sends none.")
	opts := zap.Options{}
	flag.StringVar(&oauthRedirectURL, "oauth-redirect-url", "", "Public URL of the OAuth login callback (ending in "+login.CallbackPath+
		"), registered as a redirect URI of the clients tools name in auth.oauth; empty: tools can use logins kept already and cannot begin one.")
	flag.StringVar(&oauthCallbackAddr, "oauth-callback-bind-address", "", "Address the OAuth login callback is served on (e.g. :8082); empty serves none.")
	flag.StringVar(&shard, "shard", "", "Run only the AgentRuns labelled "+toolnexusv1alpha1.ShardLabel+"=NAME (stamped from their Namespace's label) and their requests and records, "+
		"with a leader-election lease of the shard's own; empty runs those without the label.")
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")
	cgroupLimits := []string{readLimit(cgroupV2Limit), readLimit(cgroupV1Limit)}
	if limit, ok := goMemoryLimit(debug.SetMemoryLimit(-1), cgroupLimits...); ok {
		debug.SetMemoryLimit(limit)
		log.Info("Go memory limit set from the container's memory limit", "MiB", limit>>20, "share", goMemoryShare)
	}
	inflightBytes, from, err := inflightMemory(maxInflightMiB, debug.SetMemoryLimit(-1), cgroupLimits...)
	if err != nil {
		log.Error(err, "Invalid memory flags")
		os.Exit(1)
	}
	log.Info("Memory budget of the steps in flight", "MiB", inflightBytes>>20, "from", from)
	if err := checkRedirectURL(oauthRedirectURL); err != nil {
		log.Error(err, "Invalid OAuth flags")
		os.Exit(1)
	}
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
	var namespaces []string
	if watchNamespaces != "" {
		namespaces = strings.Split(watchNamespaces, ",")
	}
	cacheOpts, err := controller.CacheOptions(shard, namespaces)
	if err != nil {
		log.Error(err, "Invalid shard")
		os.Exit(1)
	}
	if shard != "" {
		log.Info("Running one shard", "shard", shard, "lease", controller.LeaderElectionID(shard))
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme: scheme, Metrics: metricsOpts, HealthProbeBindAddress: probeAddr, Cache: cacheOpts,
		LeaderElection: leaderElect, LeaderElectionID: controller.LeaderElectionID(shard),
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
		MaxInflightBytes:        inflightBytes,
		AuditSinkURL:            auditSinkURL,
		OAuthRedirectURL:        oauthRedirectURL,
		OAuthCallbackAddr:       oauthCallbackAddr,
		Shard:                   shard,
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

// checkRedirectURL checks --oauth-redirect-url: an absolute http(s) URL ending in the callback's
// path, without query or fragment (RFC 6749 §3.1.2).
func checkRedirectURL(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" ||
		!strings.HasSuffix(u.Path, login.CallbackPath) {
		return fmt.Errorf("--oauth-redirect-url %q: want an absolute http(s) URL whose path ends in %s, without query or fragment", s, login.CallbackPath)
	}
	return nil
}

// guardedHTTPClient is the client for model, HTTP tool, MCP and notification traffic, built from
// the network guard flags. It keeps an idle connection for each step that may be in flight, up to
// netguard's default: a step waiting on the network holds its connection anyway, and idle ones
// beyond that would hold memory outside the executor's budget for the sake of a dial.
func guardedHTTPClient(deny, allow string, maxResponseMiB int64, maxInflight int) (*http.Client, error) {
	if maxResponseMiB < 1 {
		return nil, fmt.Errorf("--max-response-size must be at least 1 (MiB), got %d", maxResponseMiB)
	}
	cfg := netguard.Config{MaxResponseBytes: maxResponseMiB << 20, MaxIdleConns: min(maxInflight, netguard.DefaultMaxIdleConns)}
	var err error
	if cfg.Deny, err = netguard.ParseCIDRs(deny); err != nil {
		return nil, fmt.Errorf("--deny-cidrs: %w", err)
	}
	if cfg.Allow, err = netguard.ParseCIDRs(allow); err != nil {
		return nil, fmt.Errorf("--allow-cidrs: %w", err)
	}
	return cfg.Client(), nil
}

// The container's memory limit, cgroup v2 and v1.
const (
	cgroupV2Limit = "/sys/fs/cgroup/memory.max"
	cgroupV1Limit = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
)

// goMemoryShare is the part of the container's memory limit the Go runtime is told to stay under
// when GOMEMLIMIT is not set. The rest is what the runtime does not count and what it lets the heap
// reach before it collects: at 97.7 % (GOMEMLIMIT a few MiB under the limit) the hostile bench's
// big replies took the manager to 559 MiB under a 512 MiB limit; at 75 %, 442 MiB.
const goMemoryShare = 0.75

// goMemoryLimit is the Go memory limit to set: goMemoryShare of the smallest cgroup limit (their
// files' contents) when goMemLimit says GOMEMLIMIT is unset (math.MaxInt64) and a limit is known.
func goMemoryLimit(goMemLimit int64, cgroupLimits ...string) (int64, bool) {
	if goMemLimit != math.MaxInt64 {
		return 0, false // set by the operator of the Deployment: it stands
	}
	limit := int64(0)
	for _, raw := range cgroupLimits {
		if n, ok := cgroupLimit(raw); ok && (limit == 0 || n < limit) {
			limit = n
		}
	}
	if limit == 0 {
		return 0, false
	}
	return int64(float64(limit) * goMemoryShare), true
}

// cgroupLimit reads a cgroup memory limit file's content: false for none ("max" in v2, a count
// near MaxInt64 in v1, a missing or unreadable file).
func cgroupLimit(raw string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64)
	if err != nil || n <= 0 || n >= 1<<62 {
		return 0, false
	}
	return n, true
}

// inflightShare is the part of the process's memory limit the steps in flight may hold: the rest
// is the informers' caches, the reconciles' records and what the Go runtime does not count.
const inflightShare = 0.4

// readLimit is the content of a cgroup limit file, or "" when there is none.
func readLimit(path string) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(raw)
}

// inflightMemory is the executor's memory budget and where it came from: flagMiB when set, else
// inflightShare of the smaller of goMemLimit (math.MaxInt64 when GOMEMLIMIT is unset) and the
// cgroup limits given as their files' contents ("max", a byte count, or "" when absent), else
// executor.DefaultMemoryBytes.
func inflightMemory(flagMiB, goMemLimit int64, cgroupLimits ...string) (int64, string, error) {
	switch {
	case flagMiB < 0:
		return 0, "", fmt.Errorf("--max-inflight-memory must be 0 (derived) or a number of MiB, got %d", flagMiB)
	case flagMiB > math.MaxInt64>>20:
		return 0, "", fmt.Errorf("--max-inflight-memory %d MiB is more than a process can address", flagMiB)
	case flagMiB > 0:
		return flagMiB << 20, "--max-inflight-memory", nil
	}
	limit, from := int64(math.MaxInt64), ""
	if goMemLimit > 0 && goMemLimit < math.MaxInt64 {
		limit, from = goMemLimit, "GOMEMLIMIT"
	}
	for _, raw := range cgroupLimits {
		if n, ok := cgroupLimit(raw); ok && n < limit {
			limit, from = n, "the cgroup memory limit"
		}
	}
	if from == "" {
		return executor.DefaultMemoryBytes, "the default", nil
	}
	return int64(float64(limit) * inflightShare), fmt.Sprintf("%.0f%% of %s (%d MiB)", inflightShare*100, from, limit>>20), nil
}

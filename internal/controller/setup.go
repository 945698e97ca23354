// Package controller wires the operator's controllers, one room each: agentrun (runs the
// AgentRuns step by step), notifier (tells people about PendingRequests), approval (answers a
// request whose approvers' entries decided it), auditor (delivers the audit trail), policy (says
// whether an ApprovalPolicy can be applied, and keeps them compiled for the call path), login
// (completes the logins of tools with auth.oauth and keeps their tokens) and agent (says whether
// an Agent can run). They share the executor that does model, tool and notification I/O, the
// network guard, the metrics and the bounds. Its envtest suite drives them together.
package controller

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller/agent"
	"github.com/toolnexus/operator/internal/controller/agentrun"
	"github.com/toolnexus/operator/internal/controller/approval"
	"github.com/toolnexus/operator/internal/controller/auditor"
	"github.com/toolnexus/operator/internal/controller/login"
	"github.com/toolnexus/operator/internal/controller/metrics"
	"github.com/toolnexus/operator/internal/controller/notifier"
	"github.com/toolnexus/operator/internal/controller/policy"
	"github.com/toolnexus/operator/internal/executor"
	"github.com/toolnexus/operator/internal/kube"
	"github.com/toolnexus/operator/internal/netguard"
	"github.com/toolnexus/operator/internal/notify"
	"github.com/toolnexus/operator/internal/oauth"
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
	// NotifyPolicy bounds the attempts of a notification's delivery, and spaces an audit event's.
	NotifyPolicy notify.Policy
	// ManagerNamespace is the namespace the manager runs in, where a policy's escalation sinks
	// read their Secrets; empty is notifier.OwnNamespace (POD_NAMESPACE, else the pod's).
	ManagerNamespace string
	// AuditSinkURL is where the audit trail of every PendingRequest goes (--audit-sink-url);
	// empty delivers none.
	AuditSinkURL string
	// OAuthRedirectURL is the public URL of the login callback (--oauth-redirect-url), and
	// OAuthCallbackAddr where the manager serves it (--oauth-callback-bind-address); without a
	// redirect URL a tool with auth.oauth can use a login kept already, and cannot begin one.
	OAuthRedirectURL, OAuthCallbackAddr string
	// Shard is the shard the manager runs (--shard; "" for the objects of no shard). It shapes the
	// manager's cache and lease, which are made before Setup: build them with CacheOptions and
	// LeaderElectionID.
	Shard string
}

// Setup registers every controller of the operator with mgr, and the executor they share (run by
// the manager while it leads).
func Setup(mgr ctrl.Manager, o Options) error {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Registry == nil {
		o.Registry = crmetrics.Registry
	}
	if o.ManagerNamespace == "" {
		o.ManagerNamespace = notifier.OwnNamespace()
	}
	if o.HTTPClient == nil {
		// Per-request timeouts come from contexts, so the client itself sets none.
		o.HTTPClient = netguard.Config{}.Client()
	}
	m := metrics.New(o.Registry, mgr.GetClient())
	exec := executor.New(executor.Limits{MaxInflight: o.MaxInflight, PerShare: o.MaxInflightPerNamespace, MemoryBytes: o.MaxInflightBytes},
		m.ExecutorObserver())
	if err := mgr.Add(exec); err != nil {
		return err
	}
	// policies is what the runs' tool calls are checked against (SPEC.md section 11).
	policies := policy.NewRegistry()
	if err := policies.SetupWithManager(mgr); err != nil {
		return err
	}
	// Logins the operator completes itself (SPEC.md section 12), kept in the manager's namespace;
	// a manager that does not know its namespace keeps none.
	var logins *oauth.Host
	if o.ManagerNamespace != "" {
		store := &login.SecretStore{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: o.ManagerNamespace}
		logins = &oauth.Host{Store: store, HTTPClient: o.HTTPClient, RedirectURL: o.OAuthRedirectURL,
			ClientSecret: func(ctx context.Context, ref oauth.SecretRef) (string, error) {
				return kube.ReadSecretKey(ctx, mgr.GetAPIReader(), o.RequireSecretLabel, ref.Namespace,
					toolnexusv1alpha1.SecretKeyReference{Name: ref.Name, Key: ref.Key}, "auth.oauth.clientSecretRef")
			}}
		if err := mgr.Add(&login.Sweep{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Namespace: o.ManagerNamespace,
			Interval: 10 * time.Minute, Log: mgr.GetLogger().WithName("oauth-sweep")}); err != nil {
			return err
		}
	}
	if o.OAuthCallbackAddr != "" && logins != nil {
		callback := &login.Callback{Host: logins, Client: mgr.GetClient(), Reader: mgr.GetAPIReader(),
			Log: mgr.GetLogger().WithName("oauth-callback")}
		if err := mgr.Add(&login.Server{Addr: o.OAuthCallbackAddr, Callback: callback}); err != nil {
			return err
		}
	}
	if err := (&agentrun.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(),
		Recorder: mgr.GetEventRecorder("agentrun-controller"), Clock: o.Clock, Metrics: m, Executor: exec,
		HTTPClient:              o.HTTPClient,
		Tracing:                 o.Tracing,
		MaxConcurrentReconciles: o.MaxConcurrentReconciles,
		MaxTranscriptBytes:      o.MaxTranscriptBytes,
		MaxTranscriptRawBytes:   o.MaxTranscriptRawBytes,
		MaxToolCallsPerTurn:     o.MaxToolCallsPerTurn,
		RequireSecretLabel:      o.RequireSecretLabel,
		Audit:                   o.AuditSinkURL != "",
		Policies:                policies,
		Logins:                  logins,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	// Notifications go through the runs' executor and network guard, within the same bounds.
	if err := (&notifier.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("notify-controller"),
		Clock: o.Clock, HTTPClient: o.HTTPClient, Metrics: m, Executor: exec,
		RequireSecretLabel: o.RequireSecretLabel, Policy: o.NotifyPolicy, SecretNamespace: o.ManagerNamespace,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	// The audit trail has workers of its own: a refusing sink never holds a run.
	if err := (&auditor.Reconciler{Client: mgr.GetClient(), Clock: o.Clock, Metrics: m, SinkURL: o.AuditSinkURL,
		HTTPClient: o.HTTPClient, Policy: o.NotifyPolicy}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&policy.Reconciler{Client: mgr.GetClient(), Clock: o.Clock}).SetupWithManager(mgr); err != nil {
		return err
	}
	// A request that needs several approvals is answered once its entries decide it.
	if err := (&approval.Reconciler{
		Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("quorum-controller"), Clock: o.Clock,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	return (&agent.Reconciler{Client: mgr.GetClient(), Clock: o.Clock}).SetupWithManager(mgr)
}

package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/netguard"
	"github.com/toolnexus/operator/internal/telemetry"
	"github.com/toolnexus/operator/internal/tools"
)

const defaultModelTimeout = 120 * time.Second

// missingSecretError says which Secret reference cannot be resolved: the Secret or its key is
// missing (reason SecretNotFound), or the Secret lacks the label the manager requires (reason
// SecretNotAllowed). The run waits for it.
type missingSecretError struct {
	ref    toolnexusv1alpha1.SecretKeyReference
	what   string
	reason string
}

func (e *missingSecretError) Error() string {
	if e.reason == toolnexusv1alpha1.ReasonSecretNotAllowed {
		return fmt.Sprintf("%s: Secret %q is not labelled %s=true, which this manager requires of Secrets that runs read",
			e.what, e.ref.Name, toolnexusv1alpha1.SecretAccessLabel)
	}
	return fmt.Sprintf("%s: Secret %q has no key %q (or does not exist) in the run's namespace", e.what, e.ref.Name, e.ref.Key)
}

// specError is a spec that passed admission but cannot run; the run fails with InvalidSpec.
type specError struct{ err error }

func (e *specError) Error() string { return e.err.Error() }
func (e *specError) Unwrap() error { return e.err }

// readSecret reads one key of a Secret in namespace, uncached: the manager does not keep Secret
// values in memory, and a rotated Secret is picked up by the next read.
func (r *AgentRunReconciler) readSecret(ctx context.Context, namespace string, ref toolnexusv1alpha1.SecretKeyReference, what string) (string, error) {
	return readSecretKey(ctx, r.APIReader, r.RequireSecretLabel, namespace, ref, what)
}

// readSecretKey reads one key of a Secret through reader; with requireLabel only Secrets labelled
// toolnexus.dev/agentrun-access=true may be read.
func readSecretKey(ctx context.Context, reader client.Reader, requireLabel bool, namespace string, ref toolnexusv1alpha1.SecretKeyReference, what string) (string, error) {
	s := &corev1.Secret{}
	// client-go logs response bodies at high verbosity with the logger of the context: the read
	// of a Secret gets none, so no verbosity level ever prints a value.
	err := reader.Get(ctrl.LoggerInto(ctx, logr.Discard()), client.ObjectKey{Namespace: namespace, Name: ref.Name}, s)
	if apierrors.IsNotFound(err) {
		return "", &missingSecretError{ref: ref, what: what, reason: toolnexusv1alpha1.ReasonSecretNotFound}
	}
	if err != nil {
		return "", fmt.Errorf("%s: reading Secret %q: %w", what, ref.Name, err)
	}
	if requireLabel && s.Labels[toolnexusv1alpha1.SecretAccessLabel] != "true" {
		return "", &missingSecretError{ref: ref, what: what, reason: toolnexusv1alpha1.ReasonSecretNotAllowed}
	}
	v, ok := s.Data[ref.Key]
	if !ok {
		return "", &missingSecretError{ref: ref, what: what, reason: toolnexusv1alpha1.ReasonSecretNotFound}
	}
	return string(v), nil
}

// stepper is what a step needs: a model client and the run's tools. Building it reads Secrets
// (the reconcile does that); connecting the MCP servers is network I/O, done by the step itself.
type stepper struct {
	client *loop.Client
	// local are the tools that need no connection: HTTP tools and built-ins.
	local []tools.Tool
	mcp   []tools.MCPServerSpec
	// trace is the run's trace, which the step's spans join.
	trace telemetry.Run
}

// toolkit connects the run's MCP servers and returns every tool; mcpFailures names each server
// that could not be reached, with why (its tools are left out).
func (rt *stepper) toolkit(ctx context.Context) (tk *tools.Toolkit, mcpFailures []string, err error) {
	all := append([]tools.Tool(nil), rt.local...)
	failed := map[string]error{}
	for _, spec := range rt.mcp {
		server, err := tools.ConnectMCP(ctx, spec)
		if err != nil {
			mcpFailures = append(mcpFailures, fmt.Sprintf("%s: %v", spec.Name, err))
			failed[spec.Name] = err
			continue
		}
		all = append(all, server.Tools()...)
		if missing := server.MissingTools(); len(missing) > 0 {
			// An allow-list entry the server does not offer is most likely a typo: say so.
			mcpFailures = append(mcpFailures, fmt.Sprintf("%s: does not offer the allow-listed tools %s", spec.Name, strings.Join(missing, ", ")))
		}
	}
	if tk, err = tools.NewToolkit(all...); err != nil {
		return nil, mcpFailures, &specError{err}
	}
	for server, err := range failed {
		tk.Unreachable(server, err)
	}
	return tk, mcpFailures, nil
}

// prepare resolves the run's spec into a loop client and its tools, without network I/O but the
// API server's. Secret values for headers are resolved at call time; the API key is read now
// because every model request needs it.
func (r *AgentRunReconciler) prepare(ctx context.Context, run *toolnexusv1alpha1.AgentRun, spec *toolnexusv1alpha1.AgentRunSpec, observe func(loop.Event)) (*stepper, error) {
	apiKey := ""
	if ref := spec.Model.APIKeySecretRef; ref != nil {
		var err error
		if apiKey, err = r.readSecret(ctx, run.Namespace, *ref, "spec.model.apiKeySecretRef"); err != nil {
			return nil, err
		}
	}
	// Header Secrets are checked up front too, so a missing one parks the run before it starts
	// rather than failing a tool call later.
	for i, t := range spec.Tools {
		if t.HTTP == nil {
			continue
		}
		if err := r.checkHeaders(ctx, run.Namespace, t.HTTP.Headers, fmt.Sprintf("spec.tools[%d].http.headers", i)); err != nil {
			return nil, err
		}
	}
	for i, s := range spec.MCPServers {
		if err := r.checkHeaders(ctx, run.Namespace, s.Headers, fmt.Sprintf("spec.mcpServers[%d].headers", i)); err != nil {
			return nil, err
		}
	}

	rt := &stepper{trace: r.runTrace(ctx, run)}
	for i, t := range spec.Tools {
		tool, err := tools.HTTPTool(tools.HTTPToolSpec{
			Name: t.Name, Description: t.Description, InputSchema: jsonObject(t.Parameters),
			URL: t.HTTP.URL, Method: string(t.HTTP.Method), Timeout: durationOr(t.HTTP.Timeout, 0),
			Headers: r.headers(run.Namespace, t.HTTP.Headers, fmt.Sprintf("spec.tools[%d].http.headers", i)),
			Client:  r.HTTPClient,
		})
		if err != nil {
			return nil, &specError{fmt.Errorf("spec.tools[%d]: %w", i, err)}
		}
		rt.local = append(rt.local, tool)
	}
	for i, s := range spec.MCPServers {
		rt.mcp = append(rt.mcp, tools.MCPServerSpec{
			Name: s.Name, URL: s.URL, AllowTools: s.Tools, Timeout: durationOr(s.Timeout, 0),
			Headers:    r.headers(run.Namespace, s.Headers, fmt.Sprintf("spec.mcpServers[%d].headers", i)),
			HTTPClient: r.HTTPClient,
		})
	}
	for _, b := range spec.Builtins {
		if b == toolnexusv1alpha1.BuiltinQuestion {
			rt.local = append(rt.local, tools.QuestionTool())
		}
	}
	if _, err := tools.NewToolkit(rt.local...); err != nil {
		return nil, &specError{err}
	}

	hooks, err := gateHooks(spec.Approvals)
	if err != nil {
		return nil, &specError{err}
	}
	rt.client, err = loop.New(loop.Options{
		BaseURL: spec.Model.BaseURL, Style: string(spec.Model.Style), Model: spec.Model.Name, APIKey: apiKey,
		SystemPrompt: spec.SystemPrompt, MaxTurns: int(spec.MaxTurns), Hooks: hooks,
		RequestTimeout: durationOr(spec.Model.RequestTimeout, defaultModelTimeout), HTTPClient: r.HTTPClient,
		IdempotencyPrefix: string(run.UID), OnEvent: observe, Clock: r.Clock.Now,
		SuspensionTimeout: suspensionTimeout(spec.Suspension), MaxToolCallsPerTurn: r.MaxToolCallsPerTurn,
		Tracer: r.Tracing.Loop(rt.trace),
	})
	if err != nil {
		return nil, &specError{err}
	}
	return rt, nil
}

func (r *AgentRunReconciler) checkHeaders(ctx context.Context, namespace string, hs []toolnexusv1alpha1.HTTPHeader, what string) error {
	for _, h := range hs {
		if h.ValueFrom == nil {
			continue
		}
		if _, err := r.readSecret(ctx, namespace, h.ValueFrom.SecretKeyRef, what+" "+h.Name); err != nil {
			return err
		}
	}
	return nil
}

// headers turns header specs into tool headers whose Secret values are read on every request.
func (r *AgentRunReconciler) headers(namespace string, hs []toolnexusv1alpha1.HTTPHeader, what string) []tools.Header {
	out := make([]tools.Header, 0, len(hs))
	for _, h := range hs {
		th := tools.Header{Name: h.Name}
		switch {
		case h.Value != nil:
			th.Value = *h.Value
		case h.ValueFrom != nil:
			ref, label := h.ValueFrom.SecretKeyRef, what+" "+h.Name
			th.Resolve = func(ctx context.Context) (string, error) {
				return r.readSecret(ctx, namespace, ref, label)
			}
		}
		out = append(out, th)
	}
	return out
}

// gateHooks turns spec.approvals into the BeforeTool hook that raises approval requests.
func gateHooks(approvals []toolnexusv1alpha1.ApprovalGate) (loop.Hooks, error) {
	if len(approvals) == 0 {
		return loop.Hooks{}, nil
	}
	specs := make([]tools.GateSpec, len(approvals))
	for i, a := range approvals {
		specs[i] = tools.GateSpec{Tools: a.Tools, When: a.When, Prompt: a.Prompt}
	}
	gates, err := tools.NewGates(specs)
	if err != nil {
		return loop.Hooks{}, fmt.Errorf("spec.approvals: %w", err)
	}
	return loop.Hooks{BeforeTool: func(_ context.Context, ev loop.BeforeToolEvent) (*loop.ToolOverride, error) {
		raw, err := json.Marshal(ev.Args)
		if err != nil {
			return nil, err
		}
		req, err := gates.Check(ev.Name, ev.Args, ev.ID, string(raw))
		if errors.Is(err, tools.ErrPromptRender) {
			return nil, &specError{err} // the run ends InvalidSpec: no call of this gate could be shown
		}
		if req == nil {
			return nil, err
		}
		if err != nil {
			// A `when` that cannot be evaluated requires approval; the approver sees why.
			req.Data["whenError"] = err.Error()
		}
		res := tools.Pending(*req)
		return &loop.ToolOverride{Result: &res}, nil
	}}, nil
}

// jsonObject decodes an optional JSON object field; nil or non-object JSON gives nil.
func jsonObject(j *apiextensionsv1.JSON) map[string]any {
	if j == nil {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(j.Raw, &m) != nil {
		return nil
	}
	return m
}

// suspensionTimeout is how long the run's requests wait before they expire; 0 is forever.
func suspensionTimeout(p *toolnexusv1alpha1.SuspensionPolicy) time.Duration {
	if p == nil {
		return 0
	}
	return durationOr(p.Timeout, 0)
}

// durationOr returns d, or def when d is unset.
func durationOr(d *metav1.Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.Duration
}

// defaultHTTPClient is the default client for model and tool requests, behind the network guard
// with its defaults: per-request timeouts come from contexts, so the client itself sets none.
func defaultHTTPClient() *http.Client {
	return netguard.Config{}.Client()
}

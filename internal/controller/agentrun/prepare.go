package agentrun

import (
	"context"
	"fmt"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller/runspec"
	"github.com/toolnexus/operator/internal/kube"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/telemetry"
	"github.com/toolnexus/operator/internal/tools"
)

// readSecret reads one key of a Secret in namespace, uncached: the manager does not keep Secret
// values in memory, and a rotated Secret is picked up by the next read.
func (r *Reconciler) readSecret(ctx context.Context, namespace string, ref toolnexusv1alpha1.SecretKeyReference, what string) (string, error) {
	return kube.ReadSecretKey(ctx, r.APIReader, r.RequireSecretLabel, namespace, ref, what)
}

// stepper is what a step needs: the run's spec built with its Secrets (the reconcile reads them;
// connecting the MCP servers is network I/O, done by the step itself) and the run's trace, which
// the step's spans join.
type stepper struct {
	*runspec.Built
	trace telemetry.Run
}

// prepare builds the run's spec with its Secrets, without network I/O but the API server's. Secret
// values for headers are resolved at call time; the API key is read now because every model
// request needs it.
func (r *Reconciler) prepare(ctx context.Context, run *toolnexusv1alpha1.AgentRun, spec *toolnexusv1alpha1.AgentRunSpec, observe func(loop.Event)) (*stepper, error) {
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
	trace := r.runTrace(ctx, run)
	built, err := runspec.Build(&spec.AgentSpec, runspec.Env{
		APIKey: apiKey,
		Headers: func(hs []toolnexusv1alpha1.HTTPHeader, what string) []tools.Header {
			return r.headers(run.Namespace, hs, what)
		},
		HTTPClient: r.HTTPClient, IdempotencyPrefix: string(run.UID), OnEvent: observe, Clock: r.Clock.Now,
		Tracer: r.Tracing.Loop(trace), MaxToolCallsPerTurn: r.MaxToolCallsPerTurn,
	})
	if err != nil {
		return nil, err
	}
	return &stepper{Built: built, trace: trace}, nil
}

func (r *Reconciler) checkHeaders(ctx context.Context, namespace string, hs []toolnexusv1alpha1.HTTPHeader, what string) error {
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
func (r *Reconciler) headers(namespace string, hs []toolnexusv1alpha1.HTTPHeader, what string) []tools.Header {
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

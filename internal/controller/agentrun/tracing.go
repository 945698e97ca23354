package agentrun

import (
	"context"
	"time"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/telemetry"
)

// A run is one trace (internal/telemetry): its steps' model requests and tool calls are traced
// where they run (the executor), its suspensions and the run span itself when they end, from the
// reconcile that records their end.

// runTrace identifies the run's trace. A malformed traceparent annotation is ignored: the run
// gets a trace of its own, and the log says why (at the default level until the run has started).
func (r *Reconciler) runTrace(ctx context.Context, run *toolnexusv1alpha1.AgentRun) telemetry.Run {
	tr := telemetry.Run{UID: string(run.UID), Namespace: run.Namespace, Name: run.Name}
	if r.Tracing == nil {
		return tr
	}
	if run.Spec.AgentRef != nil {
		tr.Agent = run.Spec.AgentRef.Name
	}
	if v, ok := run.Annotations[toolnexusv1alpha1.TraceparentAnnotation]; ok {
		sc, err := telemetry.ParseTraceparent(v)
		if err != nil {
			log := ctrl.LoggerFrom(ctx)
			if run.Status.Started() {
				log = log.V(1) // said when the run started; every step and suspension reads it again
			}
			log.Info("Ignoring the run's traceparent annotation; the run is traced on its own",
				"run", klog.KObj(run), "annotation", toolnexusv1alpha1.TraceparentAnnotation, "reason", err.Error())
		}
		tr.Caller = sc
	}
	return tr
}

// traceSuspension writes the span of a request that ended with outcome at end.
func (r *Reconciler) traceSuspension(ctx context.Context, run *toolnexusv1alpha1.AgentRun, preq *toolnexusv1alpha1.PendingRequest, outcome string, end time.Time) {
	if r.Tracing == nil {
		return
	}
	if at := preq.Status.AnsweredAt; at != nil {
		end = at.Time
	}
	r.Tracing.Suspended(r.runTrace(ctx, run), telemetry.Suspension{
		Kind: preq.Spec.Request.Kind, Tool: preq.Spec.ToolCall.Name, CallID: preq.Spec.ToolCall.ID, Request: preq.Name,
		Outcome: outcome, AnsweredBy: preq.Status.AnsweredBy, Start: preq.CreationTimestamp.Time, End: end,
	})
}

// traceEnd writes the run span; it is called once, with the run's end event, which says whether
// the run failed.
func (r *Reconciler) traceEnd(ctx context.Context, s *scope, failed bool) {
	if r.Tracing == nil {
		return
	}
	st := s.run.Status
	e := telemetry.RunEnd{Start: s.run.CreationTimestamp.Time, End: s.now, Model: st.Model, Turns: int(st.Turns),
		InputTokens: st.Usage.PromptTokens, OutputTokens: st.Usage.CompletionTokens}
	if st.StartTime != nil {
		e.Start = st.StartTime.Time
	}
	if st.CompletionTime != nil {
		e.End = st.CompletionTime.Time
	}
	c := conditionOf(s.run, toolnexusv1alpha1.ConditionSucceeded)
	e.Reason, e.Message, e.Failed = c.Reason, c.Message, failed
	r.Tracing.Ended(r.runTrace(ctx, s.run), e)
}

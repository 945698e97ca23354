package controller

import (
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
)

// Bounds of what status keeps; the transcript holds everything.
const (
	maxStatusText      = 8192
	maxStatusToolCalls = 20
	maxStatusArgs      = 512
	maxStatusOutput    = 1024
	maxStatusPrompt    = 1024
	maxStatusPending   = 64
)

// progress is what a reconcile learned that the record does not hold: why an active run is not
// moving (a missing Secret, a retrying model) and which tool sources failed.
type progress struct {
	reason, message string
	// mcpFailures names the MCP servers that failed when toolsBuilt; when the tools were not built
	// this reconcile the ToolsReady condition is left as it was.
	mcpFailures []string
	toolsBuilt  bool
}

// finished reports whether the run has ended, judged from its status.
func finished(run *toolnexusv1alpha1.AgentRun) bool {
	c := meta.FindStatusCondition(run.Status.Conditions, toolnexusv1alpha1.ConditionSucceeded)
	return c != nil && c.Status != metav1.ConditionUnknown
}

// setStatus derives the run's status from its record, its open requests and this reconcile's
// progress. It is pure: the caller patches the result.
func setStatus(run *toolnexusv1alpha1.AgentRun, rec *runRecord, open []toolnexusv1alpha1.PendingSummary, p progress, now time.Time) {
	st, s := rec.State, &run.Status
	gen := run.Generation
	s.ObservedGeneration = gen
	s.Turns, s.ToolCallCount, s.Model = int32(st.Turn), int32(st.ToolCallCount), st.Model
	s.Usage = toolnexusv1alpha1.Usage{
		PromptTokens: int64(st.Usage.PromptTokens), CompletionTokens: int64(st.Usage.CompletionTokens),
		TotalTokens: int64(st.Usage.TotalTokens),
	}
	s.ModelFailures = int32(st.ModelFailures)
	s.ToolCalls = toolCallSummaries(st.ToolCalls)
	if len(open) > maxStatusPending {
		open = open[:maxStatusPending]
	}
	s.Pending, s.PendingCount = open, int32(len(open))
	if rec.started() {
		s.TranscriptRef = &toolnexusv1alpha1.TranscriptReference{Name: recordName(run.Name, 0)}
		if s.StartTime == nil {
			s.StartTime = &metav1.Time{Time: now}
		}
	}

	succeeded := metav1.Condition{Type: toolnexusv1alpha1.ConditionSucceeded, ObservedGeneration: gen}
	s.Limit, s.Text = "", ""
	switch {
	case st.Outcome != nil:
		succeeded.Status, succeeded.Reason, succeeded.Message = metav1.ConditionFalse, st.Outcome.Reason, st.Outcome.Message
		s.Phase, s.Result = toolnexusv1alpha1.RunPhaseFailed, ""
	case st.Status == loop.StatusDone:
		succeeded.Status, succeeded.Reason, succeeded.Message = metav1.ConditionTrue, toolnexusv1alpha1.ReasonCompleted, "The model gave its final answer"
		s.Phase, s.Result, s.Text = toolnexusv1alpha1.RunPhaseSucceeded, loop.StatusDone, truncate(st.Text, maxStatusText)
	case st.Status == loop.StatusIncomplete:
		succeeded.Status, succeeded.Reason = metav1.ConditionFalse, toolnexusv1alpha1.ReasonMaxTurns
		succeeded.Message = "The run used all its model turns without a final answer"
		s.Phase, s.Result, s.Limit = toolnexusv1alpha1.RunPhaseIncomplete, loop.StatusIncomplete, st.Limit
		s.Text = truncate(st.Text, maxStatusText)
	default:
		succeeded.Status = metav1.ConditionUnknown
		switch {
		case p.reason != "":
			succeeded.Reason, succeeded.Message = p.reason, p.message
			s.Phase = toolnexusv1alpha1.RunPhaseRunning
			if !rec.started() {
				s.Phase = toolnexusv1alpha1.RunPhasePending
			}
		case len(open) > 0:
			succeeded.Reason, succeeded.Message = toolnexusv1alpha1.ReasonWaitingForAnswer, "The run waits for an answer to its PendingRequests"
			s.Phase = toolnexusv1alpha1.RunPhaseSuspended
		case !rec.started():
			succeeded.Reason, succeeded.Message = toolnexusv1alpha1.ReasonPending, "The run has not taken its first step"
			s.Phase = toolnexusv1alpha1.RunPhasePending
		default:
			succeeded.Reason, succeeded.Message = toolnexusv1alpha1.ReasonRunning, "The run is taking steps"
			s.Phase = toolnexusv1alpha1.RunPhaseRunning
		}
		if len(open) > 0 {
			s.Result, s.Text = loop.StatusPending, truncate(open[0].Prompt, maxStatusText)
		} else {
			s.Result = ""
		}
	}
	meta.SetStatusCondition(&s.Conditions, succeeded)
	if succeeded.Status != metav1.ConditionUnknown && s.CompletionTime == nil {
		s.CompletionTime = &metav1.Time{Time: now}
	}
	// kstatus reads abnormal-true conditions: Reconciling while active, Stalled after a failure.
	abnormal := map[metav1.ConditionStatus]string{
		metav1.ConditionUnknown: toolnexusv1alpha1.ConditionReconciling,
		metav1.ConditionFalse:   toolnexusv1alpha1.ConditionStalled,
	}
	for status, t := range abnormal {
		if succeeded.Status != status {
			meta.RemoveStatusCondition(&s.Conditions, t)
			continue
		}
		meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: t, Status: metav1.ConditionTrue,
			ObservedGeneration: gen, Reason: succeeded.Reason, Message: succeeded.Message})
	}

	suspended := metav1.Condition{Type: toolnexusv1alpha1.ConditionSuspended, ObservedGeneration: gen,
		Status: metav1.ConditionFalse, Reason: toolnexusv1alpha1.ReasonNoOpenRequests, Message: "No PendingRequest of the run is open"}
	if len(open) > 0 {
		suspended.Status, suspended.Reason, suspended.Message = metav1.ConditionTrue, toolnexusv1alpha1.ReasonOpenRequests, "Waiting for an answer to "+open[0].Name
	}
	meta.SetStatusCondition(&s.Conditions, suspended)

	if len(run.Spec.MCPServers) > 0 && p.toolsBuilt {
		tr := metav1.Condition{Type: toolnexusv1alpha1.ConditionToolsReady, ObservedGeneration: gen,
			Status: metav1.ConditionTrue, Reason: toolnexusv1alpha1.ReasonToolsAvailable, Message: "Every MCP server answered"}
		if len(p.mcpFailures) > 0 {
			tr.Status, tr.Reason = metav1.ConditionFalse, toolnexusv1alpha1.ReasonMCPServerUnavailable
			tr.Message = truncate("Left out the tools of: "+strings.Join(p.mcpFailures, "; "), 1024)
		}
		meta.SetStatusCondition(&s.Conditions, tr)
	}
}

func toolCallSummaries(calls []loop.ToolCall) []toolnexusv1alpha1.ToolCallSummary {
	if len(calls) > maxStatusToolCalls {
		calls = calls[len(calls)-maxStatusToolCalls:]
	}
	out := make([]toolnexusv1alpha1.ToolCallSummary, 0, len(calls))
	for _, c := range calls {
		out = append(out, toolnexusv1alpha1.ToolCallSummary{
			ID: c.ID, Name: c.Name, Arguments: truncate(c.Arguments, maxStatusArgs),
			Output: truncate(c.Output, maxStatusOutput), IsError: c.IsError, Turn: int32(c.Turn),
		})
	}
	return out
}

// requestPhase summarises a request's state for display.
func requestPhase(preq *toolnexusv1alpha1.PendingRequest, cancelled bool) toolnexusv1alpha1.RequestPhase {
	a := preq.Status.Answer
	switch {
	case a == nil && cancelled:
		return toolnexusv1alpha1.RequestPhaseCancelled
	case a == nil:
		return toolnexusv1alpha1.RequestPhaseWaiting
	case !a.OK && a.Reason == "expired" && preq.Status.AnsweredBy == toolnexusv1alpha1.ExpiredAnswerer:
		return toolnexusv1alpha1.RequestPhaseExpired
	case !a.OK && a.Reason == "cancelled":
		return toolnexusv1alpha1.RequestPhaseCancelled
	}
	return toolnexusv1alpha1.RequestPhaseAnswered
}

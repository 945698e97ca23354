package agentrun

import (
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/controller/runspec"
	"github.com/toolnexus/operator/internal/kube"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/runstore"
	"github.com/toolnexus/operator/internal/tools"
)

// Bounds of what status keeps; the transcript holds everything.
const (
	maxStatusText      = 8192
	maxStatusToolCalls = 20
	maxStatusArgs      = 512
	maxStatusOutput    = 1024
	maxStatusPrompt    = 1024
	maxStatusPending   = 64
	// maxStatusName bounds a tool name in status: the model may call a tool by any name.
	maxStatusName = 256
)

// statusInterval is how often a running run's status is patched when only its counters and
// summaries changed (turns, tool calls, usage): every transition (a phase, a condition, a request
// opened or closed, the end) is patched at once. A status patch is the costliest request the
// manager makes (the whole object is validated, CEL rules included, and sent to every watcher): at
// 5 s, a run whose turns take a second or two costs one patch when it starts and one when it ends.
const statusInterval = 5 * time.Second

// progressOnly reports whether after differs from before in the counters and summaries of a
// running run alone.
func progressOnly(before, after *toolnexusv1alpha1.AgentRunStatus) bool {
	b, a := *before, *after
	for _, s := range []*toolnexusv1alpha1.AgentRunStatus{&b, &a} {
		s.Turns, s.ToolCallCount, s.Model, s.Usage, s.ToolCalls = 0, 0, "", toolnexusv1alpha1.Usage{}, nil
	}
	return equality.Semantic.DeepEqual(b, a)
}

// progress is what a reconcile learned that the record does not hold: why an active run is not
// moving (a missing Secret, a retrying model) and which tool sources failed.
type progress struct {
	reason, message string
	// mcp is how the MCP servers answered when toolsBuilt; when the tools were not built this
	// reconcile the ToolsReady condition is left as it was.
	mcp        runspec.MCPReport
	toolsBuilt bool
}

// finished reports whether the run has ended, judged from its status.
func finished(run *toolnexusv1alpha1.AgentRun) bool {
	c := meta.FindStatusCondition(run.Status.Conditions, toolnexusv1alpha1.ConditionSucceeded)
	return c != nil && c.Status != metav1.ConditionUnknown
}

// setStatus derives the run's status from its saved record, its open requests and this
// reconcile's progress: the fields, then one pure function per condition. The caller patches the
// result.
func setStatus(run *toolnexusv1alpha1.AgentRun, rec *runstore.Record, open []toolnexusv1alpha1.PendingSummary, p progress, now time.Time) {
	if len(open) > maxStatusPending {
		open = open[:maxStatusPending]
	}
	setFields(run, rec, open, now)
	setSucceeded(run, rec, open, p, now)
	if finished(run) && run.Status.CompletionTime == nil {
		run.Status.CompletionTime = &metav1.Time{Time: now}
	}
	setKstatus(run, now)
	setSuspended(run, open, now)
	setToolsReady(run, rec, p, now)
}

// setFields copies the loop state's counters and summaries into status.
func setFields(run *toolnexusv1alpha1.AgentRun, rec *runstore.Record, open []toolnexusv1alpha1.PendingSummary, now time.Time) {
	st, s := rec.State, &run.Status
	s.ObservedGeneration = run.Generation
	s.Turns, s.ToolCallCount, s.Model = int32(st.Turn), int32(st.ToolCallCount), st.Model
	s.Usage = toolnexusv1alpha1.Usage{
		PromptTokens: int64(st.Usage.PromptTokens), CompletionTokens: int64(st.Usage.CompletionTokens),
		TotalTokens: int64(st.Usage.TotalTokens),
	}
	s.ModelFailures = int32(st.ModelFailures)
	s.ToolCalls = toolCallSummaries(st.ToolCalls)
	s.Pending, s.PendingCount = open, int32(len(open))
	if a := rec.Agent; a != nil {
		s.Agent = &toolnexusv1alpha1.AgentSnapshotReference{Name: a.Name, Generation: a.Generation}
	}
	if rec.Started() {
		s.TranscriptRef = &toolnexusv1alpha1.TranscriptReference{Name: runstore.HeadName(run.Name)}
		if s.StartTime == nil {
			// When the record was created: the same in every reconcile, whatever the cache shows.
			start := rec.Head.CreationTimestamp
			if start.IsZero() {
				start = metav1.Time{Time: now}
			}
			s.StartTime = &start
		}
	}
}

// setSucceeded sets the terminal summary and the display fields derived from it: phase, result,
// limit and text.
func setSucceeded(run *toolnexusv1alpha1.AgentRun, rec *runstore.Record, open []toolnexusv1alpha1.PendingSummary, p progress, now time.Time) {
	st, s := rec.State, &run.Status
	status, reason, message := metav1.ConditionUnknown, "", ""
	s.Limit, s.Text, s.Result = "", "", ""
	switch {
	case st.Outcome != nil:
		status, reason, message = metav1.ConditionFalse, st.Outcome.Reason, st.Outcome.Message
		s.Phase = toolnexusv1alpha1.RunPhaseFailed
	case st.Status == loop.StatusDone:
		status, reason, message = metav1.ConditionTrue, toolnexusv1alpha1.ReasonCompleted, "The model gave its final answer"
		s.Phase, s.Result, s.Text = toolnexusv1alpha1.RunPhaseSucceeded, loop.StatusDone, clip.Marked(st.Text, maxStatusText)
	case st.Status == loop.StatusIncomplete:
		status, reason = metav1.ConditionFalse, toolnexusv1alpha1.ReasonMaxTurns
		message = "The run used all its model turns without a final answer"
		s.Phase, s.Result, s.Limit = toolnexusv1alpha1.RunPhaseIncomplete, loop.StatusIncomplete, st.Limit
		s.Text = clip.Marked(st.Text, maxStatusText)
	case p.reason != "":
		reason, message = p.reason, p.message
		s.Phase = toolnexusv1alpha1.RunPhaseRunning
		if !rec.Started() {
			s.Phase = toolnexusv1alpha1.RunPhasePending
		}
	case len(open) > 0:
		reason, message = toolnexusv1alpha1.ReasonWaitingForAnswer, "The run waits for an answer to its PendingRequests"
		s.Phase = toolnexusv1alpha1.RunPhaseSuspended
	case !rec.Started():
		reason, message = toolnexusv1alpha1.ReasonPending, "The run has not taken its first step"
		s.Phase = toolnexusv1alpha1.RunPhasePending
	default:
		reason, message = toolnexusv1alpha1.ReasonRunning, "The run is taking steps"
		s.Phase = toolnexusv1alpha1.RunPhaseRunning
	}
	if status == metav1.ConditionUnknown && len(open) > 0 {
		s.Result, s.Text = loop.StatusPending, clip.Marked(open[0].Prompt, maxStatusText)
	}
	kube.SetCondition(run, now, toolnexusv1alpha1.ConditionSucceeded, status, reason, message)
}

// setKstatus sets the abnormal-true conditions kstatus reads, mirroring Succeeded: Reconciling
// while the run is active, Stalled once it ended without success.
func setKstatus(run *toolnexusv1alpha1.AgentRun, now time.Time) {
	succeeded := conditionOf(run, toolnexusv1alpha1.ConditionSucceeded)
	for t, when := range map[string]metav1.ConditionStatus{
		toolnexusv1alpha1.ConditionReconciling: metav1.ConditionUnknown,
		toolnexusv1alpha1.ConditionStalled:     metav1.ConditionFalse,
	} {
		if succeeded.Status != when {
			meta.RemoveStatusCondition(&run.Status.Conditions, t)
			continue
		}
		kube.SetCondition(run, now, t, metav1.ConditionTrue, succeeded.Reason, succeeded.Message)
	}
}

// setSuspended is True while a request of the run is open.
func setSuspended(run *toolnexusv1alpha1.AgentRun, open []toolnexusv1alpha1.PendingSummary, now time.Time) {
	if len(open) > 0 {
		kube.SetCondition(run, now, toolnexusv1alpha1.ConditionSuspended, metav1.ConditionTrue, toolnexusv1alpha1.ReasonOpenRequests, "Waiting for an answer to "+open[0].Name)
		return
	}
	kube.SetCondition(run, now, toolnexusv1alpha1.ConditionSuspended, metav1.ConditionFalse, toolnexusv1alpha1.ReasonNoOpenRequests, "No PendingRequest of the run is open")
}

// setToolsReady says whether every MCP server answered when the tools were last built; when they
// were not built this reconcile the condition stays as it was.
func setToolsReady(run *toolnexusv1alpha1.AgentRun, rec *runstore.Record, p progress, now time.Time) {
	if !p.toolsBuilt {
		return
	}
	if spec, err := effectiveSpec(run, rec); err != nil || len(spec.MCPServers) == 0 {
		return
	}
	// Which revision each server speaks says which protocol a tool's requests follow (docs/design.md).
	answered := ""
	if len(p.mcp.Revisions) > 0 {
		answered = ": " + strings.Join(p.mcp.Revisions, ", ")
	}
	if len(p.mcp.Failures) > 0 {
		if answered != "" {
			answered = "; answered" + answered
		}
		kube.SetCondition(run, now, toolnexusv1alpha1.ConditionToolsReady, metav1.ConditionFalse, toolnexusv1alpha1.ReasonMCPServerUnavailable,
			clip.Marked("Some MCP tools are missing: "+strings.Join(p.mcp.Failures, "; ")+answered, 1024))
		return
	}
	kube.SetCondition(run, now, toolnexusv1alpha1.ConditionToolsReady, metav1.ConditionTrue, toolnexusv1alpha1.ReasonToolsAvailable,
		clip.Marked("Every MCP server answered"+answered, 1024))
}

func toolCallSummaries(calls []loop.ToolCall) []toolnexusv1alpha1.ToolCallSummary {
	if len(calls) > maxStatusToolCalls {
		calls = calls[len(calls)-maxStatusToolCalls:]
	}
	out := make([]toolnexusv1alpha1.ToolCallSummary, 0, len(calls))
	for _, c := range calls {
		out = append(out, toolnexusv1alpha1.ToolCallSummary{
			ID: c.ID, Name: clip.Marked(c.Name, maxStatusName), Arguments: clip.Marked(c.Arguments, maxStatusArgs),
			Output: clip.Marked(c.Output, maxStatusOutput), IsError: c.IsError, Turn: int32(c.Turn),
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
	case !a.OK && a.Reason == tools.ReasonExpired && preq.Status.AnsweredBy == toolnexusv1alpha1.ExpiredAnswerer:
		return toolnexusv1alpha1.RequestPhaseExpired
	case !a.OK && a.Reason == tools.ReasonCancelled:
		return toolnexusv1alpha1.RequestPhaseCancelled
	}
	return toolnexusv1alpha1.RequestPhaseAnswered
}

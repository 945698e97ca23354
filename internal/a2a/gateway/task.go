package gateway

import (
	"encoding/json"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/a2a"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// A task is an AgentRun of the agent the endpoint serves; its id is the run's name. Its state is
// read off the run's conditions, never kept by the gateway:
//
//	Succeeded True                     completed, the run's text as the artifact
//	Succeeded False, reason Cancelled  canceled (also once spec.cancel is set)
//	Succeeded False, any other reason  failed, the condition's message as the status message
//	an open PendingRequest             auth-required for kind authorization, else input-required
//	not started yet                    submitted
//	otherwise                          working

// Annotations the gateway sets on the runs it creates.
const (
	// ContextAnnotation is the task's A2A contextId.
	ContextAnnotation = "toolnexus.dev/a2a-context-id"
	// MessageAnnotation is the messageId of the message that created the task.
	MessageAnnotation = "toolnexus.dev/a2a-message-id"
)

// resultArtifactID names the artifact holding the run's final text.
const resultArtifactID = "result"

// view is what a task is projected from: the run, and the open PendingRequests it waits on as the
// caller may read them (nil: only the run's status summaries are shown).
type view struct {
	run     *toolnexusv1alpha1.AgentRun
	details map[string]*toolnexusv1alpha1.PendingRequest
}

// stateOf reads the task state and, for an end that is not a success, what to tell the client.
func stateOf(run *toolnexusv1alpha1.AgentRun) (a2a.TaskState, string) {
	succeeded := meta.FindStatusCondition(run.Status.Conditions, toolnexusv1alpha1.ConditionSucceeded)
	switch {
	case succeeded != nil && succeeded.Status == metav1.ConditionTrue:
		return a2a.TaskStateCompleted, ""
	case succeeded != nil && succeeded.Status == metav1.ConditionFalse && succeeded.Reason == toolnexusv1alpha1.ReasonCancelled:
		return a2a.TaskStateCanceled, succeeded.Message
	case succeeded != nil && succeeded.Status == metav1.ConditionFalse:
		return a2a.TaskStateFailed, succeeded.Reason + ": " + succeeded.Message
	case run.Spec.Cancel:
		return a2a.TaskStateCanceled, "The run was cancelled"
	case len(run.Status.Pending) > 0:
		if run.Status.Pending[0].Kind == wire.KindAuthorization {
			return a2a.TaskStateAuthRequired, ""
		}
		return a2a.TaskStateInputRequired, ""
	case succeeded == nil || succeeded.Reason == toolnexusv1alpha1.ReasonPending:
		return a2a.TaskStateSubmitted, ""
	}
	return a2a.TaskStateWorking, ""
}

// task projects v onto the A2A task. history bounds the messages of its history (nil: all of the
// one it keeps, the prompt); artifacts says whether to include them.
func (v view) task(history *int32, artifacts bool) a2a.Task {
	run := v.run
	state, why := stateOf(run)
	contextID := run.Annotations[ContextAnnotation]
	t := a2a.Task{ID: run.Name, ContextID: contextID,
		Status: a2a.TaskStatus{State: state, Timestamp: stamp(statusTime(run))}}
	agentSays := func(id string, parts ...a2a.Part) *a2a.Message {
		return &a2a.Message{MessageID: id, TaskID: run.Name, ContextID: contextID, Role: a2a.RoleAgent, Parts: parts}
	}
	switch {
	case state.Interrupted():
		t.Status.Message = v.asking(agentSays)
	case state == a2a.TaskStateCompleted && artifacts:
		t.Artifacts = []a2a.Artifact{{ArtifactID: resultArtifactID, Name: "result", Parts: []a2a.Part{{Text: run.Status.Text}}}}
	case why != "":
		t.Status.Message = agentSays(string(run.UID)+"/"+string(state), a2a.Part{Text: why})
	}
	if history == nil || *history > 0 {
		t.History = []a2a.Message{{MessageID: promptMessageID(run), TaskID: run.Name, ContextID: contextID,
			Role: a2a.RoleUser, Parts: []a2a.Part{{Text: run.Spec.Prompt}}}}
	}
	return t
}

// asking is the status message of an interrupted task: the first open request's prompt as text
// (with its URL, for a login), and a data part per open request. Its id names the first request's
// object, so a client tells a new question from the one it answered.
func (v view) asking(agentSays func(string, ...a2a.Part) *a2a.Message) *a2a.Message {
	pending := v.run.Status.Pending
	first := pending[0]
	text := first.Prompt
	if first.URL != "" {
		text += "\n" + first.URL
	}
	parts := []a2a.Part{{Text: text}}
	id := "request/" + first.Name
	for i, p := range pending {
		part := a2a.RequestPart{Name: p.Name, Kind: p.Kind, Prompt: p.Prompt, URL: p.URL}
		if preq := v.details[p.Name]; preq != nil {
			part = requestPart(preq)
			if i == 0 {
				id = "request/" + string(preq.UID)
			}
		}
		raw, err := json.Marshal(part)
		if err != nil {
			continue
		}
		parts = append(parts, a2a.Part{Data: raw, MediaType: "application/json",
			Metadata: map[string]any{a2a.RequestMetadataKey: p.Name}})
	}
	return agentSays(id, parts...)
}

// requestPart is the PendingRequest as a status message shows it.
func requestPart(preq *toolnexusv1alpha1.PendingRequest) a2a.RequestPart {
	r := preq.Spec.Request
	part := a2a.RequestPart{Name: preq.Name, UID: string(preq.UID), ID: r.ID, Kind: r.Kind, Prompt: r.Prompt, URL: r.URL,
		ExpiresAt: r.ExpiresAt, Tool: preq.Spec.ToolCall.Name, Arguments: preq.Spec.ToolCall.Arguments}
	if r.Data != nil {
		_ = json.Unmarshal(r.Data.Raw, &part.Data)
	}
	return part
}

// promptMessageID is the id of the message that created the task.
func promptMessageID(run *toolnexusv1alpha1.AgentRun) string {
	if id := run.Annotations[MessageAnnotation]; id != "" {
		return id
	}
	return string(run.UID) + "/prompt"
}

// statusTime is when the task's status last changed: the latest transition of the run's
// conditions, else its creation.
func statusTime(run *toolnexusv1alpha1.AgentRun) time.Time {
	t := run.CreationTimestamp.Time
	for _, c := range run.Status.Conditions {
		if c.LastTransitionTime.After(t) {
			t = c.LastTransitionTime.Time
		}
	}
	return t
}

// stamp formats t as the protocol's timestamps are (§5.6.1): UTC, milliseconds.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

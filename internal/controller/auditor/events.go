package auditor

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/audit"
)

// What a request's audit trail holds is derived from the request alone: it exists (requested),
// its status.approvals entries (one approval each), its answer (answered, or expired when the
// manager wrote it), how it ended unanswered (cancelled: Resolved with reason RunGone, or deleted),
// and whether its run took an ok answer in (executed: Resolved with reason AnswerConsumed).
// status.audited records the events delivered; the rest is owed. Nothing else needs to survive a
// restart: what is owed and not recorded is sent again (at least once; the event id is stable).

// owed lists the audit events of preq so far, in the order they happen.
func owed(preq *toolnexusv1alpha1.PendingRequest) []audit.Event {
	base := audit.Event{
		Namespace: preq.Namespace, Run: preq.Spec.RunRef.Name, Request: preq.Name, UID: string(preq.UID),
		RequestKind: preq.Spec.Request.Kind, Tool: preq.Spec.ToolCall.Name,
		ArgumentsDigest: audit.ArgumentsDigest(preq.Spec.ToolCall.Arguments), RequestedBy: preq.Spec.RequestedBy,
	}
	if p := preq.Spec.Policy; p != nil {
		base.Policy = &audit.Policy{Name: p.Name, Generation: p.Generation}
	}
	event := func(kind audit.Kind, at time.Time) audit.Event {
		e := base
		e.Kind, e.Time = kind, at
		return e
	}
	out := []audit.Event{event(audit.Requested, preq.CreationTimestamp.Time)}
	for _, entry := range preq.Status.Approvals {
		e := event(audit.Approval, timeOf(entry.At))
		e.Approval = &audit.ApprovalEntry{User: entry.User, OK: entry.OK, Reason: entry.Reason, At: timePtr(entry.At)}
		out = append(out, e)
	}
	resolved := meta.FindStatusCondition(preq.Status.Conditions, toolnexusv1alpha1.ConditionResolved)
	isResolved := func(reason string) bool {
		return resolved != nil && resolved.Status == metav1.ConditionTrue && resolved.Reason == reason
	}
	a := preq.Status.Answer
	switch {
	case a != nil:
		kind := audit.Answered
		if preq.Status.AnsweredBy == toolnexusv1alpha1.ExpiredAnswerer {
			kind = audit.Expired
		}
		e := event(kind, timeOf(preq.Status.AnsweredAt))
		e.Answer = &audit.Answer{AnsweredBy: preq.Status.AnsweredBy, AnsweredAt: timePtr(preq.Status.AnsweredAt), OK: a.OK, Reason: a.Reason}
		if kind == audit.Expired {
			e.ExpiresAt = preq.Spec.Request.ExpiresAt
		}
		out = append(out, e)
	case isResolved(toolnexusv1alpha1.ReasonRunGone):
		e := event(audit.Cancelled, resolved.LastTransitionTime.Time)
		e.Why = audit.WhyRunGone
		out = append(out, e)
	case !preq.DeletionTimestamp.IsZero():
		e := event(audit.Cancelled, preq.DeletionTimestamp.Time)
		e.Why = audit.WhyDeleted
		out = append(out, e)
	}
	if a != nil && a.OK && isResolved(toolnexusv1alpha1.ReasonAnswerConsumed) {
		out = append(out, event(audit.Executed, resolved.LastTransitionTime.Time))
	}
	return out
}

// final reports whether preq will have no audit event beyond those it has: it is being deleted,
// or its run is done with it (Resolved).
func final(preq *toolnexusv1alpha1.PendingRequest) bool {
	return !preq.DeletionTimestamp.IsZero() || meta.IsStatusConditionTrue(preq.Status.Conditions, toolnexusv1alpha1.ConditionResolved)
}

// next is the first owed event not in delivered, or nil. Events go out in the order they
// happened: one is sent once those before it were delivered.
func next(events []audit.Event, delivered []string) *audit.Event {
	for i := range events {
		if !slices.Contains(delivered, events[i].Key()) {
			return &events[i]
		}
	}
	return nil
}

// undelivered lists the keys of the owed events not in delivered.
func undelivered(events []audit.Event, delivered []string) []string {
	var out []string
	for _, e := range events {
		if !slices.Contains(delivered, e.Key()) {
			out = append(out, e.Key())
		}
	}
	return out
}

func timeOf(t *metav1.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.Time
}

func timePtr(t *metav1.Time) *time.Time {
	if t == nil {
		return nil
	}
	v := t.Time
	return &v
}

package notifier

import (
	"os"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// A policy's escalation steps (spec.escalation, copied from the policy when the request was
// made) apply once each, in order, while the request is undecided: once step i's after has
// passed since the request's creation, the notifier records {step: i, time} in
// status.escalations, and from then on the step's sinks are owed its Escalated event, like any
// other event that happened. The record is written before any of its sinks is told, so a restart
// neither repeats a step (it is recorded) nor loses its notifications (they are owed until
// status.notifications records them); a step whose time passed while no manager ran applies when
// the next one starts. Who may approve needs no write of the manager: the API server admits a
// step's approvers from creationTimestamp + after on.

// undecided reports whether preq still waits for a decision at now: no answer, not given up by
// its run (Resolved True without an answer: the run ended or was cancelled), and not past its
// expiresAt (the expiry is about to be written, and no approver may answer any more).
func undecided(preq *toolnexusv1alpha1.PendingRequest, now time.Time) bool {
	if preq.Status.Answer != nil || meta.IsStatusConditionTrue(preq.Status.Conditions, toolnexusv1alpha1.ConditionResolved) {
		return false
	}
	expires, ok := expiresAt(preq)
	return !ok || now.Before(expires)
}

// expiresAt is the request's spec.request.expiresAt, when it has one. The CRD admits only RFC
// 3339 date-times; one that still does not parse bounds nothing.
func expiresAt(preq *toolnexusv1alpha1.PendingRequest) (time.Time, bool) {
	if preq.Spec.Request.ExpiresAt == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339, preq.Spec.Request.ExpiresAt)
	return t, err == nil
}

// stepTime is when step i of preq applies.
func stepTime(preq *toolnexusv1alpha1.PendingRequest, i int) time.Time {
	return preq.CreationTimestamp.Add(preq.Spec.Escalation[i].After.Duration)
}

// stepRecord is the record of step i in preq's status, or nil.
func stepRecord(preq *toolnexusv1alpha1.PendingRequest, i int) *toolnexusv1alpha1.EscalationRecord {
	for k, rec := range preq.Status.Escalations {
		if int(rec.Step) == i {
			return &preq.Status.Escalations[k]
		}
	}
	return nil
}

// dueSteps lists the escalation steps of preq that apply at now, in order, and when the next one
// will (zero for none: every step applied, or the request decided or expiring first). A step
// applies only after the steps before it.
func dueSteps(preq *toolnexusv1alpha1.PendingRequest, now time.Time) (due []int32, next time.Time) {
	if !undecided(preq, now) {
		return nil, time.Time{}
	}
	for i := range preq.Spec.Escalation {
		if stepRecord(preq, i) != nil {
			continue
		}
		at := stepTime(preq, i)
		if now.Before(at) {
			if expires, ok := expiresAt(preq); !ok || at.Before(expires) {
				next = at
			}
			return due, next
		}
		due = append(due, int32(i))
	}
	return due, time.Time{}
}

// escalations lists the Escalated deliveries owed: one to each sink of every step recorded.
func escalations(preq *toolnexusv1alpha1.PendingRequest) []delivery {
	var out []delivery
	for k := range preq.Status.Escalations {
		rec := &preq.Status.Escalations[k]
		if int(rec.Step) >= len(preq.Spec.Escalation) {
			continue // the manager records only steps of the spec, which never changes
		}
		step := &preq.Spec.Escalation[rec.Step]
		for i := range step.Notify {
			out = append(out, delivery{sink: &step.Notify[i], event: toolnexusv1alpha1.NotifyEscalated, step: rec})
		}
	}
	return out
}

// mayApproveAt is who may approve preq once step applied: the request's approvers and those of
// every step due by then, each once, in order. A request open to whoever RBAC lets stays so.
func mayApproveAt(preq *toolnexusv1alpha1.PendingRequest, step int) (users, groups []string) {
	a := preq.Spec.Approvers
	if a == nil || len(a.Users)+len(a.Groups) == 0 {
		return nil, nil
	}
	users, groups = slices.Clone(a.Users), slices.Clone(a.Groups)
	by := preq.Spec.Escalation[step].After.Duration
	for _, s := range preq.Spec.Escalation {
		if s.Approvers == nil || s.After.Duration > by {
			continue
		}
		for _, u := range s.Approvers.Users {
			if !slices.Contains(users, u) {
				users = append(users, u)
			}
		}
		for _, g := range s.Approvers.Groups {
			if !slices.Contains(groups, g) {
				groups = append(groups, g)
			}
		}
	}
	return users, groups
}

// applySteps records steps as applied at now.
func applySteps(preq *toolnexusv1alpha1.PendingRequest, steps []int32, now time.Time) {
	for _, i := range steps {
		preq.Status.Escalations = append(preq.Status.Escalations, toolnexusv1alpha1.EscalationRecord{Step: i, Time: metav1.NewTime(now)})
	}
}

// serviceAccountNamespaceFile holds the namespace of the pod's ServiceAccount, mounted with its
// token.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// OwnNamespace is the namespace the manager runs in: POD_NAMESPACE when the Deployment sets it
// (the downward API), else the namespace of the pod's ServiceAccount; empty outside a cluster.
func OwnNamespace() string {
	if ns := strings.TrimSpace(os.Getenv("POD_NAMESPACE")); ns != "" {
		return ns
	}
	raw, err := os.ReadFile(serviceAccountNamespaceFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(raw))
}

// policyName names the policy whose steps preq has, for a message.
func policyName(preq *toolnexusv1alpha1.PendingRequest) string {
	if p := preq.Spec.Policy; p != nil {
		return "policy " + p.Name
	}
	return "the request"
}

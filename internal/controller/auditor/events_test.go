package auditor

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/audit"
)

var (
	created  = metav1.NewTime(time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC))
	answered = metav1.NewTime(created.Add(time.Minute))
	resolved = metav1.NewTime(created.Add(2 * time.Minute))
	deleted  = metav1.NewTime(created.Add(3 * time.Minute))
)

type change func(*toolnexusv1alpha1.PendingRequest)

func request(changes ...change) *toolnexusv1alpha1.PendingRequest {
	p := &toolnexusv1alpha1.PendingRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "buy-1-call-1", UID: "4b1e", CreationTimestamp: created},
		Spec: toolnexusv1alpha1.PendingRequestSpec{
			RunRef:   toolnexusv1alpha1.RunReference{Name: "buy"},
			ToolCall: toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "buy", Arguments: `{"item":"gpu"}`},
			Request:  toolnexusv1alpha1.Request{ID: "approval:call_1", Kind: "approval", ExpiresAt: "2026-05-01T10:00:00Z"},
		},
	}
	for _, c := range changes {
		c(p)
	}
	return p
}

func answer(ok bool, by string) change {
	return func(p *toolnexusv1alpha1.PendingRequest) {
		p.Status.Answer, p.Status.AnsweredBy, p.Status.AnsweredAt = &toolnexusv1alpha1.Answer{OK: ok}, by, &answered
		if by == toolnexusv1alpha1.ExpiredAnswerer {
			p.Status.Answer.Reason = "expired"
		}
	}
}

func resolvedAs(reason string) change {
	return func(p *toolnexusv1alpha1.PendingRequest) {
		p.Status.Conditions = append(p.Status.Conditions, metav1.Condition{Type: toolnexusv1alpha1.ConditionResolved,
			Status: metav1.ConditionTrue, Reason: reason, LastTransitionTime: resolved})
	}
}

func waiting(p *toolnexusv1alpha1.PendingRequest) {
	p.Status.Conditions = append(p.Status.Conditions, metav1.Condition{Type: toolnexusv1alpha1.ConditionResolved,
		Status: metav1.ConditionFalse, Reason: toolnexusv1alpha1.ReasonAnswerNotConsumed, LastTransitionTime: created})
}

func deleting(p *toolnexusv1alpha1.PendingRequest) { p.DeletionTimestamp = &deleted }

func approvals(entries ...toolnexusv1alpha1.ApprovalEntry) change {
	return func(p *toolnexusv1alpha1.PendingRequest) { p.Status.Approvals = entries }
}

// summary is an event as the table states it: key, time, and the kind-specific fields.
type summary struct {
	Key       string
	Time      time.Time
	Approval  *audit.ApprovalEntry
	Answer    *audit.Answer
	ExpiresAt string
	Why       string
}

func TestOwed(t *testing.T) {
	at := answered.Time
	for _, tc := range []struct {
		name  string
		preq  *toolnexusv1alpha1.PendingRequest
		want  []summary
		final bool
	}{
		{"open", request(waiting), []summary{{Key: "requested", Time: created.Time}}, false},
		{"approval entries, one event per user", request(waiting, approvals(
			toolnexusv1alpha1.ApprovalEntry{User: "alice", OK: true, At: &answered},
			toolnexusv1alpha1.ApprovalEntry{User: "carol", OK: false, Reason: "not now"})),
			[]summary{{Key: "requested", Time: created.Time},
				{Key: "approval/alice", Time: at, Approval: &audit.ApprovalEntry{User: "alice", OK: true, At: &at}},
				{Key: "approval/carol", Approval: &audit.ApprovalEntry{User: "carol", OK: false, Reason: "not now"}}}, false},
		{"answered, not consumed yet", request(answer(true, "alice"), waiting),
			[]summary{{Key: "requested", Time: created.Time},
				{Key: "answered", Time: at, Answer: &audit.Answer{AnsweredBy: "alice", AnsweredAt: &at, OK: true}}}, false},
		{"approved and consumed: executed", request(answer(true, "alice"), resolvedAs(toolnexusv1alpha1.ReasonAnswerConsumed)),
			[]summary{{Key: "requested", Time: created.Time},
				{Key: "answered", Time: at, Answer: &audit.Answer{AnsweredBy: "alice", AnsweredAt: &at, OK: true}},
				{Key: "executed", Time: resolved.Time}}, true},
		{"declined and consumed: nothing executed", request(answer(false, "alice"), resolvedAs(toolnexusv1alpha1.ReasonAnswerConsumed)),
			[]summary{{Key: "requested", Time: created.Time},
				{Key: "answered", Time: at, Answer: &audit.Answer{AnsweredBy: "alice", AnsweredAt: &at}}}, true},
		{"approved, the run ended first: nothing executed", request(answer(true, "alice"), resolvedAs(toolnexusv1alpha1.ReasonRunGone)),
			[]summary{{Key: "requested", Time: created.Time},
				{Key: "answered", Time: at, Answer: &audit.Answer{AnsweredBy: "alice", AnsweredAt: &at, OK: true}}}, true},
		{"expired", request(answer(false, toolnexusv1alpha1.ExpiredAnswerer), resolvedAs(toolnexusv1alpha1.ReasonAnswerConsumed)),
			[]summary{{Key: "requested", Time: created.Time},
				{Key: "expired", Time: at, ExpiresAt: "2026-05-01T10:00:00Z",
					Answer: &audit.Answer{AnsweredBy: toolnexusv1alpha1.ExpiredAnswerer, AnsweredAt: &at, Reason: "expired"}}}, true},
		{"the run ended unanswered", request(resolvedAs(toolnexusv1alpha1.ReasonRunGone)),
			[]summary{{Key: "requested", Time: created.Time}, {Key: "cancelled", Time: resolved.Time, Why: audit.WhyRunGone}}, true},
		{"deleted unanswered", request(waiting, deleting),
			[]summary{{Key: "requested", Time: created.Time}, {Key: "cancelled", Time: deleted.Time, Why: audit.WhyDeleted}}, true},
		{"the run ended unanswered, then deleted: cancelled once, as the run ended", request(resolvedAs(toolnexusv1alpha1.ReasonRunGone), deleting),
			[]summary{{Key: "requested", Time: created.Time}, {Key: "cancelled", Time: resolved.Time, Why: audit.WhyRunGone}}, true},
		{"deleted answered: no cancel", request(answer(true, "alice"), waiting, deleting),
			[]summary{{Key: "requested", Time: created.Time},
				{Key: "answered", Time: at, Answer: &audit.Answer{AnsweredBy: "alice", AnsweredAt: &at, OK: true}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			events := owed(tc.preq)
			var got []summary
			for _, e := range events {
				got = append(got, summary{Key: e.Key(), Time: e.Time, Approval: e.Approval, Answer: e.Answer, ExpiresAt: e.ExpiresAt, Why: e.Why})
				if e.Namespace != "team-a" || e.Run != "buy" || e.Request != "buy-1-call-1" || e.UID != "4b1e" || e.Tool != "buy" ||
					e.RequestKind != "approval" || e.ArgumentsDigest != audit.ArgumentsDigest(`{"item":"gpu"}`) {
					t.Errorf("%s does not name the request, its tool and its arguments' digest: %+v", e.Key(), e)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("owed (-want +got):\n%s", diff)
			}
			if final(tc.preq) != tc.final {
				t.Errorf("final = %t, want %t", !tc.final, tc.final)
			}
		})
	}
}

func TestOwedNamesThePolicyAndTheRequester(t *testing.T) {
	preq := request(func(p *toolnexusv1alpha1.PendingRequest) {
		p.Spec.Policy = &toolnexusv1alpha1.PolicyReference{Name: "prod-changes", Generation: 4}
		p.Spec.RequestedBy = "erin"
	})
	e := owed(preq)[0]
	if diff := cmp.Diff(&audit.Policy{Name: "prod-changes", Generation: 4}, e.Policy); diff != "" || e.RequestedBy != "erin" {
		t.Errorf("policy (-want +got):\n%s\nrequestedBy %q", diff, e.RequestedBy)
	}
	if own := owed(request())[0]; own.Policy != nil {
		t.Errorf("a request of no policy names one: %+v", own.Policy)
	}
}

func TestNext(t *testing.T) {
	events := owed(request(answer(true, "alice"), resolvedAs(toolnexusv1alpha1.ReasonAnswerConsumed)))
	for _, tc := range []struct {
		delivered []string
		want      string
	}{
		{nil, "requested"},
		{[]string{"requested"}, "answered"},
		{[]string{"answered"}, "requested"},
		{[]string{"requested", "answered"}, "executed"},
		{[]string{"requested", "answered", "executed"}, ""},
	} {
		got := ""
		if e := next(events, tc.delivered); e != nil {
			got = e.Key()
		}
		if got != tc.want {
			t.Errorf("next after %v = %q, want %q", tc.delivered, got, tc.want)
		}
	}
	if got := undelivered(events, []string{"answered"}); !cmp.Equal(got, []string{"requested", "executed"}) {
		t.Errorf("undelivered = %v", got)
	}
}

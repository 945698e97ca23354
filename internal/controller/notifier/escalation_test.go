package notifier

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/notify"
)

const escalatedEvent = toolnexusv1alpha1.NotifyEscalated

var opensAt = time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)

// escalatingRequest opened at opensAt, approved by alice, with steps after 30m (adds group
// sre-leads, tells sink "pager"), 1h (adds nobody, tells nobody) and 2h (adds user carol and
// group sre-leads again, tells "chat" and "pager-2"). Its run's sink is also named "pager".
func escalatingRequest(records ...toolnexusv1alpha1.EscalationRecord) *toolnexusv1alpha1.PendingRequest {
	return &toolnexusv1alpha1.PendingRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "r-1-call-1", Namespace: "team-a", UID: "4b1e", CreationTimestamp: metav1.NewTime(opensAt)},
		Spec: toolnexusv1alpha1.PendingRequestSpec{
			RunRef:    toolnexusv1alpha1.RunReference{Name: "r"},
			ToolCall:  toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "delete_db", Arguments: `{"db":"prod"}`},
			Request:   toolnexusv1alpha1.Request{ID: "g", Kind: "approval", Prompt: "Delete prod?"},
			Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice"}},
			Notify:    []toolnexusv1alpha1.NotifySink{{Name: "pager"}},
			Policy:    &toolnexusv1alpha1.PolicyReference{Name: "prod-changes", Generation: 3},
			Escalation: []toolnexusv1alpha1.EscalationStep{
				{After: metav1.Duration{Duration: 30 * time.Minute}, Approvers: &toolnexusv1alpha1.Approvers{Groups: []string{"sre-leads"}},
					Notify: []toolnexusv1alpha1.NotifySink{{Name: "pager"}}},
				{After: metav1.Duration{Duration: time.Hour}},
				{After: metav1.Duration{Duration: 2 * time.Hour}, Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"carol"}, Groups: []string{"sre-leads"}},
					Notify: []toolnexusv1alpha1.NotifySink{{Name: "chat"}, {Name: "pager-2"}}},
			},
		},
		Status: toolnexusv1alpha1.PendingRequestStatus{Escalations: records},
	}
}

func applied(step int32, after time.Duration) toolnexusv1alpha1.EscalationRecord {
	return toolnexusv1alpha1.EscalationRecord{Step: step, Time: metav1.NewTime(opensAt.Add(after))}
}

func TestDueSteps(t *testing.T) {
	answered := escalatingRequest()
	answered.Status.Answer = &toolnexusv1alpha1.Answer{OK: true}
	cancelled := escalatingRequest()
	cancelled.Status.Conditions = []metav1.Condition{{Type: toolnexusv1alpha1.ConditionResolved, Status: metav1.ConditionTrue, Reason: toolnexusv1alpha1.ReasonRunGone}}
	consuming := escalatingRequest() // open, the run has not consumed an answer: still undecided
	consuming.Status.Conditions = []metav1.Condition{{Type: toolnexusv1alpha1.ConditionResolved, Status: metav1.ConditionFalse, Reason: toolnexusv1alpha1.ReasonAnswerNotConsumed}}
	expiring := escalatingRequest()
	expiring.Spec.Request.ExpiresAt = opensAt.Add(90 * time.Minute).Format(time.RFC3339)
	unordered := escalatingRequest()
	unordered.Spec.Escalation[1].After.Duration = 10 * time.Minute // after step 0's, still second
	for _, tc := range []struct {
		name     string
		preq     *toolnexusv1alpha1.PendingRequest
		at       time.Duration
		wantDue  []int32
		wantNext time.Duration // -1: none
	}{
		{"before the first step: none, wake at it", escalatingRequest(), 10 * time.Minute, nil, 30 * time.Minute},
		{"at the first step's time: it applies", escalatingRequest(), 30 * time.Minute, []int32{0}, time.Hour},
		{"applied already: not again", escalatingRequest(applied(0, 30*time.Minute)), 40 * time.Minute, nil, time.Hour},
		{"down past two steps: both, in order", escalatingRequest(), 90 * time.Minute, []int32{0, 1}, 2 * time.Hour},
		{"only the second recorded: the first still applies, the second not again",
			escalatingRequest(applied(1, time.Hour)), 90 * time.Minute, []int32{0}, 2 * time.Hour},
		{"every step applied", escalatingRequest(applied(0, 30*time.Minute), applied(1, time.Hour), applied(2, 2*time.Hour)), 3 * time.Hour, nil, -1},
		{"answered: none, ever", answered, 3 * time.Hour, nil, -1},
		{"answered before the first: no wake", answered, time.Minute, nil, -1},
		{"the run gave the request up: none", cancelled, 3 * time.Hour, nil, -1},
		{"an answer not consumed yet is no decision", consuming, 30 * time.Minute, []int32{0}, time.Hour},
		{"a step after the expiry is never woken for", expiring, 80 * time.Minute, []int32{0, 1}, -1},
		{"past the expiry: none, though due", expiring, 100 * time.Minute, nil, -1},
		{"in order: a step waits for the one before", unordered, 20 * time.Minute, nil, 30 * time.Minute},
		{"in order: then both", unordered, 30 * time.Minute, []int32{0, 1}, 2 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			due, next := dueSteps(tc.preq, opensAt.Add(tc.at))
			if diff := cmp.Diff(tc.wantDue, due); diff != "" {
				t.Errorf("due (-want +got):\n%s", diff)
			}
			var wantNext time.Time
			if tc.wantNext >= 0 {
				wantNext = opensAt.Add(tc.wantNext)
			}
			if !next.Equal(wantNext) {
				t.Errorf("next = %s, want %s", next, wantNext)
			}
		})
	}
}

func TestApplyStepsThenOwed(t *testing.T) {
	preq := escalatingRequest()
	now := opensAt.Add(90 * time.Minute)
	due, _ := dueSteps(preq, now)
	applySteps(preq, due, now)
	want := []toolnexusv1alpha1.EscalationRecord{{Step: 0, Time: metav1.NewTime(now)}, {Step: 1, Time: metav1.NewTime(now)}}
	if diff := cmp.Diff(want, preq.Status.Escalations); diff != "" {
		t.Errorf("escalations (-want +got):\n%s", diff)
	}
	if again, _ := dueSteps(preq, now); len(again) != 0 {
		t.Errorf("steps %v apply again once recorded", again)
	}
}

func TestEscalationDeliveries(t *testing.T) {
	delivered := toolnexusv1alpha1.NotificationDelivered
	for _, tc := range []struct {
		name string
		preq *toolnexusv1alpha1.PendingRequest
		want []string
	}{
		{"no step applied: only the run's sink", escalatingRequest(), []string{"pager/Opened"}},
		{"a step applied: its sink, beside the run's sink of the same name",
			escalatingRequest(applied(0, 30*time.Minute)), []string{"pager/Opened", "pager/Escalated"}},
		{"the run's sink busy with its answer does not hold the step's",
			withAnswer(escalatingRequest(applied(0, 30*time.Minute)), sinkRecord("pager", opened, delivered)),
			[]string{"pager/Answered", "pager/Escalated"}},
		{"a step with no sinks owes nothing; the next one's sinks each get theirs",
			escalatingRequest(applied(0, 30*time.Minute), applied(1, time.Hour), applied(2, 2*time.Hour)),
			[]string{"pager/Opened", "pager/Escalated", "chat/Escalated", "pager-2/Escalated"}},
		{"a step's sink delivered before a restart is not sent again; the other is",
			withRecords(escalatingRequest(applied(0, 30*time.Minute), applied(1, time.Hour), applied(2, 2*time.Hour)),
				sinkRecord("pager", opened, delivered), sinkRecord("pager", escalatedEvent, delivered), sinkRecord("chat", escalatedEvent, delivered)),
			[]string{"pager-2/Escalated"}},
		{"a step given up on is finished too",
			withRecords(escalatingRequest(applied(0, 30*time.Minute)), sinkRecord("pager", opened, delivered),
				sinkRecord("pager", escalatedEvent, toolnexusv1alpha1.NotificationFailed)), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, d := range due(tc.preq) {
				got = append(got, d.sink.Name+"/"+string(d.event))
				if (d.event == escalatedEvent) != (d.step != nil) {
					t.Errorf("%s/%s: step %v", d.sink.Name, d.event, d.step)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("due (-want +got):\n%s", diff)
			}
		})
	}
}

func withRecords(p *toolnexusv1alpha1.PendingRequest, records ...toolnexusv1alpha1.NotificationRecord) *toolnexusv1alpha1.PendingRequest {
	p.Status.Notifications = append(p.Status.Notifications, records...)
	return p
}

func withAnswer(p *toolnexusv1alpha1.PendingRequest, records ...toolnexusv1alpha1.NotificationRecord) *toolnexusv1alpha1.PendingRequest {
	p.Status.Answer, p.Status.AnsweredBy = &toolnexusv1alpha1.Answer{OK: true}, "alice"
	return withRecords(p, records...)
}

func TestEscalatedMessage(t *testing.T) {
	preq := escalatingRequest(applied(0, 30*time.Minute), applied(1, time.Hour), applied(2, 2*time.Hour))
	// Answered after the last step applied, before its sinks took it: the message is the step's.
	preq.Status.Answer, preq.Status.AnsweredBy = &toolnexusv1alpha1.Answer{OK: true}, "carol"
	var got []notify.Message
	for _, d := range due(preq) {
		if d.step != nil {
			got = append(got, messageOf(preq, d))
		}
	}
	base := notify.Message{Event: notify.Escalated, Namespace: "team-a", Name: "r-1-call-1", UID: "4b1e", Run: "r",
		Kind: "approval", Prompt: "Delete prod?", Tool: "delete_db", Arguments: `{"db":"prod"}`, Policy: "prod-changes"}
	first := base
	first.Time, first.Users, first.Groups = opensAt.Add(30*time.Minute), []string{"alice"}, []string{"sre-leads"}
	first.Escalation = &notify.Escalation{Step: 0, Steps: 3, After: 30 * time.Minute, Groups: []string{"sre-leads"}}
	last := base
	last.Time, last.Users, last.Groups = opensAt.Add(2*time.Hour), []string{"alice", "carol"}, []string{"sre-leads"}
	last.Escalation = &notify.Escalation{Step: 2, Steps: 3, After: 2 * time.Hour, Users: []string{"carol"}, Groups: []string{"sre-leads"}}
	if diff := cmp.Diff([]notify.Message{first, last, last}, got); diff != "" {
		t.Errorf("messages (-want +got):\n%s", diff)
	}
}

func TestMayApproveAt(t *testing.T) {
	preq := escalatingRequest()
	preq.Spec.Escalation[1].Approvers = &toolnexusv1alpha1.Approvers{Users: []string{"bob"}}
	preq.Spec.Escalation[1].After.Duration = 20 * time.Minute // due before step 0: the API server admits bob first
	for _, tc := range []struct {
		step          int
		users, groups []string
	}{
		{0, []string{"alice", "bob"}, []string{"sre-leads"}},
		{1, []string{"alice", "bob"}, nil},
		{2, []string{"alice", "bob", "carol"}, []string{"sre-leads"}},
	} {
		users, groups := mayApproveAt(preq, tc.step)
		if diff := cmp.Diff([2][]string{tc.users, tc.groups}, [2][]string{users, groups}); diff != "" {
			t.Errorf("step %d (-want +got):\n%s", tc.step, diff)
		}
	}
	open := escalatingRequest()
	open.Spec.Approvers = nil
	if users, groups := mayApproveAt(open, 2); users != nil || groups != nil {
		t.Errorf("a request anyone may answer names %v %v after its step", users, groups)
	}
}

func TestNotifiedWithoutRunSinks(t *testing.T) {
	preq := escalatingRequest()
	preq.Spec.Notify = nil
	setNotified(preq, opensAt, func(delivery) attemptState { return attemptState{} })
	if c := meta.FindStatusCondition(preq.Status.Conditions, toolnexusv1alpha1.ConditionNotified); c != nil {
		t.Errorf("Notified %+v on a request with no sink owed anything", c)
	}
	preq.Status.Escalations = []toolnexusv1alpha1.EscalationRecord{applied(0, 30*time.Minute)}
	setNotified(preq, opensAt, func(delivery) attemptState { return attemptState{} })
	c := meta.FindStatusCondition(preq.Status.Conditions, toolnexusv1alpha1.ConditionNotified)
	if c == nil || c.Status != metav1.ConditionUnknown || c.Message != "delivering Escalated to sink pager" {
		t.Errorf("Notified = %+v, want Unknown delivering Escalated to sink pager", c)
	}
}

func TestOwnNamespace(t *testing.T) {
	t.Setenv("POD_NAMESPACE", " toolnexus-system\n")
	if got := OwnNamespace(); got != "toolnexus-system" {
		t.Errorf("OwnNamespace() = %q with POD_NAMESPACE set, want toolnexus-system", got)
	}
}

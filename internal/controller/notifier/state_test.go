package notifier

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

const (
	opened   = toolnexusv1alpha1.NotifyOpened
	answered = toolnexusv1alpha1.NotifyAnswered
	expired  = toolnexusv1alpha1.NotifyExpired
)

func sinkRecord(sink string, ev toolnexusv1alpha1.NotifyEvent, o toolnexusv1alpha1.NotificationOutcome) toolnexusv1alpha1.NotificationRecord {
	return toolnexusv1alpha1.NotificationRecord{Sink: sink, Event: ev, Outcome: o, Attempts: 1}
}

// notifiedRequest has sinks "all" (every event) and "answers" (on: [Answered]).
func notifiedRequest(answer *toolnexusv1alpha1.Answer, answeredBy string, records ...toolnexusv1alpha1.NotificationRecord) *toolnexusv1alpha1.PendingRequest {
	return &toolnexusv1alpha1.PendingRequest{
		Spec: toolnexusv1alpha1.PendingRequestSpec{Notify: []toolnexusv1alpha1.NotifySink{
			{Name: "all"}, {Name: "answers", On: []toolnexusv1alpha1.NotifyEvent{answered}},
		}},
		Status: toolnexusv1alpha1.PendingRequestStatus{Answer: answer, AnsweredBy: answeredBy, Notifications: records},
	}
}

func TestDueNotifications(t *testing.T) {
	ok := &toolnexusv1alpha1.Answer{OK: true}
	timedOut := &toolnexusv1alpha1.Answer{Reason: "expired"}
	delivered, failed := toolnexusv1alpha1.NotificationDelivered, toolnexusv1alpha1.NotificationFailed
	for _, tc := range []struct {
		name string
		preq *toolnexusv1alpha1.PendingRequest
		want []string
	}{
		{"open: Opened to the sinks that want it", notifiedRequest(nil, ""), []string{"all/Opened"}},
		{"open, delivered: nothing", notifiedRequest(nil, "", sinkRecord("all", opened, delivered)), nil},
		{"answered before Opened went out: Opened first, the answer to the sink that wants only it",
			notifiedRequest(ok, "alice"), []string{"all/Opened", "answers/Answered"}},
		{"answered after Opened went out", notifiedRequest(ok, "alice", sinkRecord("all", opened, delivered)),
			[]string{"all/Answered", "answers/Answered"}},
		{"expired: Expired, and nothing to a sink on [Answered]",
			notifiedRequest(timedOut, toolnexusv1alpha1.ExpiredAnswerer, sinkRecord("all", opened, delivered)), []string{"all/Expired"}},
		{"a sink given up on still gets the next event",
			notifiedRequest(ok, "alice", sinkRecord("all", opened, failed), sinkRecord("answers", answered, delivered)), []string{"all/Answered"}},
		{"everything finished", notifiedRequest(ok, "alice", sinkRecord("all", opened, delivered),
			sinkRecord("all", answered, delivered), sinkRecord("answers", answered, failed)), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, d := range due(tc.preq) {
				got = append(got, d.sink.Name+"/"+string(d.event))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("due (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSetNotified(t *testing.T) {
	delivered := toolnexusv1alpha1.NotificationDelivered
	gaveUp := toolnexusv1alpha1.NotificationRecord{Sink: "all", Event: opened, Outcome: toolnexusv1alpha1.NotificationFailed,
		Reason: toolnexusv1alpha1.ReasonSecretNotFound, Attempts: 10, Message: `Secret "hook" has no key "url"`}
	for _, tc := range []struct {
		name    string
		preq    *toolnexusv1alpha1.PendingRequest
		pending attemptState
		want    metav1.Condition
	}{
		{"nothing finished yet", notifiedRequest(nil, ""), attemptState{},
			metav1.Condition{Status: metav1.ConditionUnknown, Reason: toolnexusv1alpha1.ReasonDelivering, Message: "delivering Opened to sink all"}},
		{"retrying, saying why", notifiedRequest(nil, ""), attemptState{attempts: 2, lastError: "the sink answered HTTP 503 Service Unavailable"},
			metav1.Condition{Status: metav1.ConditionUnknown, Reason: toolnexusv1alpha1.ReasonDelivering,
				Message: "delivering Opened to sink all (attempt 2 failed: the sink answered HTTP 503 Service Unavailable)"}},
		{"every owed event delivered", notifiedRequest(nil, "", sinkRecord("all", opened, delivered)), attemptState{},
			metav1.Condition{Status: metav1.ConditionTrue, Reason: toolnexusv1alpha1.ReasonNotificationsDelivered, Message: "Every sink took every event so far"}},
		{"an answer is owed again", notifiedRequest(&toolnexusv1alpha1.Answer{OK: true}, "alice", sinkRecord("all", opened, delivered)), attemptState{},
			metav1.Condition{Status: metav1.ConditionUnknown, Reason: toolnexusv1alpha1.ReasonDelivering,
				Message: "delivering Answered to sink all; delivering Answered to sink answers"}},
		{"given up: False with the failure's reason, naming the sink", notifiedRequest(nil, "", gaveUp), attemptState{},
			metav1.Condition{Status: metav1.ConditionFalse, Reason: toolnexusv1alpha1.ReasonSecretNotFound,
				Message: `sink all gave up on Opened after 10 attempts: Secret "hook" has no key "url"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)
			setNotified(tc.preq, at, func(delivery) attemptState { return tc.pending })
			got := meta.FindStatusCondition(tc.preq.Status.Conditions, toolnexusv1alpha1.ConditionNotified)
			if got == nil {
				t.Fatal("no Notified condition")
			}
			if !got.LastTransitionTime.Time.Equal(at) {
				t.Errorf("lastTransitionTime %s, want the reconciler's clock %s", got.LastTransitionTime, at)
			}
			if diff := cmp.Diff(tc.want, metav1.Condition{Status: got.Status, Reason: got.Reason, Message: got.Message}); diff != "" {
				t.Errorf("Notified (-want +got):\n%s", diff)
			}
		})
	}
}

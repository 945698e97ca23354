package notifier

import (
	"fmt"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/kube"
)

// What a request's sinks are owed is derived from the request alone: the events that happened
// (it exists: Opened; it holds an answer: Answered, or Expired when the manager wrote it; an
// escalation step is recorded in status.escalations: Escalated, to that step's sinks), the
// events each sink subscribed to, and status.notifications, the deliveries the manager finished.
// Everything else (attempts, the next attempt's time, a result not yet written) is kept in
// memory and may be lost: after a restart the owed events are sent again (at least once; the
// CloudEvent id is stable).

// delivery is one event owed to one sink of one request.
type delivery struct {
	sink  *toolnexusv1alpha1.NotifySink
	event toolnexusv1alpha1.NotifyEvent
	// step is the escalation step whose sink this is (event Escalated); nil for spec.notify's.
	step *toolnexusv1alpha1.EscalationRecord
}

// happened lists the events of preq so far, in the order they happen.
func happened(preq *toolnexusv1alpha1.PendingRequest) []toolnexusv1alpha1.NotifyEvent {
	out := []toolnexusv1alpha1.NotifyEvent{toolnexusv1alpha1.NotifyOpened}
	switch {
	case preq.Status.Answer == nil:
	case preq.Status.AnsweredBy == toolnexusv1alpha1.ExpiredAnswerer:
		out = append(out, toolnexusv1alpha1.NotifyExpired)
	default:
		out = append(out, toolnexusv1alpha1.NotifyAnswered)
	}
	return out
}

// owed lists the events that happened and a sink subscribed to, per sink of spec.notify in spec
// order, then the Escalated events of the steps applied.
func owed(preq *toolnexusv1alpha1.PendingRequest) []delivery {
	var out []delivery
	for i := range preq.Spec.Notify {
		sink := &preq.Spec.Notify[i]
		for _, ev := range happened(preq) {
			if subscribed(sink, ev) {
				out = append(out, delivery{sink: sink, event: ev})
			}
		}
	}
	return append(out, escalations(preq)...)
}

func subscribed(sink *toolnexusv1alpha1.NotifySink, ev toolnexusv1alpha1.NotifyEvent) bool {
	if len(sink.On) == 0 {
		return true // the API default: every event
	}
	for _, on := range sink.On {
		if on == ev {
			return true
		}
	}
	return false
}

// recordOf is the finished delivery of ev to sink in preq's status, or nil.
func recordOf(preq *toolnexusv1alpha1.PendingRequest, sink string, ev toolnexusv1alpha1.NotifyEvent) *toolnexusv1alpha1.NotificationRecord {
	for i, rec := range preq.Status.Notifications {
		if rec.Sink == sink && rec.Event == ev {
			return &preq.Status.Notifications[i]
		}
	}
	return nil
}

// due lists the owed deliveries not finished yet. A sink of spec.notify gets its events in order:
// an answer is sent once the sink's Opened is finished. An escalation's sink has one event only,
// and may share its name with one of spec.notify (its records differ by event).
func due(preq *toolnexusv1alpha1.PendingRequest) []delivery {
	var out []delivery
	blocked := map[string]bool{}
	for _, d := range owed(preq) {
		if recordOf(preq, d.sink.Name, d.event) != nil {
			continue
		}
		if d.step != nil || !blocked[d.sink.Name] {
			out = append(out, d)
		}
		if d.step == nil {
			blocked[d.sink.Name] = true
		}
	}
	return out
}

// attemptState is what this process knows of a delivery that is not finished in status.
type attemptState struct {
	running  bool
	attempts int
	// next is when the next attempt may start.
	next time.Time
	// lastError says why the last attempt failed.
	lastError string
	// done is the finished delivery, until it is written to status.
	done *toolnexusv1alpha1.NotificationRecord
}

// attemptKey names a delivery across the process: the request (by UID, so a request deleted and
// created again under its name starts afresh), the sink and the event.
type attemptKey struct {
	uid   types.UID
	sink  string
	event toolnexusv1alpha1.NotifyEvent
}

// jobKey is the executor key of a delivery: distinct from every run's key.
func (k attemptKey) jobKey() string {
	return fmt.Sprintf("notify/%s/%s/%s", k.uid, k.sink, k.event)
}

// attempts holds the attempt states of every request, and wakes a request when an attempt ends.
type attempts struct {
	mu     sync.Mutex
	byName map[types.NamespacedName]map[attemptKey]*attemptState
	wake   chan event.GenericEvent
}

func newAttempts() *attempts {
	return &attempts{byName: map[types.NamespacedName]map[attemptKey]*attemptState{}, wake: make(chan event.GenericEvent, 1024)}
}

// snapshot returns a copy of the state of key, creating it when absent.
func (a *attempts) snapshot(name types.NamespacedName, key attemptKey) attemptState {
	a.mu.Lock()
	defer a.mu.Unlock()
	return *a.get(name, key)
}

func (a *attempts) get(name types.NamespacedName, key attemptKey) *attemptState {
	m := a.byName[name]
	if m == nil {
		m = map[attemptKey]*attemptState{}
		a.byName[name] = m
	}
	st := m[key]
	if st == nil {
		st = &attemptState{}
		m[key] = st
	}
	return st
}

// update changes the state of key under the lock.
func (a *attempts) update(name types.NamespacedName, key attemptKey, f func(*attemptState)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(a.get(name, key))
}

// settled drops the states of deliveries that status records as finished.
func (a *attempts) settled(name types.NamespacedName, keys []attemptKey) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, k := range keys {
		if st := a.byName[name][k]; st != nil && !st.running {
			delete(a.byName[name], k)
		}
	}
	if len(a.byName[name]) == 0 {
		delete(a.byName, name)
	}
}

// recorded lists the deliveries status records as finished.
func recorded(preq *toolnexusv1alpha1.PendingRequest) []attemptKey {
	out := make([]attemptKey, 0, len(preq.Status.Notifications))
	for _, rec := range preq.Status.Notifications {
		out = append(out, attemptKey{uid: preq.UID, sink: rec.Sink, event: rec.Event})
	}
	return out
}

// forget drops every state of a request that is gone and returns the keys of its running jobs.
func (a *attempts) forget(name types.NamespacedName) []attemptKey {
	a.mu.Lock()
	defer a.mu.Unlock()
	var running []attemptKey
	for k, st := range a.byName[name] {
		if st.running {
			running = append(running, k)
		}
	}
	delete(a.byName, name)
	return running
}

// setNotified sets the request's Notified condition from its finished deliveries and, for the
// others, from what this process last saw of them: False once a delivery was given up on (a
// message naming the sink and why), True when every owed event was delivered, else Unknown.
func setNotified(preq *toolnexusv1alpha1.PendingRequest, now time.Time, pending func(delivery) attemptState) {
	owes := owed(preq)
	if len(preq.Spec.Notify) == 0 && len(owes) == 0 {
		return // no sinks until an escalation step with some applies: nobody to have told
	}
	var failed, waiting []string
	failReason := toolnexusv1alpha1.ReasonNotificationFailed
	for _, d := range owes {
		rec := recordOf(preq, d.sink.Name, d.event)
		switch {
		case rec != nil && rec.Outcome == toolnexusv1alpha1.NotificationFailed:
			if len(failed) == 0 && rec.Reason != "" {
				failReason = rec.Reason
			}
			failed = append(failed, fmt.Sprintf("sink %s gave up on %s after %d attempts: %s", d.sink.Name, d.event, rec.Attempts, rec.Message))
		case rec != nil:
		default:
			st := pending(d)
			msg := fmt.Sprintf("delivering %s to sink %s", d.event, d.sink.Name)
			if st.lastError != "" {
				msg += fmt.Sprintf(" (attempt %d failed: %s)", st.attempts, st.lastError)
			}
			waiting = append(waiting, msg)
		}
	}
	switch {
	case len(failed) > 0:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionNotified, metav1.ConditionFalse, failReason, joinBounded(failed))
	case len(waiting) > 0:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionNotified, metav1.ConditionUnknown, toolnexusv1alpha1.ReasonDelivering, joinBounded(waiting))
	default:
		kube.SetCondition(preq, now, toolnexusv1alpha1.ConditionNotified, metav1.ConditionTrue, toolnexusv1alpha1.ReasonNotificationsDelivered,
			"Every sink took every event so far")
	}
}

// joinBounded joins condition messages, within the bound of a condition message.
func joinBounded(msgs []string) string {
	return clip.Marked(strings.Join(msgs, "; "), 1024)
}

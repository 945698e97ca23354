package notifier

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/controller/metrics"
	"github.com/toolnexus/operator/internal/executor"
	"github.com/toolnexus/operator/internal/kube"
	"github.com/toolnexus/operator/internal/notify"
	"github.com/toolnexus/operator/internal/tools"
)

// EventNotificationFailed marks a sink given up on, on the PendingRequest.
const EventNotificationFailed = "NotificationFailed"

// EventEscalated marks an escalation step applied, on the PendingRequest.
const EventEscalated = "Escalated"

// Reconciler tells the sinks of a PendingRequest's spec.notify that it opened, was answered
// or expired, and applies the request's escalation steps, telling each step's sinks. It never
// touches a run: each attempt is a job of the runs' executor (share: the namespace; key: the
// request, sink and event), so a slow sink holds one slot of its namespace for at most one
// attempt's timeout and never a run's key, and the wait between attempts holds nothing but a
// requeue. What is finished is recorded in status.notifications and the Notified
// condition, the steps applied in status.escalations.
type Reconciler struct {
	client.Client
	// APIReader reads the sinks' Secrets around the cache.
	APIReader  client.Reader
	Recorder   events.EventRecorder
	Clock      clock.PassiveClock
	HTTPClient *http.Client
	Metrics    *metrics.Metrics
	// Executor is the runs' executor (agentrun.Reconciler.Executor).
	Executor *executor.Executor
	// RequireSecretLabel lets sinks read only Secrets labelled toolnexus.dev/agentrun-access=true.
	RequireSecretLabel bool
	// SecretNamespace is the manager's own namespace, where the sinks of an escalation step (a
	// policy's, which a cluster admin wrote) read their Secrets: never the request's, where a
	// tenant who may edit Secrets would choose where a platform's pager goes and what it is sent.
	// Empty: such a sink gives up, saying so. The sinks of spec.notify (the run's) read the
	// request's namespace.
	SecretNamespace string
	// Policy bounds the attempts of a delivery; zero fields take notify.DefaultPolicy's.
	Policy notify.Policy

	attempts *attempts
}

// Why each permission is there:
//   - pendingrequests get/list/watch: requests are the notifier's work queue.
//   - pendingrequests/status patch: status.notifications, status.escalations and the Notified
//     condition. The admission policy toolnexus-status-owner lets only holders of the custom verb
//     "manage" (config/rbac status_owner_role.yaml, bound to the manager) write status beyond the
//     answer, so no answerer can mark an event delivered that was not, or a step applied.
//   - secrets get: a sink's urlFrom and header valueFrom, read at every attempt (a policy's sinks
//     in the manager's own namespace).
//   - events create/patch: NotificationFailed and Escalated on the request (granted with the run
//     controller's).
//
// +kubebuilder:rbac:groups=toolnexus.dev,resources=pendingrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=toolnexus.dev,resources=pendingrequests/status,verbs=get;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get

// Reconcile records the escalation steps that apply, starts the attempts that are due, writes
// the deliveries that finished, and sets the Notified condition.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	preq := &toolnexusv1alpha1.PendingRequest{}
	if err := r.Get(ctx, req.NamespacedName, preq); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !hasWork(preq) || !preq.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	now := r.Clock.Now()
	steps, nextStep := dueSteps(preq, now)
	if len(steps) > 0 {
		// Saved before any sink of theirs is told: what a restart finds recorded is never
		// applied again, and its sinks are owed their event until status records it.
		if saved, res, err := r.escalate(ctx, preq, steps, now); !saved {
			return res, err
		}
	}
	before := preq.DeepCopy()
	// What status records is finished for good; until the cache shows it, the result stays here.
	r.attempts.settled(req.NamespacedName, recorded(preq))
	var wake time.Time
	for _, d := range due(preq) {
		key := attemptKey{uid: preq.UID, sink: d.sink.Name, event: d.event}
		st := r.attempts.snapshot(req.NamespacedName, key)
		switch {
		case st.running:
		case st.done != nil:
			preq.Status.Notifications = append(preq.Status.Notifications, *st.done)
		case now.Before(st.next):
			if wake.IsZero() || st.next.Before(wake) {
				wake = st.next
			}
		case !r.start(ctx, preq, d, key):
			wake = now.Add(time.Second) // the executor still holds the last attempt's key
		}
	}
	setNotified(preq, now, func(d delivery) attemptState {
		return r.attempts.snapshot(req.NamespacedName, attemptKey{uid: preq.UID, sink: d.sink.Name, event: d.event})
	})
	if !equality.Semantic.DeepEqual(before.Status, preq.Status) {
		// The run's controller writes the same conditions list, without a lock (its patches carry
		// Answered and Resolved whole): this lock keeps the notifier's stale copy from dropping
		// them, and the notifier re-asserts Notified whenever one of the run's patches drops it.
		written, res, err := kube.PatchLocked(ctx, r.Client, preq, before, true, "recording the notifications of PendingRequest "+preq.Name)
		if !written {
			return res, err
		}
		for _, rec := range preq.Status.Notifications[len(before.Status.Notifications):] {
			if rec.Outcome == toolnexusv1alpha1.NotificationFailed {
				r.Recorder.Eventf(preq, nil, corev1.EventTypeWarning, EventNotificationFailed, "Notify",
					"Sink %s gave up on %s after %d attempts: %s", rec.Sink, rec.Event, rec.Attempts, rec.Message)
			}
		}
	}
	if !nextStep.IsZero() && (wake.IsZero() || nextStep.Before(wake)) {
		wake = nextStep
	}
	return kube.RequeueAt(wake, now), nil
}

// escalate records steps as applied at now, and marks each on the request. Once saved, preq is
// the object written; else the result and error are the reconcile's.
func (r *Reconciler) escalate(ctx context.Context, preq *toolnexusv1alpha1.PendingRequest, steps []int32, now time.Time) (bool, ctrl.Result, error) {
	before := preq.DeepCopy()
	applySteps(preq, steps, now)
	// The lock: a step is never recorded over an answer this (cached) copy does not show.
	written, res, err := kube.PatchLocked(ctx, r.Client, preq, before, true, "recording the escalation of PendingRequest "+preq.Name)
	if !written {
		return false, res, err
	}
	for _, i := range steps {
		step := preq.Spec.Escalation[i]
		told := "no sinks"
		if len(step.Notify) > 0 {
			var names []string
			for _, s := range step.Notify {
				names = append(names, s.Name)
			}
			told = "sinks " + strings.Join(names, ", ")
		}
		joined := ""
		if a := step.Approvers; a != nil && len(a.Users)+len(a.Groups) > 0 {
			joined = "; its approvers may approve too"
		}
		r.Recorder.Eventf(preq, nil, corev1.EventTypeNormal, EventEscalated, "Escalate",
			"Undecided after %s: applied spec.escalation[%d] of %s%s; telling %s", step.After.Duration, i, policyName(preq), joined, told)
	}
	return true, ctrl.Result{}, nil
}

// start submits one attempt of d; false when the executor still runs the previous one.
func (r *Reconciler) start(ctx context.Context, preq *toolnexusv1alpha1.PendingRequest, d delivery, key attemptKey) bool {
	name := client.ObjectKeyFromObject(preq)
	sink, msg := *d.sink.DeepCopy(), messageOf(preq, d)
	secrets := sinkSecrets{namespace: preq.Namespace, what: "spec.notify[" + sink.Name + "]"}
	if d.step != nil {
		secrets = sinkSecrets{namespace: r.SecretNamespace, policy: true,
			what: fmt.Sprintf("spec.escalation[%d].notify[%s]", d.step.Step, sink.Name)}
	}
	log := ctrl.LoggerFrom(ctx).WithValues("sink", sink.Name, "event", d.event)
	r.attempts.update(name, key, func(st *attemptState) { st.running = true })
	woken := &toolnexusv1alpha1.PendingRequest{ObjectMeta: metav1.ObjectMeta{Name: name.Name, Namespace: name.Namespace}}
	ok := r.Executor.Submit(executor.Job{Key: key.jobKey(), Share: preq.Namespace, Run: func(jobCtx context.Context) {
		res, reason := r.attempt(jobCtx, secrets, sink, msg)
		if jobCtx.Err() != nil {
			// Stopped, not failed: the request is gone or the manager stops (the next leader sends
			// what status does not record as finished).
			r.attempts.update(name, key, func(st *attemptState) { st.running = false })
			return
		}
		r.finish(name, key, sink, res, reason, log)
	}, Done: func(ctx context.Context) {
		// Once the key is free: the reconcile it wakes may submit the next attempt at once.
		kube.Wake(ctx, r.attempts.wake, woken)
	}})
	if !ok {
		r.attempts.update(name, key, func(st *attemptState) { st.running = false })
	}
	return ok
}

// attempt sends msg to sink once. reason is the condition reason of a failure.
func (r *Reconciler) attempt(ctx context.Context, secrets sinkSecrets, sink toolnexusv1alpha1.NotifySink, msg notify.Message) (notify.Result, string) {
	target, header, err := r.resolveSink(ctx, secrets, sink)
	var missing *kube.MissingSecretError
	switch {
	case errors.As(err, &missing):
		// The Secret may yet be created: try again on the schedule, saying which Secret is missing.
		return notify.Result{Retry: true, Err: err}, missing.Reason
	case errors.Is(err, errNoSecretNamespace):
		return notify.Result{Err: err}, toolnexusv1alpha1.ReasonNotificationFailed
	case err != nil:
		return notify.Result{Retry: true, Err: err}, toolnexusv1alpha1.ReasonNotificationFailed
	}
	if !strings.HasPrefix(target, "http://") && !strings.HasPrefix(target, "https://") {
		return notify.Result{Err: fmt.Errorf("the URL in Secret %q key %q must start with http:// or https://",
			sink.URLFrom.SecretKeyRef.Name, sink.URLFrom.SecretKeyRef.Key)}, toolnexusv1alpha1.ReasonNotificationFailed
	}
	contentType, body, err := payload(sink.Format, msg)
	if err != nil {
		return notify.Result{Err: err}, toolnexusv1alpha1.ReasonNotificationFailed
	}
	return notify.Post(ctx, r.HTTPClient, target, header, contentType, body, r.Policy.Timeout), toolnexusv1alpha1.ReasonNotificationFailed
}

// resolveSink reads the sink's URL and header values; Secret values live for this attempt only.
func (r *Reconciler) resolveSink(ctx context.Context, secrets sinkSecrets, sink toolnexusv1alpha1.NotifySink) (string, http.Header, error) {
	target := sink.URL
	if sink.URLFrom != nil {
		var err error
		if target, err = r.readSecret(ctx, secrets, sink.URLFrom.SecretKeyRef, ".urlFrom"); err != nil {
			return "", nil, err
		}
		target = strings.TrimSpace(target)
	}
	header := http.Header{}
	for _, h := range sink.Headers {
		v := ""
		switch {
		case h.Value != nil:
			v = *h.Value
		case h.ValueFrom != nil:
			var err error
			if v, err = r.readSecret(ctx, secrets, h.ValueFrom.SecretKeyRef, ".headers "+h.Name); err != nil {
				return "", nil, err
			}
		}
		header.Add(h.Name, v)
	}
	return target, header, nil
}

// readSecret reads one key of a sink's Secret where the sink's Secrets live; field names the
// reference within the sink, for errors.
func (r *Reconciler) readSecret(ctx context.Context, secrets sinkSecrets, ref toolnexusv1alpha1.SecretKeyReference, field string) (string, error) {
	what := secrets.what + field
	if secrets.policy && secrets.namespace == "" {
		return "", fmt.Errorf("%s: %w", what, errNoSecretNamespace)
	}
	v, err := kube.ReadSecretKey(ctx, r.APIReader, r.RequireSecretLabel, secrets.namespace, ref, what)
	var missing *kube.MissingSecretError
	if secrets.policy && errors.As(err, &missing) && missing.Reason == toolnexusv1alpha1.ReasonSecretNotFound {
		return "", &managerSecretError{MissingSecretError: missing, namespace: secrets.namespace}
	}
	return v, err
}

// finish records how an attempt went: delivered, given up, or when to try again.
func (r *Reconciler) finish(name types.NamespacedName, key attemptKey, sink toolnexusv1alpha1.NotifySink, res notify.Result, reason string, log logr.Logger) {
	now := r.Clock.Now()
	outcome, attempts := "delivered", 0
	r.attempts.update(name, key, func(st *attemptState) {
		st.running = false
		st.attempts++
		attempts = st.attempts
		record := func(o toolnexusv1alpha1.NotificationOutcome, reason, message string) {
			st.done = &toolnexusv1alpha1.NotificationRecord{Sink: key.sink, Event: key.event, Outcome: o, Reason: reason,
				Attempts: int32(min(st.attempts, 1<<30)), Message: clip.Marked(message, 1024), Time: &metav1.Time{Time: now}}
		}
		switch {
		case res.Delivered:
			record(toolnexusv1alpha1.NotificationDelivered, "", "")
		case res.Retry && st.attempts < r.Policy.MaxAttempts:
			outcome = "retried"
			st.lastError = clip.Marked(res.Err.Error(), 512)
			st.next = now.Add(r.Policy.Wait(st.attempts, res.RetryAfter))
		default:
			outcome = "failed"
			record(toolnexusv1alpha1.NotificationFailed, reason, res.Err.Error())
		}
	})
	format := string(sink.Format)
	if format == "" {
		format = string(toolnexusv1alpha1.NotifyFormatCloudEvents)
	}
	r.Metrics.Notifications.WithLabelValues(format, strings.ToLower(string(key.event)), outcome).Inc()
	if res.Err != nil {
		log.V(1).Info("Notification attempt failed", "outcome", outcome, "attempt", attempts, "error", res.Err.Error())
	}
}

// forget cancels the attempts of a request that is gone.
func (r *Reconciler) forget(name types.NamespacedName) {
	for _, k := range r.attempts.forget(name) {
		r.Executor.Cancel(k.jobKey())
	}
}

// payload renders msg in the sink's format.
func payload(format toolnexusv1alpha1.NotifyFormat, msg notify.Message) (contentType string, body []byte, err error) {
	if format == toolnexusv1alpha1.NotifyFormatSlack {
		body, err = notify.Slack(msg)
		return "application/json", body, err
	}
	body, err = notify.CloudEvent(msg)
	return notify.CloudEventsContentType, body, err
}

// messageOf is what the notification d says about preq.
func messageOf(preq *toolnexusv1alpha1.PendingRequest, d delivery) notify.Message {
	ev, rq := d.event, preq.Spec.Request
	m := notify.Message{
		Event: notify.Event(strings.ToLower(string(ev))), Namespace: preq.Namespace, Name: preq.Name,
		UID: string(preq.UID), Run: preq.Spec.RunRef.Name, Path: preq.RunPath(), Kind: rq.Kind, Prompt: rq.Prompt, URL: rq.URL,
		Tool: preq.Spec.ToolCall.Name, Arguments: preq.Spec.ToolCall.Arguments, Time: preq.CreationTimestamp.Time,
		Login: rq.Kind == tools.KindAuthorization && strings.HasPrefix(rq.ID, tools.LoginIDPrefix),
	}
	if p := preq.Spec.Policy; p != nil {
		m.Policy = p.Name
	}
	m.Required = int(preq.Spec.Required)
	for _, a := range preq.Status.Approvals {
		e := notify.Approval{User: a.User, OK: a.OK, Reason: a.Reason}
		if a.At != nil {
			e.At = a.At.Time
		}
		m.Approvals = append(m.Approvals, e)
	}
	if a := preq.Spec.Approvers; a != nil {
		m.Users, m.Groups = slices.Clone(a.Users), slices.Clone(a.Groups)
	}
	if d.step != nil {
		i := int(d.step.Step)
		step := preq.Spec.Escalation[i]
		m.Time = d.step.Time.Time
		m.Users, m.Groups = mayApproveAt(preq, i)
		m.Escalation = &notify.Escalation{Step: i, Steps: len(preq.Spec.Escalation), After: step.After.Duration}
		if a := step.Approvers; a != nil {
			m.Escalation.Users, m.Escalation.Groups = slices.Clone(a.Users), slices.Clone(a.Groups)
		}
		return m // about the step, whatever came after it
	}
	if a := preq.Status.Answer; a != nil && ev != toolnexusv1alpha1.NotifyOpened {
		m.Answer = &notify.Answer{OK: a.OK, Reason: a.Reason, AnsweredBy: preq.Status.AnsweredBy}
		if t := preq.Status.AnsweredAt; t != nil {
			m.Time = t.Time
		}
	}
	return m
}

// SetupWithManager registers the notifier: it watches the PendingRequests that name sinks or
// escalation steps, and the end of its own attempts.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil || r.Recorder == nil || r.Clock == nil || r.Metrics == nil || r.Executor == nil || r.HTTPClient == nil {
		return errors.New("the notifier needs APIReader, Recorder, Clock, Metrics, Executor and HTTPClient")
	}
	r.Policy = r.Policy.OrDefault()
	r.attempts = newAttempts()
	return builder.ControllerManagedBy(mgr).
		For(&toolnexusv1alpha1.PendingRequest{}, builder.WithPredicates(notifyWork())).
		WatchesRawSource(source.Channel(r.attempts.wake, &handler.EnqueueRequestForObject{})).
		Named("notify").
		Complete(r)
}

// notifyWork passes the request events the notifier acts on: a request with sinks or escalation
// steps appearing (a step's time is a requeue), its answer, a change of its Notified condition
// (the run's controller can overwrite it), a finished delivery recorded (a sink's next event is
// due), and its deletion.
func notifyWork() predicate.Predicate {
	withWork := func(o client.Object) bool {
		p, ok := o.(*toolnexusv1alpha1.PendingRequest)
		return ok && hasWork(p)
	}
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return withWork(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*toolnexusv1alpha1.PendingRequest)
			n, ok2 := e.ObjectNew.(*toolnexusv1alpha1.PendingRequest)
			if !ok1 || !ok2 || !hasWork(n) {
				return false
			}
			was := meta.FindStatusCondition(o.Status.Conditions, toolnexusv1alpha1.ConditionNotified)
			is := meta.FindStatusCondition(n.Status.Conditions, toolnexusv1alpha1.ConditionNotified)
			return (o.Status.Answer == nil) != (n.Status.Answer == nil) || !equality.Semantic.DeepEqual(was, is) ||
				len(o.Status.Notifications) != len(n.Status.Notifications)
		},
		DeleteFunc:  func(e event.DeleteEvent) bool { return withWork(e.Object) },
		GenericFunc: func(event.GenericEvent) bool { return true },
	}
}

// hasWork reports whether preq names anything the notifier serves: sinks or escalation steps.
func hasWork(preq *toolnexusv1alpha1.PendingRequest) bool {
	return len(preq.Spec.Notify) > 0 || len(preq.Spec.Escalation) > 0
}

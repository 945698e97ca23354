// Package auditor is the room that delivers the audit trail of every PendingRequest to
// --audit-sink-url (SPEC §11, docs/audit.md): each event at least once, in order, with the
// notifier's backoff, recorded in status.audited, and the finalizer toolnexus.dev/audit kept on
// the request until the last event it will have is delivered, so deleting its run loses nothing.
package auditor

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/audit"
	"github.com/toolnexus/operator/internal/controller/metrics"
	"github.com/toolnexus/operator/internal/kube"
	"github.com/toolnexus/operator/internal/notify"
)

// defaultWorkers is how many requests' deliveries are under way at once.
const defaultWorkers = 4

// Reconciler delivers the audit events of PendingRequests, one per reconcile. Its workers are
// its own: a slow or refusing sink holds only them, never a run, the runs' executor or the
// notifier; the wait between attempts is a requeue.
type Reconciler struct {
	client.Client
	Clock   clock.PassiveClock
	Metrics *metrics.Metrics
	// SinkURL is --audit-sink-url; empty turns auditing off, and the room then only lets go of
	// requests being deleted that still hold the finalizer.
	SinkURL string
	// HTTPClient reaches the sink (the manager's guarded client, as notifications).
	HTTPClient *http.Client
	// Policy spaces the attempts and bounds each (Base, Cap, Timeout; zero fields take
	// notify.DefaultPolicy's). MaxAttempts does not apply: an audit event is tried until the sink
	// takes it.
	Policy notify.Policy
	// Workers bounds the deliveries under way at once; zero means 4.
	Workers int

	sink     *audit.Sink
	progress *progresses
}

// Why each permission is there:
//   - pendingrequests get/list/watch: requests are the room's work queue.
//   - pendingrequests patch: the finalizer toolnexus.dev/audit (metadata only; the spec is immutable).
//   - pendingrequests/status patch: status.audited (the admission policy toolnexus-status-owner
//     lets only the manager, holder of the custom verb "manage", write it).
//
// +kubebuilder:rbac:groups=toolnexus.dev,resources=pendingrequests,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=toolnexus.dev,resources=pendingrequests/status,verbs=get;patch

// Reconcile delivers the next audit event the request is owed, records it, and keeps or drops
// the finalizer.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	preq := &toolnexusv1alpha1.PendingRequest{}
	if err := r.Get(ctx, req.NamespacedName, preq); err != nil {
		if apierrors.IsNotFound(err) {
			r.progress.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if r.sink == nil {
		return r.letGo(ctx, preq)
	}
	now := r.Clock.Now()
	pr := r.progress.get(req.NamespacedName, preq.UID, preq.Status.Audited)
	delivered := append(slices.Clone(preq.Status.Audited), pr.delivered...)
	events := owed(preq)
	e := next(events, delivered)
	if e == nil {
		if err := r.record(ctx, preq, delivered); err != nil {
			return ctrl.Result{}, err
		}
		if final(preq) {
			return r.setFinalizer(ctx, preq, false)
		}
		return r.setFinalizer(ctx, preq, true)
	}
	if preq.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(preq, toolnexusv1alpha1.AuditFinalizer) {
		// Held before the first attempt: a deletion meanwhile waits for the event.
		if res, err := r.setFinalizer(ctx, preq, true); err != nil || !res.IsZero() {
			return res, err
		}
	}
	if pr.trying == e.Key() && now.Before(pr.retryAt) {
		return kube.RequeueAt(pr.retryAt, now), nil
	}
	return r.deliver(ctx, preq, *e, delivered, pr, now)
}

// deliver sends e once; delivered, it is recorded and the next event is due at once, else the
// next attempt waits its backoff.
func (r *Reconciler) deliver(ctx context.Context, preq *toolnexusv1alpha1.PendingRequest, e audit.Event, delivered []string, pr progress, now time.Time) (ctrl.Result, error) {
	name, key := client.ObjectKeyFromObject(preq), e.Key()
	res := r.sink.Send(ctx, e)
	if !res.Delivered {
		attempts := 1
		if pr.trying == key {
			attempts = pr.attempts + 1
		}
		wait := r.Policy.Wait(attempts, res.RetryAfter)
		r.progress.update(name, preq.UID, func(p *progress) { p.trying, p.attempts, p.retryAt = key, attempts, now.Add(wait) })
		r.Metrics.AuditEvents.WithLabelValues(string(e.Kind), "retried").Inc()
		log := ctrl.LoggerFrom(ctx).WithValues("event", key, "attempt", attempts, "retryIn", wait.String())
		if attempts > 1 {
			log = log.V(1)
		}
		log.Info("The audit sink did not take an event; it is tried again until it does", "error", res.Err.Error())
		return kube.RequeueAt(now.Add(wait), now), nil
	}
	r.Metrics.AuditEvents.WithLabelValues(string(e.Kind), "delivered").Inc()
	r.progress.update(name, preq.UID, func(p *progress) {
		p.delivered = append(p.delivered, key)
		p.trying, p.attempts, p.retryAt = "", 0, time.Time{}
	})
	if err := r.record(ctx, preq, append(delivered, key)); err != nil {
		return ctrl.Result{}, err
	}
	return kube.RequeueAt(now, now), nil
}

// record writes delivered into status.audited, when status lacks some of it.
func (r *Reconciler) record(ctx context.Context, preq *toolnexusv1alpha1.PendingRequest, delivered []string) error {
	if equality.Semantic.DeepEqual(preq.Status.Audited, delivered) {
		return nil
	}
	before := preq.DeepCopy()
	preq.Status.Audited = delivered
	if _, err := kube.PatchStatus(ctx, r.Client, preq, before); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("recording the audit events of PendingRequest %s: %w", preq.Name, err)
	}
	return nil
}

// setFinalizer adds the audit finalizer (hold) or removes it. The write is bound to the version
// read, so an answer or an approval that came meanwhile is audited before the request may go.
func (r *Reconciler) setFinalizer(ctx context.Context, preq *toolnexusv1alpha1.PendingRequest, hold bool) (ctrl.Result, error) {
	before := preq.DeepCopy()
	changed := false
	switch {
	case hold && preq.DeletionTimestamp.IsZero():
		changed = controllerutil.AddFinalizer(preq, toolnexusv1alpha1.AuditFinalizer)
	case !hold:
		changed = controllerutil.RemoveFinalizer(preq, toolnexusv1alpha1.AuditFinalizer)
	}
	if !changed {
		return ctrl.Result{}, nil
	}
	_, res, err := kube.PatchLocked(ctx, r.Client, preq, before, false, "setting the audit finalizer of PendingRequest "+preq.Name)
	return res, err
}

// letGo, with auditing off, removes the finalizer from a request being deleted, so that nothing
// waits for a sink that is not there, and says what was not delivered.
func (r *Reconciler) letGo(ctx context.Context, preq *toolnexusv1alpha1.PendingRequest) (ctrl.Result, error) {
	if preq.DeletionTimestamp.IsZero() || !controllerutil.ContainsFinalizer(preq, toolnexusv1alpha1.AuditFinalizer) {
		return ctrl.Result{}, nil
	}
	res, err := r.setFinalizer(ctx, preq, false)
	if err == nil && res.IsZero() {
		ctrl.LoggerFrom(ctx).Info("A PendingRequest being deleted is let go with its audit events not delivered: the manager runs without --audit-sink-url",
			"pendingRequest", klog.KObj(preq), "undelivered", undelivered(owed(preq), preq.Status.Audited))
	}
	return res, err
}

// SetupWithManager checks the sink and registers the room.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil || r.Metrics == nil {
		return errors.New("the auditor needs Clock and Metrics")
	}
	r.Policy = r.Policy.OrDefault()
	if r.SinkURL != "" {
		if r.HTTPClient == nil {
			return errors.New("the auditor needs HTTPClient to reach --audit-sink-url")
		}
		sink, err := audit.NewSink(r.SinkURL, r.HTTPClient, r.Policy.Timeout)
		if err != nil {
			return err
		}
		r.sink = sink
	}
	if r.Workers <= 0 {
		r.Workers = defaultWorkers
	}
	r.progress = newProgresses()
	return builder.ControllerManagedBy(mgr).
		For(&toolnexusv1alpha1.PendingRequest{}, builder.WithPredicates(r.work())).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.Workers}).
		Named("audit").
		Complete(r)
}

// work passes the request events the room acts on. Auditing on: a request appearing, and a change
// of what its events derive from (its answer, approvals, Resolved condition, deletion, finalizer)
// — not its own status.audited writes. Auditing off: a request being deleted that holds the
// finalizer.
func (r *Reconciler) work() predicate.Predicate {
	if r.sink == nil {
		held := func(o client.Object) bool {
			return !o.GetDeletionTimestamp().IsZero() && controllerutil.ContainsFinalizer(o, toolnexusv1alpha1.AuditFinalizer)
		}
		return predicate.Funcs{
			CreateFunc:  func(e event.CreateEvent) bool { return held(e.Object) },
			UpdateFunc:  func(e event.UpdateEvent) bool { return held(e.ObjectNew) },
			DeleteFunc:  func(event.DeleteEvent) bool { return false },
			GenericFunc: func(event.GenericEvent) bool { return false },
		}
	}
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return true },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*toolnexusv1alpha1.PendingRequest)
			n, ok2 := e.ObjectNew.(*toolnexusv1alpha1.PendingRequest)
			return ok1 && ok2 && !equality.Semantic.DeepEqual(auditedFacts(o), auditedFacts(n))
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return true },
	}
}

// facts are what a request's audit events and finalizer derive from (exported fields: the
// semantic comparison reads no unexported ones).
type facts struct {
	Deleting, Held bool
	Answer         *toolnexusv1alpha1.Answer
	AnsweredBy     string
	Approvals      []toolnexusv1alpha1.ApprovalEntry
	Resolved       string
}

func auditedFacts(p *toolnexusv1alpha1.PendingRequest) facts {
	f := facts{Deleting: !p.DeletionTimestamp.IsZero(), Held: controllerutil.ContainsFinalizer(p, toolnexusv1alpha1.AuditFinalizer),
		Answer: p.Status.Answer, AnsweredBy: p.Status.AnsweredBy, Approvals: p.Status.Approvals}
	if c := meta.FindStatusCondition(p.Status.Conditions, toolnexusv1alpha1.ConditionResolved); c != nil {
		f.Resolved = string(c.Status) + "/" + c.Reason
	}
	return f
}

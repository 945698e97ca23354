package agentrun

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/runstore"
	"github.com/toolnexus/operator/internal/telemetry"
)

// What wakes a run, and in which order the run queue serves what woke it.

// SetupWithManager registers the reconciler and its watches: AgentRuns (spec changes only), answers
// to and deletions of their PendingRequests, the appearance of Secrets and Agents they wait for,
// the end of their steps, and for sub-agent calls the end of their child runs and the requests of
// their delegated runs (children.go).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil || r.Recorder == nil || r.Clock == nil || r.Metrics == nil || r.Executor == nil || r.HTTPClient == nil {
		return errors.New("the AgentRun Reconciler needs APIReader, Recorder, Clock, Metrics, Executor and HTTPClient")
	}
	if r.Tracing != nil {
		r.HTTPClient = telemetry.Propagating(r.HTTPClient)
	}
	r.steps = newSteps()
	r.store = runstore.New(r.Client, r.APIReader, r.Scheme,
		runstore.Limits{MaxBytes: r.MaxTranscriptBytes, MaxRawBytes: r.MaxTranscriptRawBytes})
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &toolnexusv1alpha1.AgentRun{}, secretNamesIndexField, secretNames); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &toolnexusv1alpha1.PendingRequest{}, ownerRunIndexField, runOfRequest); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &toolnexusv1alpha1.AgentRun{}, agentRefIndexField, agentOfRun); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &toolnexusv1alpha1.AgentRun{}, ownerRunIndexField, runOfRequest); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &toolnexusv1alpha1.PendingRequest{}, rootRunIndexField, rootUIDOfRequest); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &toolnexusv1alpha1.Agent{}, secretNamesIndexField, secretNames); err != nil {
		return err
	}
	return builder.ControllerManagedBy(mgr).
		For(&toolnexusv1alpha1.AgentRun{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&toolnexusv1alpha1.PendingRequest{}, withPriority(handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(),
			&toolnexusv1alpha1.AgentRun{}, handler.OnlyControllerOwner()), answerPriority), builder.WithPredicates(answerOrDeletion())).
		WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.runsWaitingFor),
			builder.WithPredicates(predicate.Funcs{DeleteFunc: func(event.DeleteEvent) bool { return false }})).
		Watches(&toolnexusv1alpha1.Agent{}, handler.EnqueueRequestsFromMapFunc(r.runsOfAgent),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&toolnexusv1alpha1.AgentRun{}, withPriority(handler.EnqueueRequestsFromMapFunc(r.parentOfChild), stepEndedPriority),
			builder.WithPredicates(childChanged())).
		Watches(&toolnexusv1alpha1.PendingRequest{}, handler.EnqueueRequestsFromMapFunc(rootOfRequest),
			builder.WithPredicates(requestOfSubRun())).
		WatchesRawSource(source.Channel(r.steps.wake, stepEnded())).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.MaxConcurrentReconciles}).
		Named("agentrun").
		Complete(r)
}

// answerOrDeletion passes the PendingRequest events a run must react to: an answer appearing, and
// a request deleted by hand. The controller's own status writes are filtered out.
func answerOrDeletion() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool {
			p, ok := e.Object.(*toolnexusv1alpha1.PendingRequest)
			return ok && p.Status.Answer != nil // an answer already there when the cache starts
		},
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*toolnexusv1alpha1.PendingRequest)
			n, ok2 := e.ObjectNew.(*toolnexusv1alpha1.PendingRequest)
			return ok1 && ok2 && o.Status.Answer == nil && n.Status.Answer != nil
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// runOfRequest indexes a PendingRequest, or a sub-agent's run, by the run that controls it, so a
// run finds its requests and its children without scanning the namespace.
func runOfRequest(obj client.Object) []string {
	if owner := metav1.GetControllerOf(obj); owner != nil && owner.Kind == "AgentRun" {
		return []string{owner.Name}
	}
	return nil
}

// agentOfRun indexes a run of an Agent by the Agent's name.
func agentOfRun(obj client.Object) []string {
	if run, ok := obj.(*toolnexusv1alpha1.AgentRun); ok && run.Spec.AgentRef != nil {
		return []string{run.Spec.AgentRef.Name}
	}
	return nil
}

// secretNames indexes a run, or an Agent, by the Secrets its spec references.
func secretNames(obj client.Object) []string {
	var spec *toolnexusv1alpha1.AgentSpec
	switch o := obj.(type) {
	case *toolnexusv1alpha1.AgentRun:
		spec = &o.Spec.AgentSpec
	case *toolnexusv1alpha1.Agent:
		spec = &o.Spec
	default:
		return nil
	}
	var names []string
	if ref := spec.Model.APIKeySecretRef; ref != nil {
		names = append(names, ref.Name)
	}
	headers := func(hs []toolnexusv1alpha1.HTTPHeader) {
		for _, h := range hs {
			if h.ValueFrom != nil {
				names = append(names, h.ValueFrom.SecretKeyRef.Name)
			}
		}
	}
	for _, t := range spec.Tools {
		if t.HTTP != nil {
			headers(t.HTTP.Headers)
		}
		if t.A2A != nil {
			headers(t.A2A.Headers)
		}
	}
	for _, s := range spec.MCPServers {
		headers(s.Headers)
	}
	return names
}

// runsWaitingFor maps a Secret to the runs of its namespace that wait for it (reason
// SecretNotFound or SecretNotAllowed), referencing it themselves or through their Agent. Runs that
// do not wait for it are left alone: they read it at call time, and a parked run woken by a
// Secret's metadata change would decode its whole transcript for nothing.
func (r *Reconciler) runsWaitingFor(ctx context.Context, secret client.Object) []reconcile.Request {
	waiting := func(run *toolnexusv1alpha1.AgentRun) bool {
		// A run that has not started reads no record when woken; one that started and found a
		// Secret missing says so in its status (and re-checks on its own, should the Secret appear
		// before the cache shows that status: see secretRecheck).
		reason := conditionOf(run, toolnexusv1alpha1.ConditionSucceeded).Reason
		return !run.Status.Started() || reason == toolnexusv1alpha1.ReasonSecretNotFound || reason == toolnexusv1alpha1.ReasonSecretNotAllowed
	}
	out := r.runsWhere(ctx, secret.GetNamespace(), secretNamesIndexField, secret.GetName(), waiting)
	var agents toolnexusv1alpha1.AgentList
	if err := r.List(ctx, &agents, client.InNamespace(secret.GetNamespace()),
		client.MatchingFields{secretNamesIndexField: secret.GetName()}); err != nil {
		return out
	}
	for i := range agents.Items {
		out = append(out, r.runsWhere(ctx, agents.Items[i].Namespace, agentRefIndexField, agents.Items[i].Name, waiting)...)
	}
	return out
}

// runsOfAgent maps an Agent to the runs of it that have not started: only those read it (a run
// takes its snapshot before its first step, and one that waits for its Agent has not started).
// Judged by whether the status says it started rather than by its reason (AgentNotFound), which the
// cache may not show yet when the Agent appears right after the run; waking a run that has not
// started reads no record.
func (r *Reconciler) runsOfAgent(ctx context.Context, agent client.Object) []reconcile.Request {
	return r.runsWhere(ctx, agent.GetNamespace(), agentRefIndexField, agent.GetName(), func(run *toolnexusv1alpha1.AgentRun) bool {
		return !run.Status.Started()
	})
}

// runsWhere lists the unfinished runs of namespace whose index field has value and that want says
// to wake.
func (r *Reconciler) runsWhere(ctx context.Context, namespace, field, value string, want func(*toolnexusv1alpha1.AgentRun) bool) []reconcile.Request {
	var runs toolnexusv1alpha1.AgentRunList
	if err := r.List(ctx, &runs, client.InNamespace(namespace), client.MatchingFields{field: value}); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range runs.Items {
		if run := &runs.Items[i]; !finished(run) && want(run) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(run)})
		}
	}
	return out
}

// Priorities in the runs' queue (controller-runtime's priority queue, where watch events go at 0
// and the initial list lower): a run whose request was just answered goes first, since a person
// waits on its effect, then a run whose step ended, so that runs in progress go on before new ones
// are taken and a run's completion does not wait behind every run created after it.
// A requeue (a backoff, an expiry, an error's retry) goes at requeuePriority, a watch event's:
// controller-runtime would keep the priority of whatever woke the run, and a run answered once
// would retry ahead of every other run for good.
const (
	answerPriority    = 2
	stepEndedPriority = 1
	requeuePriority   = 0
)

// stepEnded enqueues a run whose step has ended, at stepEndedPriority.
func stepEnded() handler.EventHandler {
	return withPriority(&handler.EnqueueRequestForObject{}, stepEndedPriority)
}

// withPriority enqueues what h enqueues at prio, unless h names a priority itself.
func withPriority(h handler.EventHandler, prio int) handler.EventHandler {
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q queue) { h.Create(ctx, e, prioritized(q, prio)) },
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q queue) { h.Update(ctx, e, prioritized(q, prio)) },
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q queue) { h.Delete(ctx, e, prioritized(q, prio)) },
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q queue) {
			h.Generic(ctx, e, prioritized(q, prio))
		},
	}
}

type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]

// prioritized is q adding at prio; q itself when it is no priority queue.
func prioritized(q queue, prio int) queue {
	pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request])
	if !ok {
		return q
	}
	return priorityQueue{PriorityQueue: pq, prio: prio}
}

type priorityQueue struct {
	priorityqueue.PriorityQueue[reconcile.Request]
	prio int
}

func (q priorityQueue) Add(item reconcile.Request) {
	q.AddWithOpts(priorityqueue.AddOpts{}, item)
}

func (q priorityQueue) AddAfter(item reconcile.Request, after time.Duration) {
	q.AddWithOpts(priorityqueue.AddOpts{After: after}, item)
}

func (q priorityQueue) AddRateLimited(item reconcile.Request) {
	q.AddWithOpts(priorityqueue.AddOpts{RateLimited: true}, item)
}

func (q priorityQueue) AddWithOpts(o priorityqueue.AddOpts, items ...reconcile.Request) {
	if o.Priority == nil {
		o.Priority = &q.prio
	}
	q.PriorityQueue.AddWithOpts(o, items...)
}

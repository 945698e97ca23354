package agentrun

import (
	"context"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

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

package agentrun

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

// A run whose request was answered is reconciled first, then a run whose step ended, then a run
// queued earlier by another watch event (a new run), whatever order they were queued in.
func TestRunQueuePriorities(t *testing.T) {
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	q := priorityqueue.New[reconcile.Request]("agentrun-test")
	defer q.ShutDown()
	ctx := context.Background()

	q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "a", Name: "new"}})
	ended := &toolnexusv1alpha1.AgentRun{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "in-progress"}}
	stepEnded().Generic(ctx, event.GenericEvent{Object: ended}, q)
	answered := &toolnexusv1alpha1.AgentRun{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "answered", UID: "run-uid"}}
	preq := &toolnexusv1alpha1.PendingRequest{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "answered-1-call-1",
		ResourceVersion: "1",
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(answered, toolnexusv1alpha1.GroupVersion.WithKind("AgentRun"))}}}
	mapper := meta.NewDefaultRESTMapper([]schema.GroupVersion{toolnexusv1alpha1.GroupVersion})
	mapper.Add(toolnexusv1alpha1.GroupVersion.WithKind("AgentRun"), meta.RESTScopeNamespace)
	owner := withPriority(handler.EnqueueRequestForOwner(scheme, mapper, &toolnexusv1alpha1.AgentRun{},
		handler.OnlyControllerOwner()), answerPriority)
	answer := preq.DeepCopy()
	answer.ResourceVersion, answer.Status.Answer = "2", &toolnexusv1alpha1.Answer{OK: true}
	owner.Update(ctx, event.UpdateEvent{ObjectOld: preq, ObjectNew: answer}, q)

	for i, want := range []string{"answered", "in-progress", "new"} {
		got, shutdown := q.Get()
		if shutdown {
			t.Fatal("queue shut down")
		}
		if got.Name != want {
			t.Errorf("item %d: %s, want %s", i+1, got.Name, want)
		}
		q.Done(got)
	}
}

// A run requeues at a watch event's priority whatever woke it: an answered run that then waits
// for its expiry, or fails and retries, does not go ahead of every other run for good.
func TestReconcileRequeuesAtAWatchEventsPriority(t *testing.T) {
	e := newDecisionEnv(t)
	res, err := e.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "tenant", Name: "gone"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Priority == nil || *res.Priority != requeuePriority {
		t.Fatalf("the result's priority is %v, want %d", res.Priority, requeuePriority)
	}
}

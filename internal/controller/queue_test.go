package controller

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// A run whose step ended is reconciled before a run that was queued earlier by a watch event.
func TestStepEndedGoesFirst(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("agentrun-test")
	defer q.ShutDown()
	created := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "a", Name: "new"}}
	q.Add(created)
	ended := &toolnexusv1alpha1.AgentRun{}
	ended.Namespace, ended.Name = "a", "in-progress"
	stepEnded().Generic(context.Background(), event.GenericEvent{Object: ended}, q)

	for i, want := range []string{"in-progress", "new"} {
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

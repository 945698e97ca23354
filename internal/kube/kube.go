// Package kube holds the few Kubernetes helpers every reconciler of the operator shares: the status
// patch, conditions stamped with the reconciler's clock, Secret reads, requeues and wake-ups.
package kube

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/clip"
)

// Conditioned is an object whose status carries conditions.
type Conditioned interface {
	client.Object
	StatusConditions() *[]metav1.Condition
}

// SetCondition sets a condition of obj, stamped with the generation the status describes; the
// transition time, now (the reconciler's clock), changes only when the status does.
func SetCondition(obj Conditioned, now time.Time, t string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(obj.StatusConditions(), metav1.Condition{Type: t, Status: status, Reason: reason,
		Message: message, ObservedGeneration: obj.GetGeneration(), LastTransitionTime: metav1.NewTime(now)})
}

// SetReady says in obj's Ready condition whether it can be used: True with okMessage when reason
// is empty; else False with reason and message, and Stalled True with the same (kstatus, and so a
// GitOps tool, reads the object as failed). The status describes obj's generation.
func SetReady(obj Conditioned, gen *int64, now time.Time, reason, message, okMessage string) {
	*gen = obj.GetGeneration()
	if reason == "" {
		SetCondition(obj, now, toolnexusv1alpha1.ConditionReady, metav1.ConditionTrue, toolnexusv1alpha1.ReasonValid, okMessage)
		meta.RemoveStatusCondition(obj.StatusConditions(), toolnexusv1alpha1.ConditionStalled)
		return
	}
	message = clip.Marked(message, 1024)
	SetCondition(obj, now, toolnexusv1alpha1.ConditionReady, metav1.ConditionFalse, reason, message)
	SetCondition(obj, now, toolnexusv1alpha1.ConditionStalled, metav1.ConditionTrue, reason, message)
}

// PatchStatus writes what changed in obj's status since before, as a merge patch of the status
// subresource; when nothing changed it writes nothing and reports false.
func PatchStatus(ctx context.Context, c client.Client, obj, before client.Object) (bool, error) {
	patch := client.MergeFrom(before)
	data, err := patch.Data(obj)
	if err != nil {
		return false, fmt.Errorf("computing the status patch of %s: %w", obj.GetName(), err)
	}
	if string(data) == "{}" {
		return false, nil
	}
	return true, c.Status().Patch(ctx, obj, patch)
}

// ConflictRetry is how soon an object whose locked patch met a newer version is looked at again.
const ConflictRetry = 100 * time.Millisecond

// PatchLocked writes what changed in obj since before (its status subresource when status is
// true), bound to the resourceVersion before was read at: a write over a change it has not seen is
// refused. It reports whether the write was made; a conflict gives the result that looks again
// soon, an object gone meanwhile is no error. what names the write in an error ("recording the
// notifications of PendingRequest x").
func PatchLocked(ctx context.Context, c client.Client, obj, before client.Object, status bool, what string) (bool, ctrl.Result, error) {
	patch := client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
	var err error
	if status {
		err = c.Status().Patch(ctx, obj, patch)
	} else {
		err = c.Patch(ctx, obj, patch)
	}
	switch {
	case apierrors.IsConflict(err):
		return false, ctrl.Result{RequeueAfter: ConflictRetry}, nil
	case apierrors.IsNotFound(err):
		return false, ctrl.Result{}, nil
	case err != nil:
		return false, ctrl.Result{}, fmt.Errorf("%s: %w", what, err)
	}
	return true, ctrl.Result{}, nil
}

// nextStep is the requeue delay of an object whose wake-up time has already come.
const nextStep = time.Millisecond

// RequeueAt is the result that looks at the object again at t; none for the zero time.
func RequeueAt(t, now time.Time) ctrl.Result {
	if t.IsZero() {
		return ctrl.Result{}
	}
	wait := t.Sub(now)
	if wait <= 0 {
		wait = nextStep
	}
	return ctrl.Result{RequeueAfter: wait}
}

// Wake sends obj's reconcile request into ch, a controller's channel source; it never blocks the
// job that calls it for longer than ctx lives.
func Wake(ctx context.Context, ch chan<- event.GenericEvent, obj client.Object) {
	select {
	case ch <- event.GenericEvent{Object: obj}:
	case <-ctx.Done():
	}
}

// RunLabels are the labels of an object the manager creates for run: the run's name, when it fits
// in a label value, and the run's shard, so that the object is in the caches of the manager that
// runs the run and of no other.
func RunLabels(run *toolnexusv1alpha1.AgentRun) map[string]string {
	labels := map[string]string{}
	if len(validation.IsValidLabelValue(run.Name)) == 0 {
		labels[toolnexusv1alpha1.RunLabel] = run.Name
	}
	if shard, ok := run.Labels[toolnexusv1alpha1.ShardLabel]; ok {
		labels[toolnexusv1alpha1.ShardLabel] = shard
	}
	if len(labels) == 0 {
		return nil
	}
	return labels
}

package controller

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// conditioned is an object whose status carries conditions.
type conditioned interface {
	client.Object
	StatusConditions() *[]metav1.Condition
}

// setCondition sets a condition of obj, stamped with the generation the status describes; the
// transition time, now (the reconciler's clock), changes only when the status does.
func setCondition(obj conditioned, now time.Time, t string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(obj.StatusConditions(), metav1.Condition{Type: t, Status: status, Reason: reason,
		Message: message, ObservedGeneration: obj.GetGeneration(), LastTransitionTime: metav1.NewTime(now)})
}

// patchStatus writes what changed in obj's status since before, as a merge patch of the status
// subresource; when nothing changed it writes nothing and reports false.
func patchStatus(ctx context.Context, c client.Client, obj, before client.Object) (bool, error) {
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

package policy

import (
	"context"
	"errors"
	"time"

	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/kube"
)

// Reconciler says, in each ApprovalPolicy's Ready condition, whether the policy can be applied:
// it compiles the policy as the Registry does, so the condition and the call path agree.
type Reconciler struct {
	client.Client
	Clock clock.PassiveClock
}

var _ reconcile.Reconciler = (*Reconciler)(nil)

// Why each permission is there: approvalpolicies get/list/watch: the work queue, and the
// registry's informer; approvalpolicies/status get/update/patch: the Ready condition.
//
// +kubebuilder:rbac:groups=toolnexus.dev,resources=approvalpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=toolnexus.dev,resources=approvalpolicies/status,verbs=get;update;patch

// Reconcile sets the policy's Ready condition, and Stalled with the same reason when it is False.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	p := &toolnexusv1alpha1.ApprovalPolicy{}
	if err := r.Get(ctx, req.NamespacedName, p); err != nil || !p.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := p.DeepCopy()
	setPolicyReady(p, compile(p).problem, r.Clock.Now())
	_, err := kube.PatchStatus(ctx, r.Client, p, before)
	return ctrl.Result{}, err
}

// setPolicyReady sets Ready from what cannot be used in the policy (nothing: problem is empty),
// and Stalled (kstatus: a GitOps tool reads the policy as failed) with the same reason when the
// policy cannot be applied.
func setPolicyReady(p *toolnexusv1alpha1.ApprovalPolicy, problem string, now time.Time) {
	reason := ""
	if problem != "" {
		reason = toolnexusv1alpha1.ReasonInvalidPolicy
	}
	kube.SetReady(p, &p.Status.ObservedGeneration, now, reason, "The calls this policy matches are refused until it is fixed: "+problem,
		"The policy's selectors, tools, when and prompt are valid")
}

// SetupWithManager registers the reconciler; it reacts to spec changes only.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil || r.Clock == nil {
		return errors.New("Reconciler needs a Client and a Clock")
	}
	return builder.ControllerManagedBy(mgr).
		For(&toolnexusv1alpha1.ApprovalPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named("approvalpolicy").
		Complete(r)
}

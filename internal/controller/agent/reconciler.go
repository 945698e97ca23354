package agent

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
	"github.com/toolnexus/operator/internal/controller/runspec"
	"github.com/toolnexus/operator/internal/kube"
)

// Reconciler says, in each Agent's Ready condition, whether the agent can run: it builds the
// agent's tools, approval gates and model options the way a run does, without any I/O.
type Reconciler struct {
	client.Client
	Clock clock.PassiveClock
}

var _ reconcile.Reconciler = (*Reconciler)(nil)

// Why each permission is there: agents get/list/watch: the work queue, and runs resolve their
// Agent from the cache; agents/status get/patch: the Ready condition.
//
// +kubebuilder:rbac:groups=toolnexus.dev,resources=agents,verbs=get;list;watch
// +kubebuilder:rbac:groups=toolnexus.dev,resources=agents/status,verbs=get;patch

// Reconcile sets the Agent's Ready condition, and Stalled with the same reason when it is False.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	agent := &toolnexusv1alpha1.Agent{}
	if err := r.Get(ctx, req.NamespacedName, agent); err != nil || !agent.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := agent.DeepCopy()
	_, err := runspec.Build(&agent.Spec, runspec.Env{})
	var invalid *runspec.Error
	if err != nil && !errors.As(err, &invalid) {
		return ctrl.Result{}, err
	}
	setAgentReady(agent, invalid, r.Clock.Now())
	_, err = kube.PatchStatus(ctx, r.Client, agent, before)
	return ctrl.Result{}, err
}

// setAgentReady sets Ready from the validation's outcome, and Stalled (kstatus) with the same
// reason when the agent cannot run.
func setAgentReady(agent *toolnexusv1alpha1.Agent, invalid *runspec.Error, now time.Time) {
	reason, msg := "", ""
	if invalid != nil {
		reason, msg = invalid.Reason, invalid.Error()
	}
	kube.SetReady(agent, &agent.Status.ObservedGeneration, now, reason, msg, "The agent's tools, approval gates and model options are valid")
}

// SetupWithManager registers the reconciler; it reacts to spec changes only.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Client == nil || r.Clock == nil {
		return errors.New("Reconciler needs a Client and a Clock")
	}
	return builder.ControllerManagedBy(mgr).
		For(&toolnexusv1alpha1.Agent{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named("agent").
		Complete(r)
}

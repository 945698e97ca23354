package approval

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/kube"
)

// Events on a PendingRequest when its approvals decided it.
const (
	EventQuorumApproved = "QuorumApproved"
	EventQuorumDeclined = "QuorumDeclined"
)

// Reconciler writes the answer of every PendingRequest that needs several approvals
// (spec.required > 1) once its status.approvals decide it, as system:quorum. It writes nothing
// else: the run's controller reads the answer as any other, and expires the request when
// spec.request.expiresAt passes first.
type Reconciler struct {
	client.Client
	Recorder events.EventRecorder
	Clock    clock.PassiveClock
}

// Why each permission is there:
//   - pendingrequests get/list/watch: requests are the room's work queue.
//   - pendingrequests/status patch: the answer. The admission policies let only a holder of the
//     custom verb "quorum" write it, as system:quorum (config/rbac/expirer_role.yaml grants it to
//     the manager), and only as the entries decide.
//   - events create/patch: QuorumApproved and QuorumDeclined (granted with the run controller's).
//
// +kubebuilder:rbac:groups=toolnexus.dev,resources=pendingrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=toolnexus.dev,resources=pendingrequests/status,verbs=get;patch

// Reconcile decides an undecided quorum request from its entries and, when they decide it, writes
// the answer.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	preq := &toolnexusv1alpha1.PendingRequest{}
	if err := r.Get(ctx, req.NamespacedName, preq); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	now := r.Clock.Now()
	if !undecided(preq) || expired(preq, now) {
		return ctrl.Result{}, nil
	}
	d := Decide(preq.Status.Approvals, preq.Spec.Required)
	answer, err := d.Answer(preq.Spec.Request.ID)
	if answer == nil || err != nil {
		return ctrl.Result{}, err
	}
	before := preq.DeepCopy()
	preq.Status.Answer = answer
	preq.Status.AnsweredBy = toolnexusv1alpha1.QuorumAnswerer
	preq.Status.AnsweredAt = &metav1.Time{Time: now} // the API server stamps its own time
	// The lock makes the answer follow exactly the entries it was decided from: an entry added
	// since is a conflict, and the request is decided again with it.
	written, res, err := kube.PatchLocked(ctx, r.Client, preq, before, true, "writing the quorum answer of PendingRequest "+preq.Name)
	if !written {
		return res, err
	}
	ctrl.LoggerFrom(ctx).V(1).Info("Quorum answer written", "ok", answer.OK, "entries", len(d.Entries))
	if d.Outcome == Approved {
		r.Recorder.Eventf(preq, nil, corev1.EventTypeNormal, EventQuorumApproved, "Answer", "%s",
			clip.Marked(fmt.Sprintf("Approved by %d of %d required: %s", len(d.Approvers), max(preq.Spec.Required, 1),
				strings.Join(d.Approvers, ", ")), 1024))
	} else {
		r.Recorder.Eventf(preq, nil, corev1.EventTypeWarning, EventQuorumDeclined, "Answer", "%s",
			clip.Marked(fmt.Sprintf("Declined by %s: %s", d.Decider, d.Reason), 1024))
	}
	return ctrl.Result{}, nil
}

// undecided is a request that needs several approvals and has no answer yet.
func undecided(preq *toolnexusv1alpha1.PendingRequest) bool {
	return preq.Spec.Required > 1 && preq.Status.Answer == nil && preq.DeletionTimestamp.IsZero()
}

// expired is a request whose spec.request.expiresAt has passed: the API server would refuse its
// answer, and the run's controller expires it. One whose expiresAt does not parse is left alone
// too (the API server refuses every answer to it).
func expired(preq *toolnexusv1alpha1.PendingRequest, now time.Time) bool {
	at := preq.Spec.Request.ExpiresAt
	if at == "" {
		return false
	}
	t, err := time.Parse(time.RFC3339, at)
	return err != nil || now.After(t)
}

// SetupWithManager registers the room: it watches the undecided requests that need several
// approvals, when they appear and when an entry is added.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Recorder == nil || r.Clock == nil {
		return errors.New("the quorum room needs Recorder and Clock")
	}
	return builder.ControllerManagedBy(mgr).
		For(&toolnexusv1alpha1.PendingRequest{}, builder.WithPredicates(quorumWork())).
		Named("quorum").
		Complete(r)
}

// quorumWork passes an undecided request with entries when it appears (also when the cache
// starts) and when its entries grow: they are never changed or removed, so a count tells.
func quorumWork() predicate.Predicate {
	withEntries := func(o client.Object) bool {
		p, ok := o.(*toolnexusv1alpha1.PendingRequest)
		return ok && undecided(p) && len(p.Status.Approvals) > 0
	}
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return withEntries(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*toolnexusv1alpha1.PendingRequest)
			n, ok2 := e.ObjectNew.(*toolnexusv1alpha1.PendingRequest)
			return ok1 && ok2 && withEntries(n) && len(o.Status.Approvals) != len(n.Status.Approvals)
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

package agentrun

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/controller/runspec"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/notify"
	"github.com/toolnexus/operator/internal/runstore"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// A sub-agent call (an agentRef tool) is carried out as a child run. The call, in the executor,
// creates an AgentRun of the tool's Agent under a name derived from the parent's uid, the turn and
// the call, so that a call made again after a crash (tool calls are at-least-once) adopts the
// child it made before instead of starting another; the child is controlled by the parent (it is
// deleted with it) and its spec.delegatedBy, which only the operator may set, records the parent,
// the root and the path between them. The call then waits on the child like on any external work
// (a woken wait: wire.Wait.Woken): no slot and no look is spent on it until the child ends. The
// child's end (a watch of the runs the parent controls) wakes the parent, its reconcile marks the
// wait due (State.Wake), and the look reads the child's final text, or why it did not give one.
// A parent that stops waiting on a child (it ended, was cancelled or deleted, or the wait passed
// its deadline) cancels it.

// Events of sub-agent calls, on the parent.
const (
	EventSubRunCreated   = "SubRunCreated"
	EventSubRunCancelled = "SubRunCancelled"
)

// childName is the child run of call callID of turn: the parent's name, cut to leave room, and a
// digest of the parent's uid, the turn and the call. It fits in a label value (63), so the child's
// requests carry it as their run.
func childName(parent *toolnexusv1alpha1.AgentRun, turn int, callID string) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d/%s", parent.UID, turn, callID))
	prefix := parent.Name
	if len(prefix) > validation.LabelValueMaxLength-11 {
		prefix = strings.TrimRight(prefix[:validation.LabelValueMaxLength-11], "-.")
	}
	return prefix + "-" + hex.EncodeToString(sum[:])[:10]
}

// pathOf is the runs from the root to run, run last.
func pathOf(run *toolnexusv1alpha1.AgentRun) []string {
	var path []string
	if d := run.Spec.DelegatedBy; d != nil {
		path = append(path, d.Path...)
	}
	return append(path, run.Name)
}

// rootUIDOf is the uid of the root of run's delegation: its own when it has none.
func rootUIDOf(run *toolnexusv1alpha1.AgentRun) string {
	if d := run.Spec.DelegatedBy; d != nil {
		return d.RootUID
	}
	return string(run.UID)
}

// newChild is the child run a call of parent's turn makes; the caller sets its owner.
func newChild(ctx context.Context, parent *toolnexusv1alpha1.AgentRun, turn int, call runspec.SubAgentCall) *toolnexusv1alpha1.AgentRun {
	path := pathOf(parent)
	child := &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Name: childName(parent, turn, call.CallID), Namespace: parent.Namespace, Labels: map[string]string{}},
		Spec: toolnexusv1alpha1.AgentRunSpec{
			AgentRef: &toolnexusv1alpha1.AgentReference{Name: call.Agent}, Prompt: call.Prompt,
			RequestedBy: parent.Spec.RequestedBy,
			DelegatedBy: &toolnexusv1alpha1.Delegation{Path: path, ParentUID: string(parent.UID), RootUID: rootUIDOf(parent), CallID: call.CallID},
		},
	}
	for key, name := range map[string]string{toolnexusv1alpha1.RootRunLabel: path[0], toolnexusv1alpha1.ParentRunLabel: parent.Name} {
		if len(validation.IsValidLabelValue(name)) == 0 {
			child.Labels[key] = name
		}
	}
	// The child runs on its parent's shard (the shard stamp would give it the namespace's anyway).
	if shard, ok := parent.Labels[toolnexusv1alpha1.ShardLabel]; ok {
		child.Labels[toolnexusv1alpha1.ShardLabel] = shard
	}
	// The child's trace is a child of the call's span, when the parent is traced.
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	if tp := carrier.Get("traceparent"); tp != "" {
		child.Annotations = map[string]string{toolnexusv1alpha1.TraceparentAnnotation: tp}
	}
	return child
}

// adoptable says why child, found under the name a call's child gets, is not that call's child; ""
// when it is (the call was made again after a crash).
func adoptable(child *toolnexusv1alpha1.AgentRun, parent *toolnexusv1alpha1.AgentRun, want *toolnexusv1alpha1.AgentRun) string {
	d := child.Spec.DelegatedBy
	switch {
	case !metav1.IsControlledBy(child, parent) || d == nil || d.ParentUID != string(parent.UID) || d.CallID != want.Spec.DelegatedBy.CallID:
		return fmt.Sprintf("AgentRun %s exists and is not the run this call creates; delete it or rename it", child.Name)
	case child.Spec.AgentRef == nil || child.Spec.AgentRef.Name != want.Spec.AgentRef.Name || child.Spec.Prompt != want.Spec.Prompt:
		return fmt.Sprintf("AgentRun %s was created by this call with another agent or prompt", child.Name)
	}
	return ""
}

// subAgents carries out the sub-agent calls of run's turn in the executor: the first run of a
// call creates (or adopts) its child and waits on it, a look reads the child once it ended.
func (r *Reconciler) subAgents(run *toolnexusv1alpha1.AgentRun, turn int) func(context.Context, runspec.SubAgentCall) tools.ToolResult {
	parent := run.DeepCopy()
	return func(ctx context.Context, call runspec.SubAgentCall) tools.ToolResult {
		if call.Wait != nil {
			return r.lookAtChild(ctx, parent, call)
		}
		return r.startChild(ctx, parent, turn, call)
	}
}

func notCalled(call runspec.SubAgentCall, format string, a ...any) tools.ToolResult {
	return tools.ToolResult{Output: fmt.Sprintf("%s: agent %s was not called: ", call.Tool, call.Agent) + fmt.Sprintf(format, a...), IsError: true}
}

// startChild creates the child of call, or adopts the one a call made before a crash created.
func (r *Reconciler) startChild(ctx context.Context, parent *toolnexusv1alpha1.AgentRun, turn int, call runspec.SubAgentCall) tools.ToolResult {
	if depth := parent.Spec.Depth(); depth >= toolnexusv1alpha1.MaxDelegationDepth {
		return notCalled(call, "sub-agent calls go at most %d deep, and this run is %d deep (%s); answer without it",
			toolnexusv1alpha1.MaxDelegationDepth, depth, notify.PathText(pathOf(parent)))
	}
	agent, key := &toolnexusv1alpha1.Agent{}, client.ObjectKey{Namespace: parent.Namespace, Name: call.Agent}
	err := r.Get(ctx, key, agent)
	if apierrors.IsNotFound(err) {
		err = r.APIReader.Get(ctx, key, agent) // created a moment ago, before the cache saw it
	}
	if apierrors.IsNotFound(err) {
		return notCalled(call, "there is no Agent %s in namespace %s", call.Agent, parent.Namespace)
	} else if err != nil {
		return notCalled(call, "reading Agent %s: %s", call.Agent, clip.Marked(err.Error(), 512))
	}
	want := newChild(ctx, parent, turn, call)
	if err := controllerutil.SetControllerReference(parent, want, r.Scheme); err != nil {
		return notCalled(call, "%v", err)
	}
	child := want.DeepCopy()
	err = r.Create(ctx, child)
	if apierrors.IsAlreadyExists(err) {
		if err = r.APIReader.Get(ctx, client.ObjectKeyFromObject(want), child); err == nil {
			if why := adoptable(child, parent, want); why != "" {
				return notCalled(call, "%s", why)
			}
		}
	} else if err == nil {
		r.Recorder.Eventf(parent, child, corev1.EventTypeNormal, EventSubRunCreated, actionStep,
			"Tool %s called agent %s: run %s", call.Tool, call.Agent, child.Name)
	}
	if err != nil {
		return notCalled(call, "creating its run %s: %s", want.Name, clip.Marked(err.Error(), 1024))
	}
	ctrl.LoggerFrom(ctx).V(1).Info("Waiting on a sub-agent's run", "run", klog.KObj(parent), "child", klog.KObj(child), "agent", call.Agent)
	return tools.Waiting(wire.Wait{Kind: wire.WaitKindAgentRun, Server: call.Agent, ID: child.Name, Woken: true,
		Status: "running", Message: "run " + child.Name + " of agent " + call.Agent})
}

// lookAtChild gives the result of the child call waits on, once it ended: its final text, or why
// it gave none, as an error.
func (r *Reconciler) lookAtChild(ctx context.Context, parent *toolnexusv1alpha1.AgentRun, call runspec.SubAgentCall) tools.ToolResult {
	name, agent := call.Wait.ID, call.Wait.Server
	child, err := r.liveChild(ctx, parent.Namespace, name)
	if err != nil {
		w := *call.Wait
		w.PollError = clip.Marked(err.Error(), 512)
		return tools.Waiting(w)
	}
	if child == nil || child.Spec.DelegatedBy == nil || child.Spec.DelegatedBy.ParentUID != string(parent.UID) {
		return tools.ToolResult{Output: fmt.Sprintf("agent %s: its run %s was deleted before it ended", agent, name), IsError: true}
	}
	if !finished(child) {
		return tools.Waiting(*call.Wait) // woken before the cache showed its end: it wakes the call again
	}
	c := meta.FindStatusCondition(child.Status.Conditions, toolnexusv1alpha1.ConditionSucceeded)
	switch c.Reason {
	case toolnexusv1alpha1.ReasonCompleted:
		text, err := r.finalText(ctx, child)
		if err != nil {
			return tools.ToolResult{Output: fmt.Sprintf("agent %s: the final answer of its run %s cannot be read: %s", agent, name, clip.Marked(err.Error(), 512)), IsError: true}
		}
		return tools.ToolResult{Output: text}
	case toolnexusv1alpha1.ReasonMaxTurns:
		return tools.ToolResult{Output: fmt.Sprintf("agent %s: its run %s used all its model turns without a final answer: %s", agent, name, child.Status.Text), IsError: true}
	case toolnexusv1alpha1.ReasonCancelled:
		return tools.ToolResult{Output: fmt.Sprintf("agent %s: its run %s was cancelled: %s", agent, name, c.Message), IsError: true}
	}
	return tools.ToolResult{Output: fmt.Sprintf("agent %s: its run %s failed (%s): %s", agent, name, c.Reason, c.Message), IsError: true}
}

// finalText is the final text of a child that succeeded: its status holds it unless it was cut
// there, and then its record, which holds it whole, is read.
func (r *Reconciler) finalText(ctx context.Context, child *toolnexusv1alpha1.AgentRun) (string, error) {
	if len(child.Status.Text) < maxStatusText-64 {
		return child.Status.Text, nil
	}
	rec, err := runstore.Read(ctx, r.APIReader, child, r.store.Limits().MaxRawBytes)
	if err != nil {
		return "", err
	}
	if rec.State.Status != loop.StatusDone {
		return "", fmt.Errorf("its record says it has not ended (status %q)", rec.State.Status)
	}
	return rec.State.Text, nil
}

// liveChild reads a child run from the cache, or around it when the cache has not seen it; nil
// when it does not exist.
func (r *Reconciler) liveChild(ctx context.Context, namespace, name string) (*toolnexusv1alpha1.AgentRun, error) {
	child := &toolnexusv1alpha1.AgentRun{}
	err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, child)
	if apierrors.IsNotFound(err) {
		err = r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, child)
	}
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading run %s: %w", name, err)
	}
	return child, nil
}

// childrenPhase wakes the calls whose child ended (or is gone), so the step that follows looks at
// them, and cancels the children no call waits on any more.
func (r *Reconciler) childrenPhase(ctx context.Context, s *scope) (phaseOut, error) {
	st := s.rec.State
	for _, call := range st.Waiting() {
		w := call.Wait
		if w.Kind != wire.WaitKindAgentRun || w.Due {
			continue
		}
		child, err := r.liveChild(ctx, s.run.Namespace, w.ID)
		if err != nil {
			return phaseOut{}, err
		}
		if (child == nil || finished(child)) && st.Wake(w.Kind, w.ID) {
			s.dirty = true
		}
	}
	return phaseOut{}, r.cancelChildren(ctx, s.run, waitedOn(s), "the call that started it no longer waits on it")
}

// waitedOn names the children the run's saved state may still wait on: those its calls wait on,
// and those a call of the turn that has not run yet, or runs again, may create or adopt.
func waitedOn(s *scope) map[string]bool {
	st, out := s.rec.State, map[string]bool{}
	for _, c := range st.Calls {
		switch {
		case c.Wait != nil && c.Wait.Kind == wire.WaitKindAgentRun && c.Phase != loop.PhaseDone:
			out[c.Wait.ID] = true
		case c.Phase == loop.PhaseQueued || c.Phase == loop.PhaseAnswered || c.Phase == loop.PhaseSuspended:
			out[childName(s.run, st.Turn, c.ID)] = true
		}
	}
	return out
}

// cancelChildren cancels every unfinished child run of run but those keep names, saying why.
func (r *Reconciler) cancelChildren(ctx context.Context, run *toolnexusv1alpha1.AgentRun, keep map[string]bool, why string) error {
	var children toolnexusv1alpha1.AgentRunList
	if err := r.List(ctx, &children, client.InNamespace(run.Namespace), client.MatchingFields{ownerRunIndexField: run.Name}); err != nil {
		return fmt.Errorf("listing the run's sub-runs: %w", err)
	}
	for i := range children.Items {
		child := &children.Items[i]
		if keep[child.Name] || !metav1.IsControlledBy(child, run) {
			continue
		}
		if err := r.cancelChild(ctx, run, child, why); err != nil {
			return err
		}
	}
	return nil
}

// cancelOrphans cancels the unfinished runs that a run named key, now gone, controlled: where no
// garbage collector deletes them with it (a control plane without kube-controller-manager), they
// would otherwise go on, and in a cluster they stop before they are deleted.
func (r *Reconciler) cancelOrphans(ctx context.Context, key types.NamespacedName) error {
	var children toolnexusv1alpha1.AgentRunList
	if err := r.List(ctx, &children, client.InNamespace(key.Namespace), client.MatchingFields{ownerRunIndexField: key.Name}); err != nil {
		return fmt.Errorf("listing the sub-runs of deleted run %s: %w", key.Name, err)
	}
	for i := range children.Items {
		if err := r.cancelChild(ctx, nil, &children.Items[i], "the run that started it was deleted"); err != nil {
			return err
		}
	}
	return nil
}

// cancelChild sets spec.cancel on child unless it ended or is cancelled already; the event goes on
// parent when it still exists.
func (r *Reconciler) cancelChild(ctx context.Context, parent, child *toolnexusv1alpha1.AgentRun, why string) error {
	if finished(child) || child.Spec.Cancel || !child.DeletionTimestamp.IsZero() {
		return nil
	}
	before := child.DeepCopy()
	child.Spec.Cancel = true
	if err := r.Patch(ctx, child, client.MergeFrom(before)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("cancelling sub-run %s: %w", child.Name, err)
	}
	ctrl.LoggerFrom(ctx).Info("Cancelled a sub-run", "child", klog.KObj(child), "reason", why)
	if parent != nil {
		r.Recorder.Eventf(parent, child, corev1.EventTypeNormal, EventSubRunCancelled, actionStep, "Cancelled sub-run %s: %s", child.Name, why)
	}
	return nil
}

// markLineage labels a request of a delegated run with its root, and notes the path from the root
// to its run for the people it is shown to.
func markLineage(preq *toolnexusv1alpha1.PendingRequest, run *toolnexusv1alpha1.AgentRun) {
	d := run.Spec.DelegatedBy
	if d == nil {
		return
	}
	if preq.Labels == nil {
		preq.Labels = map[string]string{}
	}
	for key, value := range map[string]string{toolnexusv1alpha1.RootRunLabel: d.Path[0], toolnexusv1alpha1.RootRunUIDLabel: d.RootUID} {
		if len(validation.IsValidLabelValue(value)) == 0 {
			preq.Labels[key] = value
		}
	}
	if preq.Annotations == nil {
		preq.Annotations = map[string]string{}
	}
	preq.Annotations[toolnexusv1alpha1.RunPathAnnotation] = strings.Join(pathOf(run), "/")
}

// rootUIDOfRequest indexes a delegated run's request by its root's uid: every reconcile of a root
// run looks its sub-runs' requests up, which a label selector would do by scanning the namespace.
func rootUIDOfRequest(obj client.Object) []string {
	if uid := obj.GetLabels()[toolnexusv1alpha1.RootRunUIDLabel]; uid != "" {
		return []string{uid}
	}
	return nil
}

// openRequest reports whether a request still waits for an answer.
func openRequest(preq *toolnexusv1alpha1.PendingRequest) bool {
	return preq.Status.Answer == nil && preq.Status.Phase != toolnexusv1alpha1.RequestPhaseCancelled
}

// openBelow lists the open requests of the runs a root run delegated to, at any depth, oldest
// first, for the root's status.pending.
func (r *Reconciler) openBelow(ctx context.Context, s *scope) ([]toolnexusv1alpha1.PendingSummary, error) {
	if s.run.Spec.DelegatedBy != nil || s.rec.State.Ended() {
		return nil, nil
	}
	var list toolnexusv1alpha1.PendingRequestList
	if err := r.List(ctx, &list, client.InNamespace(s.run.Namespace), client.MatchingFields{rootRunIndexField: string(s.run.UID)}); err != nil {
		return nil, fmt.Errorf("listing the requests of the run's sub-runs: %w", err)
	}
	items := list.Items
	slices.SortStableFunc(items, func(a, b toolnexusv1alpha1.PendingRequest) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	var out []toolnexusv1alpha1.PendingSummary
	for i := range items {
		p := &items[i]
		if !openRequest(p) {
			continue
		}
		rq := p.Spec.Request
		out = append(out, toolnexusv1alpha1.PendingSummary{Name: p.Name, Kind: rq.Kind, Prompt: clip.Marked(rq.Prompt, maxStatusPrompt),
			URL: rq.URL, ToolCallID: p.Spec.ToolCall.ID, Run: p.Spec.RunRef.Name})
	}
	return out, nil
}

// cancelWaitedChild cancels the child a call stopped waiting on (Settle's EffectCancelWait: the
// wait outlived its deadline, or the run ended). A cancel that fails is taken again by the next
// reconcile's sweep (childrenPhase, reconcileFinished).
func (r *Reconciler) cancelWaitedChild(ctx context.Context, s *scope, name, why string) {
	log := ctrl.LoggerFrom(ctx).WithValues("run", klog.KObj(s.run), "child", name)
	child, err := r.liveChild(ctx, s.run.Namespace, name)
	if err != nil {
		log.Error(err, "Cannot read the sub-run to cancel it; the next reconcile tries again")
		return
	}
	if child == nil || !metav1.IsControlledBy(child, s.run) {
		return
	}
	if err := r.cancelChild(ctx, s.run, child, why); err != nil {
		log.Error(err, "Cannot cancel the sub-run; the next reconcile tries again")
	}
}

// What wakes a parent about its children: a child that ended (its call looks at it) or is gone,
// and a child that goes on while its parent ended, is cancelled or is gone (it cancels the child).

// childChanged passes the events of runs that may matter to their parent: any create (the cache
// starting, or a child made while its parent was being cancelled), a change of whether the run
// ended or is cancelled, and a deletion.
func childChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return metav1.GetControllerOf(e.Object) != nil },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*toolnexusv1alpha1.AgentRun)
			n, ok2 := e.ObjectNew.(*toolnexusv1alpha1.AgentRun)
			return ok1 && ok2 && metav1.GetControllerOf(n) != nil && (finished(o) != finished(n) || o.Spec.Cancel != n.Spec.Cancel)
		},
		DeleteFunc:  func(e event.DeleteEvent) bool { return metav1.GetControllerOf(e.Object) != nil },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// parentOfChild maps a child run to its parent when the parent has something to do about it: the
// child ended or is gone (the parent's call looks at it), or the parent ended, is cancelled or is
// gone while the child goes on (the parent cancels it).
func (r *Reconciler) parentOfChild(ctx context.Context, obj client.Object) []reconcile.Request {
	owner := metav1.GetControllerOf(obj)
	child, ok := obj.(*toolnexusv1alpha1.AgentRun)
	if owner == nil || owner.Kind != "AgentRun" || !ok || child.Spec.DelegatedBy == nil {
		return nil
	}
	wake := []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: child.Namespace, Name: owner.Name}}}
	if finished(child) || !child.DeletionTimestamp.IsZero() {
		return wake
	}
	parent := &toolnexusv1alpha1.AgentRun{}
	if err := r.Get(ctx, wake[0].NamespacedName, parent); err != nil || parent.UID != owner.UID || finished(parent) || parent.Spec.Cancel {
		return wake
	}
	return nil
}

// requestOfSubRun passes the events of a delegated run's requests that change its root's
// status.pending: one opens, closes, or is deleted.
func requestOfSubRun() predicate.Predicate {
	delegated := func(o client.Object) bool { return o.GetLabels()[toolnexusv1alpha1.RootRunUIDLabel] != "" }
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return delegated(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*toolnexusv1alpha1.PendingRequest)
			n, ok2 := e.ObjectNew.(*toolnexusv1alpha1.PendingRequest)
			return ok1 && ok2 && delegated(n) && openRequest(o) != openRequest(n)
		},
		DeleteFunc:  func(e event.DeleteEvent) bool { return delegated(e.Object) },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// rootOfRequest maps a delegated run's request to the root run, the first of its path.
func rootOfRequest(_ context.Context, obj client.Object) []reconcile.Request {
	preq, ok := obj.(*toolnexusv1alpha1.PendingRequest)
	if !ok {
		return nil
	}
	path := preq.RunPath()
	if len(path) < 2 {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: preq.Namespace, Name: path[0]}}}
}

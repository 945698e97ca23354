// Package controller holds the AgentRun reconciler: it reads objects, drives the durable step
// machine of internal/loop, writes status, creates PendingRequests and emits events. Decisions
// about the loop live in internal/loop; this package only does the I/O around them.
package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
)

// Backoff of transient model failures (SPEC §6): base doubled per consecutive failure, capped.
const (
	retryBase = loop.DefaultRetryBase
	// nextStep is the requeue delay of a running run whose reconcile ended so that runs share the
	// workers fairly.
	nextStep = time.Millisecond
	// turnBudget is how long one reconcile may keep taking turns: fast models and tools finish
	// several turns with one status write, slow ones one turn per reconcile.
	turnBudget = 250 * time.Millisecond
)

// Event reasons.
const (
	EventRunStarted      = "RunStarted"
	EventToolSuspended   = "ToolSuspended"
	EventRequestAnswered = "RequestAnswered"
	EventRequestExpired  = "RequestExpired"
	EventRequestDeleted  = "RequestDeleted"
	EventInvalidAnswer   = "InvalidAnswer"
	EventRunSucceeded    = "RunSucceeded"
	EventRunIncomplete   = "RunIncomplete"
	EventRunFailed       = "RunFailed"
	EventRunCancelled    = "RunCancelled"
	EventModelRetrying   = "ModelRetrying"
)

const (
	secretNamesIndexField = "spec.secretNames"
	ownerRunIndexField    = "metadata.ownerRun"
	actionStep            = "Step"
	actionAnswer          = "Answer"
)

// AgentRunReconciler runs AgentRuns step by step.
type AgentRunReconciler struct {
	client.Client
	// APIReader reads around the cache: the run's record and Secrets.
	APIReader  client.Reader
	Scheme     *runtime.Scheme
	Recorder   events.EventRecorder
	Clock      clock.PassiveClock
	HTTPClient *http.Client
	Metrics    *Metrics
	// MaxConcurrentReconciles is the number of runs stepped at once.
	MaxConcurrentReconciles int
	// MaxTranscriptBytes bounds a run's stored transcript, compressed; 0 means
	// DefaultMaxTranscriptBytes. A run that outgrows it fails with TranscriptTooLarge.
	MaxTranscriptBytes int
	// MaxTranscriptRawBytes bounds a run's transcript decoded; 0 means
	// DefaultMaxTranscriptRawBytes. A run that outgrows it fails with TranscriptTooLarge.
	MaxTranscriptRawBytes int
	// MaxToolCallsPerTurn bounds the tool calls of one model turn that run; 0 means
	// loop.DefaultMaxToolCallsPerTurn.
	MaxToolCallsPerTurn int
	// RequireSecretLabel lets runs read only Secrets labelled toolnexus.dev/agentrun-access=true.
	RequireSecretLabel bool
}

var _ reconcile.Reconciler = (*AgentRunReconciler)(nil)

// Why each permission is there (the manager's ClusterRole is generated from these markers):
//   - agentruns get/list/watch: the work queue; delete: ttlSecondsAfterFinished.
//   - agentruns/status get/patch: the run's status; agentruns/finalizers update: the controller
//     owner references it sets on requests and records (clusters that enforce
//     OwnerReferencesPermissionEnforcement require it).
//   - pendingrequests get/list/watch/create: one request per suspended call, watched for answers.
//   - pendingrequests/status get/patch: phase and conditions, and the expiry answer.
//   - agentrunrecords get/create/update/delete: the run's durable record. Only the manager may
//     write records (people get read access through the view role); delete removes a record
//     left by a deleted run of the same name.
//   - secrets get/list/watch: get resolves apiKeySecretRef and header valueFrom at call time;
//     list/watch feed a metadata-only informer (names, no values are cached) so a run waiting for
//     a missing Secret starts when it appears.
//   - events create/patch: transition events on runs.
//
// +kubebuilder:rbac:groups=toolnexus.dev,resources=agentruns,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=toolnexus.dev,resources=agentruns/status,verbs=get;patch
// +kubebuilder:rbac:groups=toolnexus.dev,resources=agentruns/finalizers,verbs=update
// +kubebuilder:rbac:groups=toolnexus.dev,resources=pendingrequests,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=toolnexus.dev,resources=pendingrequests/status,verbs=get;patch
// +kubebuilder:rbac:groups=toolnexus.dev,resources=agentrunrecords,verbs=get;create;update;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile takes the run one step further: it consumes answers, runs at most one model turn and
// its tool calls, persists the record after every step, and only then projects the saved state
// onto the run's PendingRequests and status.
func (r *AgentRunReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	run := &toolnexusv1alpha1.AgentRun{}
	if err := r.Get(ctx, req.NamespacedName, run); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !run.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	if finished(run) {
		return r.reconcileFinished(ctx, run)
	}
	rec, err := r.loadRecord(ctx, run)
	var bad *corruptError
	if errors.As(err, &bad) {
		// The run cannot go on; its status says why, its requests are closed, and nothing runs.
		rec = &runRecord{State: loop.NewState(run.Spec.Prompt), head: &toolnexusv1alpha1.AgentRunRecord{}}
		rec.State.End(bad.reason, truncate(bad.Error(), 1024))
	} else if err != nil {
		return ctrl.Result{}, err
	}
	s := &scope{run: run, before: run.DeepCopy(), rec: rec, now: r.Clock.Now()}
	if s.requests, err = r.requestsOf(ctx, run); err != nil {
		return ctrl.Result{}, err
	}

	result, err := r.advance(ctx, s)
	if err == nil && s.dirty {
		err = r.save(ctx, s)
	}
	if err != nil || s.gone {
		return ctrl.Result{}, err
	}
	if err := r.project(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if finished(run) {
		return r.reconcileFinished(ctx, run)
	}
	return result, nil
}

// project writes what the saved state says onto the run's requests and status, then records the
// events of what changed. It runs only when nothing unsaved is left, so a request is never marked
// Resolved and a run never reported on the strength of a state that could still be lost.
func (r *AgentRunReconciler) project(ctx context.Context, s *scope) error {
	if err := r.syncRequests(ctx, s); err != nil {
		return err
	}
	setStatus(s.run, s.rec, openSummaries(s), s.progress, s.now)
	if _, err := patchStatus(ctx, r.Client, s.run, s.before); err != nil {
		return err
	}
	s.emitEvents()
	r.emitTransitions(s)
	return nil
}

// scope is what one reconcile of one run has read and decided.
type scope struct {
	run    *toolnexusv1alpha1.AgentRun
	before *toolnexusv1alpha1.AgentRun
	rec    *runRecord
	// requests are the run's PendingRequests by name, from the cache.
	requests map[string]*toolnexusv1alpha1.PendingRequest
	progress progress
	now      time.Time
	// dirty is set when the state changed since it was last saved.
	dirty bool
	// events are recorded once the writes they report have been made.
	events []func()
	// gone is set when the run was deleted while this reconcile worked on it.
	gone bool
}

// event queues an event to record after this reconcile's writes.
func (s *scope) event(f func()) { s.events = append(s.events, f) }

func (s *scope) emitEvents() {
	for _, f := range s.events {
		f()
	}
}

// runGone reports whether the run was deleted (or replaced by a namesake) meanwhile. The cache
// is fresh enough: it sees a deletion within milliseconds, and the model turn this guards takes
// longer.
func (r *AgentRunReconciler) runGone(ctx context.Context, run *toolnexusv1alpha1.AgentRun) (bool, error) {
	current := &toolnexusv1alpha1.AgentRun{}
	err := r.Get(ctx, client.ObjectKeyFromObject(run), current)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return current.UID != run.UID || !current.DeletionTimestamp.IsZero(), nil
}

// advance consumes answers and takes steps. It returns when the run waits (for an answer, a
// Secret, a backoff) or after one full turn, with the requeue that continues it. State it changed
// and did not save is marked dirty; Reconcile saves it.
func (r *AgentRunReconciler) advance(ctx context.Context, s *scope) (ctrl.Result, error) {
	st := s.rec.State
	if s.run.Spec.Cancel && !st.Ended() {
		st.End(toolnexusv1alpha1.ReasonCancelled, "The run was cancelled (spec.cancel)")
		s.dirty = true
	}
	if st.Ended() {
		return ctrl.Result{}, nil
	}
	// Announce first: a request created just before a crash may already carry an answer.
	if err := r.announce(ctx, s); err != nil || st.Ended() {
		return ctrl.Result{}, err
	}
	if err := r.consumeAnswers(ctx, s); err != nil || st.Ended() {
		return ctrl.Result{}, err
	}
	if next := st.Next(); next != loop.ActionModelTurn && next != loop.ActionToolCalls {
		// Parked: answers and deletions wake the run, and so does the nearest expiry.
		return requeueAt(nearestExpiry(s), s.now), nil
	}

	rt, err := r.buildRuntime(ctx, s.run, r.Metrics.observe)
	var missing *missingSecretError
	var invalid *specError
	switch {
	case errors.As(err, &missing):
		s.progress.reason, s.progress.message = missing.reason, missing.Error()
		return ctrl.Result{}, nil // the Secret watch wakes the run
	case errors.As(err, &invalid):
		st.End(toolnexusv1alpha1.ReasonInvalidSpec, invalid.Error())
		s.dirty = true
		return ctrl.Result{}, nil
	case err != nil:
		return ctrl.Result{}, err
	}
	s.progress.toolsBuilt, s.progress.mcpFailures = true, rt.mcpFailures

	for {
		res, err := rt.client.Step(ctx, st, rt.toolkit)
		if err != nil {
			return r.stepFailed(ctx, s, err)
		}
		if err := r.save(ctx, s); err != nil || st.Ended() {
			return ctrl.Result{}, err
		}
		if err := r.announce(ctx, s); err != nil || st.Ended() {
			return ctrl.Result{}, err
		}
		next := st.Next()
		if next == loop.ActionToolCalls && res.Action == loop.ActionModelTurn {
			// Deleting a run is how a user stops it: a model turn that was in flight must not
			// lead to tool calls.
			if gone, err := r.runGone(ctx, s.run); err != nil || gone {
				s.gone = gone
				return ctrl.Result{}, err
			}
			continue // the tool calls of the turn just taken
		}
		// MCP tool lists are fetched once per reconcile, so a run with MCP servers starts each turn
		// in a new reconcile and the model sees the servers' tools as they are now.
		if next == loop.ActionModelTurn && len(s.run.Spec.MCPServers) == 0 && r.Clock.Since(s.now) < turnBudget {
			continue
		}
		if next == loop.ActionModelTurn || next == loop.ActionToolCalls {
			return ctrl.Result{RequeueAfter: nextStep}, nil
		}
		return requeueAt(nearestExpiry(s), s.now), nil
	}
}

// stepFailed handles a failed model request: transient failures back off through a requeue (no
// worker is blocked), others end the run with the provider's redacted message.
func (r *AgentRunReconciler) stepFailed(ctx context.Context, s *scope, err error) (ctrl.Result, error) {
	if ctx.Err() != nil {
		// The manager is stopping: the step did not happen, and the next leader repeats it.
		return ctrl.Result{}, err
	}
	var invalid *specError
	if errors.As(err, &invalid) {
		s.rec.State.End(toolnexusv1alpha1.ReasonInvalidSpec, truncate(invalid.Error(), 2048))
		s.dirty = true
		return ctrl.Result{}, nil
	}
	retries := 0
	if s.run.Spec.Model.Retries != nil { // defaulted by the CRD
		retries = int(*s.run.Spec.Model.Retries)
	}
	st := s.rec.State
	s.dirty = true
	delay, retry, msg := loop.ModelFailed(st, err, retries, retryBase)
	if !retry {
		st.End(toolnexusv1alpha1.ReasonModelError, truncate(msg, 2048))
		return ctrl.Result{}, nil
	}
	s.progress.reason = toolnexusv1alpha1.ReasonModelRetrying
	s.progress.message = fmt.Sprintf("Model request failed (attempt %d of %d), retrying in %s: %v", st.ModelFailures, retries+1, delay, err)
	s.event(func() {
		r.Recorder.Eventf(s.run, nil, corev1.EventTypeWarning, EventModelRetrying, actionStep, "%s", truncate(s.progress.message, 1024))
	})
	return ctrl.Result{RequeueAfter: delay}, nil
}

// save persists the record; a record too large to store ends the run with TranscriptTooLarge.
func (r *AgentRunReconciler) save(ctx context.Context, s *scope) error {
	err := r.saveRecord(ctx, s.run, s.rec)
	if errors.Is(err, errRecordTooLarge) {
		// What could not be stored ends here: status is the run's last word.
		s.rec.State.End(toolnexusv1alpha1.ReasonTranscriptTooLarge,
			fmt.Sprintf("The run stopped: %v (%d MiB compressed, %d MiB decoded); reduce tool output or maxTurns",
				err, r.maxTranscriptBytes()>>20, r.maxTranscriptRawBytes()>>20))
		s.dirty = false
		return nil
	}
	var bad *corruptError
	if errors.As(err, &bad) {
		s.rec.State.End(bad.reason, truncate(bad.Error(), 1024))
		s.dirty = false
		return nil
	}
	if err != nil {
		return err
	}
	s.dirty = false
	return nil
}

// reconcileFinished deletes a finished run once ttlSecondsAfterFinished has passed.
func (r *AgentRunReconciler) reconcileFinished(ctx context.Context, run *toolnexusv1alpha1.AgentRun) (ctrl.Result, error) {
	ttl := run.Spec.TTLSecondsAfterFinished
	if ttl == nil || run.Status.CompletionTime == nil {
		return ctrl.Result{}, nil
	}
	deadline := run.Status.CompletionTime.Add(time.Duration(*ttl) * time.Second)
	if wait := deadline.Sub(r.Clock.Now()); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	ctrl.LoggerFrom(ctx).V(1).Info("Deleting finished run after its TTL", "run", klog.KObj(run))
	return ctrl.Result{}, client.IgnoreNotFound(r.Delete(ctx, run, client.PropagationPolicy("Background")))
}

// emitTransitions records the events of the run's status transitions, from the difference between
// the status before this reconcile and the one just written.
func (r *AgentRunReconciler) emitTransitions(s *scope) {
	before, after := conditionOf(s.before, toolnexusv1alpha1.ConditionSucceeded), conditionOf(s.run, toolnexusv1alpha1.ConditionSucceeded)
	if s.before.Status.StartTime == nil && s.run.Status.StartTime != nil {
		r.Recorder.Eventf(s.run, nil, corev1.EventTypeNormal, EventRunStarted, actionStep, "Run started with model %s", s.run.Spec.Model.Name)
	}
	waiting := after.Reason == toolnexusv1alpha1.ReasonSecretNotFound || after.Reason == toolnexusv1alpha1.ReasonSecretNotAllowed
	if waiting && before.Reason != after.Reason {
		r.Recorder.Eventf(s.run, nil, corev1.EventTypeWarning, after.Reason, actionStep, "%s; the run starts when it is resolved", after.Message)
	}
	if finished(s.before) || !finished(s.run) {
		return
	}
	switch after.Reason {
	case toolnexusv1alpha1.ReasonCompleted:
		r.Recorder.Eventf(s.run, nil, corev1.EventTypeNormal, EventRunSucceeded, actionStep, "Run succeeded after %d turns", s.run.Status.Turns)
	case toolnexusv1alpha1.ReasonMaxTurns:
		r.Recorder.Eventf(s.run, nil, corev1.EventTypeWarning, EventRunIncomplete, actionStep, "%s", after.Message)
	case toolnexusv1alpha1.ReasonCancelled:
		r.Recorder.Eventf(s.run, nil, corev1.EventTypeNormal, EventRunCancelled, actionStep, "%s", after.Message)
	default:
		r.Metrics.runErrors.WithLabelValues(after.Reason).Inc()
		r.Recorder.Eventf(s.run, nil, corev1.EventTypeWarning, EventRunFailed, actionStep, "%s: %s", after.Reason, truncate(after.Message, 1024))
	}
}

func requeueAt(t, now time.Time) ctrl.Result {
	if t.IsZero() {
		return ctrl.Result{}
	}
	wait := t.Sub(now)
	if wait <= 0 {
		wait = nextStep
	}
	return ctrl.Result{RequeueAfter: wait}
}

// SetupWithManager registers the reconciler and its watches: AgentRuns (spec changes only),
// answers to and deletions of their PendingRequests, and the appearance of Secrets they wait for.
func (r *AgentRunReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil || r.Recorder == nil || r.Clock == nil || r.Metrics == nil {
		return errors.New("AgentRunReconciler needs APIReader, Recorder, Clock and Metrics")
	}
	if r.HTTPClient == nil {
		r.HTTPClient = defaultHTTPClient()
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &toolnexusv1alpha1.AgentRun{}, secretNamesIndexField, secretNames); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &toolnexusv1alpha1.PendingRequest{}, ownerRunIndexField, runOfRequest); err != nil {
		return err
	}
	return builder.ControllerManagedBy(mgr).
		For(&toolnexusv1alpha1.AgentRun{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&toolnexusv1alpha1.PendingRequest{}, builder.WithPredicates(answerOrDeletion())).
		WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.runsWaitingFor),
			builder.WithPredicates(predicate.Funcs{DeleteFunc: func(event.DeleteEvent) bool { return false }})).
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

// runOfRequest indexes a PendingRequest by the run that controls it, so a run finds its requests
// without scanning every request of the namespace.
func runOfRequest(obj client.Object) []string {
	if owner := metav1.GetControllerOf(obj); owner != nil && owner.Kind == "AgentRun" {
		return []string{owner.Name}
	}
	return nil
}

// secretNames indexes a run by the Secrets it references.
func secretNames(obj client.Object) []string {
	run, ok := obj.(*toolnexusv1alpha1.AgentRun)
	if !ok {
		return nil
	}
	var names []string
	if ref := run.Spec.Model.APIKeySecretRef; ref != nil {
		names = append(names, ref.Name)
	}
	headers := func(hs []toolnexusv1alpha1.HTTPHeader) {
		for _, h := range hs {
			if h.ValueFrom != nil {
				names = append(names, h.ValueFrom.SecretKeyRef.Name)
			}
		}
	}
	for _, t := range run.Spec.Tools {
		if t.HTTP != nil {
			headers(t.HTTP.Headers)
		}
	}
	for _, s := range run.Spec.MCPServers {
		headers(s.Headers)
	}
	return names
}

// runsWaitingFor maps a Secret to the active runs of its namespace that reference it.
func (r *AgentRunReconciler) runsWaitingFor(ctx context.Context, secret client.Object) []reconcile.Request {
	var runs toolnexusv1alpha1.AgentRunList
	if err := r.List(ctx, &runs, client.InNamespace(secret.GetNamespace()),
		client.MatchingFields{secretNamesIndexField: secret.GetName()}); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range runs.Items {
		if !finished(&runs.Items[i]) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&runs.Items[i])})
		}
	}
	return out
}

func conditionOf(run *toolnexusv1alpha1.AgentRun, t string) metav1.Condition {
	if c := meta.FindStatusCondition(run.Status.Conditions, t); c != nil {
		return *c
	}
	return metav1.Condition{}
}

func conditionReason(run *toolnexusv1alpha1.AgentRun, t string) string {
	return conditionOf(run, t).Reason
}

// Package agentrun is the AgentRun controller's room: a reconcile reads the run, its record and its
// requests, asks the loop's state what they mean (state.Settle), carries out what it says, hands the
// run's next step to the executor, saves the record once the state changed and projects it onto
// the run's requests and status. Decisions live in internal/loop/state; this package does the I/O
// around them.
package agentrun

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
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/controller/metrics"
	"github.com/toolnexus/operator/internal/controller/policy"
	"github.com/toolnexus/operator/internal/controller/runspec"
	"github.com/toolnexus/operator/internal/executor"
	"github.com/toolnexus/operator/internal/kube"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/oauth"
	"github.com/toolnexus/operator/internal/runstore"
	"github.com/toolnexus/operator/internal/telemetry"
)

const (
	// retryBase is the first backoff delay of a transient model failure (doubled per failure).
	retryBase = loop.DefaultRetryBase
	// secretRecheck is how often a run waiting for a Secret looks again by itself. The Secret's
	// watch wakes it at once; this covers a Secret that appears before the cache shows the run
	// waiting for it (the watch only wakes runs that wait).
	secretRecheck = time.Minute
	// nameRecheck is how often a run whose request name is held by a previous run's request,
	// deleted but kept for its audit events, looks again (the deletion itself wakes it too).
	nameRecheck = 10 * time.Second
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
	agentRefIndexField    = "spec.agentRef.name"
	ownerRunIndexField    = "metadata.ownerRun"
	rootRunIndexField     = "metadata.rootRun"
	actionStep            = "Step"
	actionAnswer          = "Answer"
)

// Reconciler runs AgentRuns step by step.
type Reconciler struct {
	client.Client
	// APIReader reads around the cache: the run's record and Secrets.
	APIReader  client.Reader
	Scheme     *runtime.Scheme
	Recorder   events.EventRecorder
	Clock      clock.PassiveClock
	HTTPClient *http.Client
	Metrics    *metrics.Metrics
	// MaxConcurrentReconciles is the number of runs stepped at once.
	MaxConcurrentReconciles int
	// MaxTranscriptBytes bounds a run's stored transcript, compressed; 0 means
	// runstore.DefaultMaxBytes. A run that outgrows it fails with TranscriptTooLarge.
	MaxTranscriptBytes int
	// MaxTranscriptRawBytes bounds a run's transcript decoded; 0 means
	// runstore.DefaultMaxRawBytes. A run that outgrows it fails with TranscriptTooLarge.
	MaxTranscriptRawBytes int
	// MaxToolCallsPerTurn bounds the tool calls of one model turn that run; 0 means
	// loop.DefaultMaxToolCallsPerTurn.
	MaxToolCallsPerTurn int
	// RequireSecretLabel lets runs read only Secrets labelled toolnexus.dev/agentrun-access=true.
	RequireSecretLabel bool
	// Tracing writes each run's trace; nil writes none.
	Tracing *telemetry.Tracing
	// Policies are the platform's ApprovalPolicies, asked at every tool call; nil gates nothing
	// beyond a run's own approvals.
	Policies Policies
	// Audit creates every PendingRequest with the audit finalizer (--audit-sink-url).
	Audit bool
	// Logins completes the logins of tools with auth.oauth and keeps their tokens; nil fails
	// their calls saying so.
	Logins *oauth.Host

	// Executor runs the steps, bounded and fair across namespaces; the manager runs it while it
	// leads.
	Executor *executor.Executor
	steps    *steps
	store    *runstore.Store
}

var _ reconcile.Reconciler = (*Reconciler)(nil)

// Policies says which ApprovalPolicies gate a call of a run in namespace with runLabels
// (policy.Registry).
type Policies interface {
	Check(ctx context.Context, call policy.Call) ([]policy.Gate, error)
}

// Why each permission is there (the manager's ClusterRole is generated from these markers):
//   - agentruns get/list/watch: the work queue; delete: ttlSecondsAfterFinished; create: the
//     child run of a sub-agent call; patch: its spec.cancel when the parent stops waiting on it,
//     and the external-work finalizer, held while a run waits on an MCP task (release.go).
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
// +kubebuilder:rbac:groups=toolnexus.dev,resources=agentruns,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=toolnexus.dev,resources=agentruns/status,verbs=get;patch
// +kubebuilder:rbac:groups=toolnexus.dev,resources=agentruns/finalizers,verbs=update
// +kubebuilder:rbac:groups=toolnexus.dev,resources=pendingrequests,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=toolnexus.dev,resources=pendingrequests/status,verbs=get;patch
// +kubebuilder:rbac:groups=toolnexus.dev,resources=agentrunrecords,verbs=get;create;update;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile takes the run one step further. It opens the run (the run, its record, its requests,
// the spec it runs with), then goes through its phases in order; the record is saved between two
// phases when the phase before asks for it, and the phases stop at the first that says the run
// waits. Whatever happens, the deferred close saves what is left unsaved and only then projects
// the saved state onto the run's PendingRequests and status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	defer func() { res.Priority = ptr.To(requeuePriority) }()
	s, res, err := r.open(ctx, req)
	if s == nil {
		return res, err
	}
	// What the step read is counted against the executor's memory until it is saved, or dropped
	// with this reconcile.
	defer s.outcome.release()
	defer func() { res, err = r.close(ctx, s, res, err) }()
	for _, phase := range []phase{r.snapshotPhase, r.inFlightPhase, r.stepEndPhase, r.announcePhase, r.childrenPhase,
		r.answersPhase, r.preparePhase, r.startPhase, r.submitPhase} {
		out, err := phase(ctx, s)
		if err != nil {
			return ctrl.Result{}, err
		}
		if out.save {
			if err := r.save(ctx, s); err != nil {
				return ctrl.Result{}, err
			}
		}
		if out.wait || s.rec.State.Ended() {
			return out.result, nil
		}
	}
	return ctrl.Result{}, nil
}

// A phase is one part of a reconcile (Reconcile lists them in order). It reports whether the
// record must be saved before the next one, and whether the run now waits, with the requeue that
// continues it; state it changes and does not ask to save is saved by close, unless a step took it
// along (then the step's outcome, which holds it, is saved).
type phase func(context.Context, *scope) (phaseOut, error)

type phaseOut struct {
	result ctrl.Result
	save   bool
	wait   bool
}

// waits is the phaseOut of a run that waits, looked at again as result says.
func waits(result ctrl.Result) phaseOut { return phaseOut{result: result, wait: true} }

// open reads what a reconcile of the run needs: the run, the outcome of its last step, its record
// and its requests. It returns no scope when there is nothing to step (the run is gone, being
// deleted or finished: then res and err are the reconcile's).
func (r *Reconciler) open(ctx context.Context, req ctrl.Request) (*scope, ctrl.Result, error) {
	run := &toolnexusv1alpha1.AgentRun{}
	err := r.Get(ctx, req.NamespacedName, run)
	if apierrors.IsNotFound(err) || (err == nil && (!run.DeletionTimestamp.IsZero() || finished(run))) {
		// Deleting a run is how a user stops it: a step in flight is aborted, and its outcome
		// (a model turn's tool calls among it) is never applied.
		r.Executor.Cancel(req.String())
		r.steps.forget(req.NamespacedName)
		r.store.Forget(req.NamespacedName)
		r.Metrics.Waits.Set(req.Namespace, req.String(), nil)
	}
	if apierrors.IsNotFound(err) {
		return nil, ctrl.Result{}, r.cancelOrphans(ctx, req.NamespacedName)
	}
	if err != nil {
		return nil, ctrl.Result{}, err
	}
	if !run.DeletionTimestamp.IsZero() {
		if err := r.cancelChildren(ctx, run, nil, "the run that started it is being deleted"); err != nil {
			return nil, ctrl.Result{}, err
		}
		res, err := r.releaseWaits(ctx, run)
		return nil, res, err
	}
	if finished(run) {
		res, err := r.reconcileFinished(ctx, run)
		return nil, res, err
	}
	// The step in flight, if any, is seen once: its outcome is taken only when its job has ended,
	// and then applied to the record it started from.
	key := runKey(run)
	busy := r.Executor.Busy(key.String())
	var outcome *stepOutcome
	if !busy {
		outcome = r.steps.take(key, run.UID)
	}
	// A finished step's outcome is applied to the record it started from, as the reconcile that
	// submitted it left it: no read, so nothing can fail between taking the outcome and applying it.
	var rec *runstore.Record
	if outcome != nil {
		rec = outcome.from
	} else {
		rec, err = r.store.Load(ctx, run)
	}
	var bad *runstore.CorruptError
	if errors.As(err, &bad) {
		// The run cannot go on; its status says why, its requests are closed, and nothing runs.
		rec = &runstore.Record{State: loop.NewState(run.Spec.Prompt), Head: &toolnexusv1alpha1.AgentRunRecord{}}
		rec.State.End(bad.Reason, clip.Marked(bad.Error(), 1024))
	} else if err != nil {
		outcome.release()
		return nil, ctrl.Result{}, err
	}
	s := &scope{run: run, before: run.DeepCopy(), rec: rec, now: r.Clock.Now(), busy: busy, outcome: outcome,
		startedAtLoad: rec.Started(), endedAtLoad: bad == nil && rec.State.Ended()}
	if s.requests, err = r.requestsOf(ctx, run); err != nil {
		outcome.release()
		return nil, ctrl.Result{}, err
	}
	return s, ctrl.Result{}, nil
}

// close ends a reconcile that opened a scope: unless a phase failed or a step took the unsaved
// state along (its outcome is saved and projected when it ends), it saves what is unsaved, then
// projects the saved state. res is what the phases decided.
func (r *Reconciler) close(ctx context.Context, s *scope, res ctrl.Result, err error) (ctrl.Result, error) {
	if err != nil || (s.dirty && s.inflight) {
		return ctrl.Result{}, err
	}
	if s.dirty {
		if err := r.save(ctx, s); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := r.store.CheckUnread(ctx, s.run, s.rec); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.project(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	if finished(s.run) {
		return r.reconcileFinished(ctx, s.run)
	}
	return res, nil
}

// project writes what the saved state says onto the run's requests and status, then records the
// events of what changed. It runs only when nothing unsaved is left, so a request is never marked
// Resolved and a run never reported on the strength of a state that could still be lost.
func (r *Reconciler) project(ctx context.Context, s *scope) error {
	if err := r.syncRequests(ctx, s); err != nil {
		return err
	}
	below, err := r.openBelow(ctx, s)
	if err != nil {
		return err
	}
	setStatus(s.run, s.rec, append(openSummaries(s), below...), s.progress, s.now)
	key := runKey(s.run)
	r.Metrics.Waits.Set(key.Namespace, key.String(), waitsOf(s.rec.State))
	if _, err := r.holdWhileWaiting(ctx, s); err != nil { // a conflict is taken again by the next look
		return err
	}
	r.owe(s) // an end no record holds (the record was unreadable) is reported all the same
	if s.inflight && !finished(s.run) && progressOnly(&s.before.Status, &s.run.Status) && !r.steps.reportDue(key, s.run.UID, s.now) {
		// A running run's counters are reported at most every statusInterval; the record holds them.
		s.emitEvents()
		return nil
	}
	patched, err := kube.PatchStatus(ctx, r.Client, s.run, s.before)
	if apierrors.IsNotFound(err) {
		return nil // deleted while this reconcile worked on it: nothing is left to report on
	}
	if err != nil {
		return err
	}
	if patched {
		r.steps.reportedAt(key, s.run.UID, s.now)
	}
	s.emitEvents()
	started, ended := r.steps.shown(key, s.run.UID)
	r.emitTransitions(ctx, s, started, ended)
	return nil
}

// scope is what one reconcile of one run has read and decided.
type scope struct {
	run    *toolnexusv1alpha1.AgentRun
	before *toolnexusv1alpha1.AgentRun
	rec    *runstore.Record
	// spec is what the run runs with: its own spec, or for a run of an Agent the Agent's snapshot
	// with the run's prompt and maxTurns. Every use of the agent's fields reads it.
	spec *toolnexusv1alpha1.AgentRunSpec
	// requests are the run's PendingRequests by name, from the cache.
	requests map[string]*toolnexusv1alpha1.PendingRequest
	progress progress
	now      time.Time
	// dirty is set when the state changed since it was last saved.
	dirty bool
	// events are recorded once the writes they report have been made.
	events []func()
	// inflight is set when a step of the run is in the executor.
	inflight bool
	// busy says a step of the run was in the executor when the reconcile began, and outcome is
	// what the run's last step left when it was not.
	busy    bool
	outcome *stepOutcome
	// stepper is the next step's spec, once preparePhase built it.
	stepper *stepper
	// startedAtLoad and endedAtLoad say whether the record was saved, and saved ended, when the
	// reconcile began: the run's start and end events are owed by the reconcile that saved them,
	// whatever the cache's copy of the status says (see steps.owe).
	startedAtLoad, endedAtLoad bool
}

// event queues an event to record after this reconcile's writes.
func (s *scope) event(f func()) { s.events = append(s.events, f) }

func (s *scope) emitEvents() {
	for _, f := range s.events {
		f()
	}
}

// snapshotPhase resolves the spec the run runs with; a snapshot just taken of its Agent is saved
// before anything else. A run whose Agent does not exist waits for it, unless it is cancelled.
func (r *Reconciler) snapshotPhase(ctx context.Context, s *scope) (phaseOut, error) {
	found, took, err := r.resolveSpec(ctx, s)
	if err != nil || (!found && !s.run.Spec.Cancel) {
		return waits(ctrl.Result{}), err // the Agent's watch wakes the run
	}
	return phaseOut{save: took}, nil
}

// inFlightPhase: a run whose step is in the executor waits for its end, which wakes it; a
// cancellation goes on, to abort it.
func (r *Reconciler) inFlightPhase(_ context.Context, s *scope) (phaseOut, error) {
	if s.busy && !s.run.Spec.Cancel {
		s.inflight = true
		return waits(ctrl.Result{}), nil
	}
	return phaseOut{}, nil
}

// stepEndPhase settles the end of the last step and a cancellation first: what the step left is
// saved before the requests of its suspensions are created. A backoff it decides is kept in the
// memo (notBefore, below); the answers that came while the step ran, which no event brings again,
// are taken next, in this reconcile.
func (r *Reconciler) stepEndPhase(ctx context.Context, s *scope) (phaseOut, error) {
	var end *state.StepEnd
	if o := s.outcome; o != nil {
		end = &state.StepEnd{State: o.state, Failure: failureOf(o.err)}
		s.progress.toolsBuilt, s.progress.mcp = o.toolsBuilt, o.mcp
		s.events = append(o.events, s.events...)
	}
	if end == nil && !s.run.Spec.Cancel {
		return phaseOut{}, nil
	}
	if _, err := r.settle(ctx, s, end, nil); err != nil || s.busy {
		return waits(ctrl.Result{}), err // a cancelled step in flight wakes the run as it ends
	}
	return phaseOut{save: end != nil}, nil
}

// announcePhase creates the requests of new suspensions, and saves which it created: a request
// created just before a crash may already carry an answer. A request whose name is held by a
// previous run's request, kept for its audit, waits for it.
func (r *Reconciler) announcePhase(ctx context.Context, s *scope) (phaseOut, error) {
	if err := r.announce(ctx, s); err != nil {
		return phaseOut{}, err
	}
	// An end it decided (a request it would adopt is not the run's) is saved by close, as every end.
	out := phaseOut{save: s.dirty && !s.rec.State.Ended()}
	if s.progress.reason == toolnexusv1alpha1.ReasonRequestNameInUse {
		out.wait, out.result = true, ctrl.Result{RequeueAfter: nameRecheck}
	}
	return out, nil
}

// answersPhase reads the run's requests as they are and settles them: answers consumed, declines,
// deletions, expiries. A parked run waits for answers and deletions, which wake it, and for the
// nearest expiry; a run backing off waits for the end of its backoff.
func (r *Reconciler) answersPhase(ctx context.Context, s *scope) (phaseOut, error) {
	seen, err := r.seen(ctx, s)
	if err != nil {
		return phaseOut{}, err
	}
	wake, err := r.settle(ctx, s, nil, seen)
	if err != nil || s.rec.State.Ended() {
		return phaseOut{}, err
	}
	if next := s.rec.State.Next(); next != loop.ActionModelTurn && next != loop.ActionToolCalls {
		return waits(kube.RequeueAt(wake, s.now)), nil
	}
	if at := r.steps.notBefore(runKey(s.run), s.run.UID, s.now); !at.IsZero() {
		return waits(kube.RequeueAt(at, s.now)), nil
	}
	return phaseOut{}, nil
}

// preparePhase builds the run's spec with its Secrets for the next step. A missing Secret makes
// the run wait (the Secret's watch wakes it); a spec that cannot run ends it.
func (r *Reconciler) preparePhase(ctx context.Context, s *scope) (phaseOut, error) {
	rt, err := r.prepare(ctx, s.run, s.spec, s.rec.State.Turn, r.Metrics.Observe)
	var missing *kube.MissingSecretError
	var invalid *runspec.Error
	switch {
	case errors.As(err, &missing):
		s.progress.reason, s.progress.message = missing.Reason, missing.Error()
		return waits(ctrl.Result{RequeueAfter: secretRecheck}), nil
	case errors.As(err, &invalid):
		s.rec.State.End(toolnexusv1alpha1.ReasonInvalidSpec, invalid.Error())
		s.dirty = true
		return phaseOut{}, nil
	case err != nil:
		return phaseOut{}, err
	}
	s.stepper = rt
	return phaseOut{}, nil
}

// startPhase: the record exists before the first step, as a run of an Agent's does with its
// snapshot; the run is started from then on, and its status says so in the same write.
func (r *Reconciler) startPhase(_ context.Context, s *scope) (phaseOut, error) {
	return phaseOut{save: !s.rec.Started()}, nil
}

// submitPhase hands the run's next step to the executor; its end wakes the run.
func (r *Reconciler) submitPhase(_ context.Context, s *scope) (phaseOut, error) {
	r.submitStep(s, s.stepper)
	s.inflight = true
	return waits(ctrl.Result{}), nil
}

// save persists the record; a record too large to store ends the run with TranscriptTooLarge.
func (r *Reconciler) save(ctx context.Context, s *scope) error {
	err := r.store.Save(ctx, s.run, s.rec)
	var tooLarge *runstore.TooLargeError
	if errors.As(err, &tooLarge) {
		// What could not be stored ends here: status is the run's last word.
		s.rec.State.End(toolnexusv1alpha1.ReasonTranscriptTooLarge,
			fmt.Sprintf("The run stopped: %v; reduce tool output or maxTurns", tooLarge))
		s.dirty = false
		r.owe(s)
		return nil
	}
	var bad *runstore.CorruptError
	if errors.As(err, &bad) {
		s.rec.State.End(bad.Reason, clip.Marked(bad.Error(), 1024))
		s.dirty = false
		r.owe(s)
		return nil
	}
	if err != nil {
		return err
	}
	s.dirty = false
	r.owe(s)
	return nil
}

// owe notes the start and end this reconcile saved (or, for an end that cannot be saved, decided:
// the status is then the run's last word). They are reported once a status patch shows them,
// whatever fails between the save and that patch (a request's update, a Secret's read).
func (r *Reconciler) owe(s *scope) {
	r.steps.owe(runKey(s.run), s.run.UID, !s.startedAtLoad && s.rec.Started(), !s.endedAtLoad && s.rec.State.Ended())
}

// reconcileFinished cancels what a finished run's sub-agent calls left going, and deletes the run
// once ttlSecondsAfterFinished has passed.
func (r *Reconciler) reconcileFinished(ctx context.Context, run *toolnexusv1alpha1.AgentRun) (ctrl.Result, error) {
	if err := r.cancelChildren(ctx, run, nil, "the run that started it ended"); err != nil {
		return ctrl.Result{}, err
	}
	if res, err := r.dropFinalizer(ctx, run); err != nil || !res.IsZero() {
		return res, err // a finished run waits on nothing: its end stopped its work
	}
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

// emitTransitions records the events of the run's transitions: its start and end when the status
// just written is the first to show what this process saved (the cache's copy of the status may
// not show the last patch yet, and an event must not repeat), and why it waits from the difference
// between the status before this reconcile and the one just written. The run's end also writes
// its span.
func (r *Reconciler) emitTransitions(ctx context.Context, s *scope, started, ended bool) {
	before, after := conditionOf(s.before, toolnexusv1alpha1.ConditionSucceeded), conditionOf(s.run, toolnexusv1alpha1.ConditionSucceeded)
	if started {
		r.Recorder.Eventf(s.run, nil, corev1.EventTypeNormal, EventRunStarted, actionStep, "Run started with model %s", s.spec.Model.Name)
	}
	waiting := after.Reason == toolnexusv1alpha1.ReasonSecretNotFound || after.Reason == toolnexusv1alpha1.ReasonSecretNotAllowed ||
		after.Reason == toolnexusv1alpha1.ReasonAgentNotFound
	if waiting && before.Reason != after.Reason {
		r.Recorder.Eventf(s.run, nil, corev1.EventTypeWarning, after.Reason, actionStep, "%s; the run starts when it is resolved", after.Message)
	}
	if !ended {
		return
	}
	failed := false
	switch after.Reason {
	case toolnexusv1alpha1.ReasonCompleted:
		r.Recorder.Eventf(s.run, nil, corev1.EventTypeNormal, EventRunSucceeded, actionStep, "Run succeeded after %d turns", s.run.Status.Turns)
	case toolnexusv1alpha1.ReasonMaxTurns:
		r.Recorder.Eventf(s.run, nil, corev1.EventTypeWarning, EventRunIncomplete, actionStep, "%s", after.Message)
	case toolnexusv1alpha1.ReasonCancelled:
		r.Recorder.Eventf(s.run, nil, corev1.EventTypeNormal, EventRunCancelled, actionStep, "%s", after.Message)
	default:
		failed = true
		r.Metrics.RunErrors.WithLabelValues(after.Reason).Inc()
		r.Recorder.Eventf(s.run, nil, corev1.EventTypeWarning, EventRunFailed, actionStep, "%s: %s", after.Reason, clip.Marked(after.Message, 1024))
	}
	r.traceEnd(ctx, s, failed)
}

func conditionOf(run *toolnexusv1alpha1.AgentRun, t string) metav1.Condition {
	if c := meta.FindStatusCondition(run.Status.Conditions, t); c != nil {
		return *c
	}
	return metav1.Condition{}
}

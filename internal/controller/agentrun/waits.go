package agentrun

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/executor"
	"github.com/toolnexus/operator/internal/kube"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/tools"
)

// A call waiting on external work (an MCP task, state.Wait) parks its run like a request does: no
// step is in flight and no connection is open. state.Settle marks the wait due when its poll time
// comes (the reconcile is requeued for it, at the interval the server asked for, bounded by the
// loop), and the run's next step is then the look (tasks/get), taken in the executor like any
// tool call. A restart finds the wait in the record and looks again; the call is never made
// again. When a call stops waiting on work that may go on (the run ended or was cancelled, the
// call was declined, the wait outlived its deadline), Settle says so and the work's holder is told
// to stop it (cancelWait). Deleting the run stops it too (releaseWaits, below).

// Event reasons of the work a run waits on: a tasks/cancel sent for a run, and the release of
// a deleted run that waited on work (ExternalWorkFinalizer).
const (
	EventTaskCancelled    = "TaskCancelled"
	EventTaskCancelFailed = "TaskCancelFailed"
	EventWorkReleased     = "ExternalWorkReleased"
)

// Deleting a run that waits on work: the run keeps ExternalWorkFinalizer while its saved state
// waits on external work (holdWhileWaiting), so its deletion is seen with its spec and record at
// hand; the deletion then stops the work (releaseWaits) and lets the run go. It never holds the
// run for long: each task gets stopAttempts tries of at most stopAttemptTimeout each, then the
// run goes whatever the servers said, with an event.
const (
	stopAttempts       = 3
	stopAttemptTimeout = 10 * time.Second
	// releaseRecheck looks at a deleted run again when its release did not let it go (the
	// finalizer's removal met a newer version, or the manager restarted meanwhile).
	releaseRecheck = 30 * time.Second
)

// cancelWait tells the holder of the work e names to stop it, in the executor (it is network
// I/O), once. Cancellation is cooperative and best-effort: a server that cannot be reached keeps
// its task until its own TTL, and the event says so.
func (r *Reconciler) cancelWait(ctx context.Context, s *scope, e state.Effect) {
	w := e.Wait
	if w == nil || w.Kind != tools.WaitKindMCPTask {
		return
	}
	log := ctrl.LoggerFrom(ctx).WithValues("run", klog.KObj(s.run), "task", w.ID, "server", w.Server)
	servers, err := r.mcpServersOf(ctx, s.run, s.spec)
	if err != nil {
		log.Error(err, "Cannot build the run's MCP servers to cancel its task")
		return
	}
	spec, ok := servers[w.Server]
	if !ok {
		log.Info("The task's MCP server is no longer in the run's spec; the task is left to its TTL")
		return
	}
	run, handle, why := s.run.DeepCopy(), *w, e.Message
	// Its own key: the run's key is its steps', and a cancelled run's step key is being cancelled.
	key := "tasks/cancel/" + run.Namespace + "/" + run.Name + "/" + handle.ID
	r.Executor.Submit(executor.Job{Key: key, Share: run.Namespace, Run: func(ctx context.Context) {
		r.stopTask(ctx, run, spec, handle, why, 1)
	}})
}

// stopTask sends tasks/cancel for the task w of run, up to attempts times, and reports how it
// went; it reports whether the server acknowledged.
func (r *Reconciler) stopTask(ctx context.Context, run *toolnexusv1alpha1.AgentRun, spec tools.MCPServerSpec, w tools.Wait, why string, attempts int) bool {
	var err error
	for attempt := 1; attempt <= attempts; attempt++ {
		if attempt > 1 {
			select {
			case <-ctx.Done():
				return false
			case <-time.After(time.Duration(attempt-1) * time.Second):
			}
		}
		actx, cancel := context.WithTimeout(ctx, stopAttemptTimeout)
		err = tools.CancelMCPTask(actx, spec, w)
		cancel()
		if err == nil {
			r.Recorder.Eventf(run, nil, corev1.EventTypeNormal, EventTaskCancelled, actionStep,
				"Cancelled MCP task %s on %s: %s", w.ID, w.Server, why)
			return true
		}
	}
	ctrl.LoggerFrom(ctx).Info("Cancelling the task failed", "run", klog.KObj(run), "task", w.ID, "server", w.Server, "attempts", attempts, "error", err.Error())
	r.Recorder.Eventf(run, nil, corev1.EventTypeWarning, EventTaskCancelFailed, actionStep,
		"Cancelling MCP task %s on %s failed (%s): %s", w.ID, w.Server, why, clip.Marked(err.Error(), 512))
	return false
}

// mcpServersOf builds the MCP servers of the run's spec with their Secrets, by name.
func (r *Reconciler) mcpServersOf(ctx context.Context, run *toolnexusv1alpha1.AgentRun, spec *toolnexusv1alpha1.AgentRunSpec) (map[string]tools.MCPServerSpec, error) {
	rt, err := r.prepare(ctx, run, spec, r.Metrics.Observe)
	if err != nil {
		return nil, err
	}
	out := make(map[string]tools.MCPServerSpec, len(rt.MCP))
	for _, m := range rt.MCP {
		out[m.Name] = m
	}
	return out, nil
}

// workOf is the external work the saved state still waits on, or stopped waiting on without
// having told its holder yet.
func workOf(st *state.State) []tools.Wait {
	out := append([]tools.Wait(nil), st.Abandoned...)
	for _, c := range st.Calls {
		if c.Wait != nil {
			out = append(out, c.Wait.Wait)
		}
	}
	return out
}

// holdWhileWaiting keeps ExternalWorkFinalizer on the run while its saved state waits on external
// work, and takes it off once it does not: a deletion then finds what to stop. The write is bound
// to the version read, so another writer's finalizers are never dropped (a conflict looks again
// soon). It runs after the save, so a run deleted between the task's start and this write loses
// the task to its TTL.
func (r *Reconciler) holdWhileWaiting(ctx context.Context, s *scope) (ctrl.Result, error) {
	hold := len(workOf(s.rec.State)) > 0
	if hold == controllerutil.ContainsFinalizer(s.before, toolnexusv1alpha1.ExternalWorkFinalizer) {
		return ctrl.Result{}, nil
	}
	run, before := s.before.DeepCopy(), s.before.DeepCopy()
	if hold {
		controllerutil.AddFinalizer(run, toolnexusv1alpha1.ExternalWorkFinalizer)
	} else {
		controllerutil.RemoveFinalizer(run, toolnexusv1alpha1.ExternalWorkFinalizer)
	}
	_, res, err := kube.PatchLocked(ctx, r.Client, run, before, false, "setting the external-work finalizer of AgentRun "+run.Name)
	return res, err
}

// releaseWaits lets a deleted run go once the work its record waits on was told to stop: the
// tasks/cancel go in the executor, which then takes the finalizer off. A record that cannot be
// read, or servers that cannot be built, let the run go at once, with an event.
func (r *Reconciler) releaseWaits(ctx context.Context, run *toolnexusv1alpha1.AgentRun) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(run, toolnexusv1alpha1.ExternalWorkFinalizer) {
		return ctrl.Result{}, nil
	}
	key := "release/" + run.Namespace + "/" + run.Name
	if r.Executor.Busy(key) {
		return ctrl.Result{RequeueAfter: releaseRecheck}, nil
	}
	let := func(why string) (ctrl.Result, error) {
		if why != "" {
			r.Recorder.Eventf(run, nil, corev1.EventTypeWarning, EventWorkReleased, actionStep,
				"The run was deleted; %s, so the work it waits on is left to its server's TTL", why)
		}
		return r.dropFinalizer(ctx, run)
	}
	rec, err := r.store.Load(ctx, run)
	if err != nil {
		return let(fmt.Sprintf("its record cannot be read (%s)", clip.Marked(err.Error(), 256)))
	}
	work := workOf(rec.State)
	if len(work) == 0 {
		return let("")
	}
	spec, err := effectiveSpec(run, rec)
	if err != nil {
		return let(err.Error())
	}
	servers, err := r.mcpServersOf(ctx, run, spec)
	if err != nil {
		return let(fmt.Sprintf("its MCP servers cannot be built (%s)", clip.Marked(err.Error(), 256)))
	}
	run = run.DeepCopy()
	r.Executor.Submit(executor.Job{Key: key, Share: run.Namespace, Run: func(ctx context.Context) {
		stopped := 0
		for _, w := range work {
			spec, ok := servers[w.Server]
			if w.Kind == tools.WaitKindMCPTask && ok && r.stopTask(ctx, run, spec, w, "the run was deleted", stopAttempts) {
				stopped++
			}
		}
		r.Recorder.Eventf(run, nil, corev1.EventTypeNormal, EventWorkReleased, actionStep,
			"The run was deleted; %d of the %d tasks it waited on were cancelled", stopped, len(work))
		if _, err := r.dropFinalizer(ctx, run); err != nil {
			ctrl.LoggerFrom(ctx).Info("Releasing the deleted run failed; it is looked at again", "run", klog.KObj(run), "error", err.Error())
		}
	}})
	return ctrl.Result{RequeueAfter: releaseRecheck}, nil
}

// dropFinalizer takes ExternalWorkFinalizer off run, bound to the version read.
func (r *Reconciler) dropFinalizer(ctx context.Context, run *toolnexusv1alpha1.AgentRun) (ctrl.Result, error) {
	released, before := run.DeepCopy(), run.DeepCopy()
	if !controllerutil.RemoveFinalizer(released, toolnexusv1alpha1.ExternalWorkFinalizer) {
		return ctrl.Result{}, nil
	}
	_, res, err := kube.PatchLocked(ctx, r.Client, released, before, false, "releasing deleted AgentRun "+run.Name)
	return res, err
}

// waitsOf counts what the run's calls wait on now, by kind, for toolnexus_external_waits.
func waitsOf(st *state.State) map[string]int {
	var kinds map[string]int
	for _, c := range st.Calls {
		if c.Wait == nil || c.Phase == state.PhaseDone || st.Ended() {
			continue
		}
		if kinds == nil {
			kinds = map[string]int{}
		}
		kinds[c.Wait.Kind]++
	}
	return kinds
}

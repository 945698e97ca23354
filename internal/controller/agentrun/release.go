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

// EventWorkReleased reports the release of a deleted run that waited on MCP tasks.
const EventWorkReleased = "ExternalWorkReleased"

// Deleting a run that waits on MCP tasks: the run keeps ExternalWorkFinalizer while its saved
// state waits on a task (holdWhileWaiting), so its deletion is seen with its spec and record at
// hand (the record and the requests are its dependents, which the garbage collector takes with
// it); the deletion then stops the tasks (releaseWaits) and lets the run go. It never holds the
// run for long: each task gets stopAttempts tries of at most stopAttemptTimeout each, then the
// run goes whatever the servers said, with an event.
const (
	stopAttempts       = 3
	stopAttemptTimeout = 10 * time.Second
	// releaseRecheck looks at a deleted run again when its release did not let it go (the
	// finalizer's removal met a newer version, or the manager restarted meanwhile).
	releaseRecheck = 30 * time.Second
)

// stopTask sends tasks/cancel for the task w of run, up to stopAttempts times, records how it
// went, and reports whether the server acknowledged.
func (r *Reconciler) stopTask(ctx context.Context, run *toolnexusv1alpha1.AgentRun, spec tools.MCPServerSpec, w tools.Wait, why string) bool {
	var err error
	for attempt := 1; attempt <= stopAttempts; attempt++ {
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
	ctrl.LoggerFrom(ctx).Info("Cancelling the task failed", "run", klog.KObj(run), "task", w.ID, "server", w.Server, "attempts", stopAttempts, "error", err.Error())
	r.Recorder.Eventf(run, nil, corev1.EventTypeWarning, EventTaskCancelFailed, actionStep,
		"Cancelling MCP task %s on %s failed (%s): %s", w.ID, w.Server, why, clip.Marked(err.Error(), 512))
	return false
}

// mcpServersOf builds the MCP servers of the run's spec with their Secrets, by name.
func (r *Reconciler) mcpServersOf(ctx context.Context, run *toolnexusv1alpha1.AgentRun, spec *toolnexusv1alpha1.AgentRunSpec, turn int) (map[string]tools.MCPServerSpec, error) {
	rt, err := r.prepare(ctx, run, spec, turn, r.Metrics.Observe)
	if err != nil {
		return nil, err
	}
	out := make(map[string]tools.MCPServerSpec, len(rt.MCP))
	for _, m := range rt.MCP {
		out[m.Name] = m
	}
	return out, nil
}

// workOf is the MCP tasks the saved state still waits on, or stopped waiting on without having
// told their servers yet: the work a deletion must stop, since nothing else would.
func workOf(st *state.State) []tools.Wait {
	var out []tools.Wait
	for _, w := range st.Abandoned {
		if w.Kind == tools.WaitKindMCPTask {
			out = append(out, w)
		}
	}
	for _, c := range st.Calls {
		if c.Wait != nil && c.Wait.Kind == tools.WaitKindMCPTask {
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
	servers, err := r.mcpServersOf(ctx, run, spec, rec.State.Turn)
	if err != nil {
		return let(fmt.Sprintf("its MCP servers cannot be built (%s)", clip.Marked(err.Error(), 256)))
	}
	run = run.DeepCopy()
	r.Executor.Submit(executor.Job{Key: key, Share: run.Namespace, Run: func(ctx context.Context) {
		stopped := 0
		for _, w := range work {
			if spec, ok := servers[w.Server]; ok && r.stopTask(ctx, run, spec, w, "the run was deleted") {
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

package agentrun

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/executor"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// A call waiting on external work (an MCP task, a remote A2A task; state.Wait) parks its run like a
// request does: no step is in flight and no connection is open. state.Settle marks the wait due
// when its poll time comes (the reconcile is requeued for it, at the interval the server asked for,
// bounded by the loop), and the run's next step is then the look (tasks/get, GetTask), taken in the
// executor like any tool call. A restart finds the wait in the record and looks again; the call is
// never made again. When a call stops waiting on work that may go on (the run ended or was
// cancelled, the call was declined, the wait outlived its deadline), Settle says so and the work's
// holder is told to stop it (cancelWait).

// EventTaskCancelled and EventTaskCancelFailed report a tasks/cancel sent for a run.
const (
	EventTaskCancelled    = "TaskCancelled"
	EventTaskCancelFailed = "TaskCancelFailed"
)

// cancelWait tells the holder of the work e names to stop it, in the executor (it is network
// I/O), once. Cancellation is cooperative and best-effort: a server that cannot be reached keeps
// its task until its own TTL, and the event says so.
func (r *Reconciler) cancelWait(ctx context.Context, s *scope, e state.Effect) {
	w := e.Wait
	if w != nil && w.Kind == wire.WaitKindAgentRun {
		r.cancelWaitedChild(ctx, s, w.ID, e.Message)
		return
	}
	if w == nil || (w.Kind != tools.WaitKindMCPTask && w.Kind != tools.WaitKindA2ATask) {
		return
	}
	log := ctrl.LoggerFrom(ctx).WithValues("run", klog.KObj(s.run), "task", w.ID, "server", w.Server)
	rt, err := r.prepare(ctx, s.run, s.spec, s.rec.State.Turn, r.Metrics.Observe)
	if err != nil {
		log.Error(err, "Cannot build the run's tools to cancel its task")
		return
	}
	handle, why := *w, e.Message
	var what string
	var cancelTask func(context.Context) error
	switch w.Kind {
	case tools.WaitKindA2ATask:
		for i := range rt.A2A {
			if spec := rt.A2A[i]; spec.Name == w.Server {
				what = fmt.Sprintf("A2A task %s of tool %s", w.ID, w.Server)
				cancelTask = func(ctx context.Context) error { return tools.CancelA2ATask(ctx, spec, handle) }
			}
		}
	default:
		for i := range rt.MCP {
			if spec := rt.MCP[i]; spec.Name == w.Server {
				what = fmt.Sprintf("MCP task %s on %s", w.ID, w.Server)
				cancelTask = func(ctx context.Context) error { return tools.CancelMCPTask(ctx, spec, handle) }
			}
		}
	}
	if cancelTask == nil {
		log.Info("What the task runs on is no longer in the run's spec; the task is left to its own TTL")
		return
	}
	run := s.run.DeepCopy()
	// Its own key: the run's key is its steps', and a cancelled run's step key is being cancelled.
	key := "tasks/cancel/" + run.Namespace + "/" + run.Name + "/" + handle.ID
	r.Executor.Submit(executor.Job{Key: key, Share: run.Namespace, Run: func(ctx context.Context) {
		if err := cancelTask(ctx); err != nil {
			log.Info("Cancelling the task failed", "error", err.Error())
			r.Recorder.Eventf(run, nil, corev1.EventTypeWarning, EventTaskCancelFailed, actionStep,
				"Cancelling %s failed (%s): %s", what, why, clip.Marked(err.Error(), 512))
			return
		}
		r.Recorder.Eventf(run, nil, corev1.EventTypeNormal, EventTaskCancelled, actionStep, "Cancelled %s: %s", what, why)
	}})
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

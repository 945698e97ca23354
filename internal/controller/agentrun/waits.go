package agentrun

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/executor"
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
// to stop it (cancelWait).

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
	if w == nil || w.Kind != tools.WaitKindMCPTask {
		return
	}
	log := ctrl.LoggerFrom(ctx).WithValues("run", klog.KObj(s.run), "task", w.ID, "server", w.Server)
	rt, err := r.prepare(ctx, s.run, s.spec, r.Metrics.Observe)
	if err != nil {
		log.Error(err, "Cannot build the run's MCP servers to cancel its task")
		return
	}
	var spec *tools.MCPServerSpec
	for i := range rt.MCP {
		if rt.MCP[i].Name == w.Server {
			spec = &rt.MCP[i]
		}
	}
	if spec == nil {
		log.Info("The task's MCP server is no longer in the run's spec; the task is left to its TTL")
		return
	}
	run, handle, why := s.run.DeepCopy(), *w, e.Message
	// Its own key: the run's key is its steps', and a cancelled run's step key is being cancelled.
	key := "tasks/cancel/" + run.Namespace + "/" + run.Name + "/" + handle.ID
	r.Executor.Submit(executor.Job{Key: key, Share: run.Namespace, Run: func(ctx context.Context) {
		if err := tools.CancelMCPTask(ctx, *spec, handle); err != nil {
			log.Info("Cancelling the task failed", "error", err.Error())
			r.Recorder.Eventf(run, nil, corev1.EventTypeWarning, EventTaskCancelFailed, actionStep,
				"Cancelling MCP task %s on %s failed (%s): %s", handle.ID, handle.Server, why, clip.Marked(err.Error(), 512))
			return
		}
		r.Recorder.Eventf(run, nil, corev1.EventTypeNormal, EventTaskCancelled, actionStep,
			"Cancelled MCP task %s on %s: %s", handle.ID, handle.Server, why)
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

package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/a2a"
)

// A blocking send and a stream follow the run with a watch made as the caller (so they need
// watch on agentruns, as `kubectl get -w` does): no polling, and a change reaches the client as
// soon as the manager writes it.

// keepAlive is how often an idle stream sends an SSE comment, so that proxies keep it open.
const keepAlive = 20 * time.Second

// rewatchDelay is the pause before a watch that failed is made again.
const rewatchDelay = time.Second

// waitFor follows v's run until done says so or ctx ends, and returns what it saw last.
func (ep *endpoint) waitFor(ctx context.Context, v view, done func(view) bool) view {
	if done(v) {
		return v
	}
	last := v
	ep.follow(ctx, v.run, func(next view) bool {
		last = next
		return done(next)
	})
	return last
}

// follow calls each with the task's run every time it changes, until each returns true, the run
// is deleted, or ctx ends. A watch that closes or fails is made again from a fresh read.
func (ep *endpoint) follow(ctx context.Context, run *toolnexusv1alpha1.AgentRun, each func(view) bool) {
	rv := run.ResourceVersion
	for ctx.Err() == nil {
		w, err := ep.caller.client.Watch(ctx, &toolnexusv1alpha1.AgentRunList{}, &client.ListOptions{
			Namespace: run.Namespace, FieldSelector: fields.OneTermEqualSelector("metadata.name", run.Name),
			Raw: &metav1.ListOptions{ResourceVersion: rv}})
		if err == nil {
			stop, gone := ep.drain(ctx, w, &rv, each)
			w.Stop()
			if stop || gone {
				return
			}
		} else {
			ep.log.V(1).Info("Watching the task's run failed; reading it again", "run", run.Name, "error", err.Error())
			select {
			case <-ctx.Done():
				return
			case <-time.After(rewatchDelay):
			}
		}
		v, rpcErr := ep.read(ctx, run.Name)
		if rpcErr != nil {
			return
		}
		rv = v.run.ResourceVersion
		if each(v) {
			return
		}
	}
}

// drain hands each change of w to each; stop when each said so, gone when the run was deleted.
func (ep *endpoint) drain(ctx context.Context, w watch.Interface, rv *string, each func(view) bool) (stop, gone bool) {
	for {
		select {
		case <-ctx.Done():
			return true, false
		case ev, open := <-w.ResultChan():
			if !open {
				return false, false
			}
			switch ev.Type {
			case watch.Deleted:
				return false, true
			case watch.Added, watch.Modified:
				run, ok := ev.Object.(*toolnexusv1alpha1.AgentRun)
				if !ok {
					continue
				}
				*rv = run.ResourceVersion
				if each(ep.viewOf(ctx, run)) {
					return true, false
				}
			case watch.Error:
				// An expired resourceVersion, say: read afresh.
				return false, false
			}
		}
	}
}

// stream answers SendStreamingMessage and SubscribeToTask with Server-Sent Events: the task first,
// then a status update at every change of its state or of what it asks, the result as an artifact
// update, until the task ends (or MaxStreamDuration passes, or the client goes).
func (ep *endpoint) stream(w http.ResponseWriter, r *http.Request, req a2a.Request) {
	ctx := r.Context()
	// A slot first: a message must not start a task that then cannot be streamed.
	release, ok := ep.g.acquire(ctx)
	if !ok {
		writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeInternalError, "", "Internal error: %d streams are open, the most this gateway serves; poll GetTask", ep.g.opts.MaxStreams))
		return
	}
	defer release()
	var v view
	done := func(view) bool { return false }
	if req.Method == a2a.MethodSubscribeToTask {
		var params a2a.SubscribeToTaskRequest
		if err := decodeParams(req.Params, &params); err != nil {
			writeRPC(w, req.ID, nil, err)
			return
		}
		var rpcErr *a2a.Error
		if v, rpcErr = ep.read(ctx, params.ID); rpcErr != nil {
			writeRPC(w, req.ID, nil, rpcErr)
			return
		}
		if state, _ := stateOf(v.run); state.Terminal() {
			writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeUnsupportedOperation, "UNSUPPORTED_OPERATION",
				"Task %s is %s: there is nothing to subscribe to; use GetTask", params.ID, state.Short()))
			return
		}
	} else {
		var params a2a.SendMessageRequest
		if err := decodeParams(req.Params, &params); err != nil {
			writeRPC(w, req.ID, nil, err)
			return
		}
		var rpcErr *a2a.Error
		if v, done, rpcErr = ep.deliver(ctx, r, &params.Message); rpcErr != nil {
			writeRPC(w, req.ID, nil, rpcErr)
			return
		}
		// A stream of an answered task starts once the task moved on from the request answered.
		waited, cancel := context.WithTimeout(ctx, ep.g.opts.BlockingTimeout)
		v = ep.waitFor(waited, v, func(v view) bool { s, _ := stateOf(v.run); return done(v) || !s.Interrupted() })
		cancel()
	}
	ctx, cancel := context.WithTimeout(ctx, ep.g.opts.MaxStreamDuration)
	defer cancel()

	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	send := func(ev a2a.StreamResponse) bool {
		raw, err := json.Marshal(a2a.Response{JSONRPC: "2.0", ID: req.ID, Result: mustJSON(ev)})
		if err != nil {
			return false
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", raw); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	last := v.task(nil, true)
	if !send(a2a.StreamResponse{Task: &last}) || last.Status.State.Terminal() {
		return
	}
	ticker := time.NewTicker(keepAlive)
	defer ticker.Stop()
	changes := make(chan view)
	go ep.follow(ctx, v.run, func(next view) bool {
		select {
		case changes <- next:
			return false
		case <-ctx.Done():
			return true
		}
	})
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		case next := <-changes:
			t := next.task(nil, true)
			if t.Status.State == last.Status.State && messageID(t.Status.Message) == messageID(last.Status.Message) {
				continue
			}
			if t.Status.State == a2a.TaskStateCompleted && len(t.Artifacts) > 0 &&
				!send(a2a.StreamResponse{ArtifactUpdate: &a2a.TaskArtifactUpdateEvent{TaskID: t.ID, ContextID: t.ContextID, Artifact: t.Artifacts[0], LastChunk: true}}) {
				return
			}
			if !send(a2a.StreamResponse{StatusUpdate: &a2a.TaskStatusUpdateEvent{TaskID: t.ID, ContextID: t.ContextID, Status: t.Status}}) ||
				t.Status.State.Terminal() {
				return
			}
			last = t
		}
	}
}

func messageID(m *a2a.Message) string {
	if m == nil {
		return ""
	}
	return m.MessageID
}

func mustJSON(v any) json.RawMessage {
	raw, _ := json.Marshal(v)
	return raw
}

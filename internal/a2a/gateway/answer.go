package gateway

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/a2a"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// A follow-up message on a task that asks for input answers one PendingRequest of its run, as
// `kubectl patch --subresource=status` would, made as the caller: the approver rules, the
// requester's exclusion, expiry and the answeredBy stamp are the API server's, and its refusal is
// what the caller is told. The answer is bound to the request the gateway read (answer.requestUID),
// or to the one the client names with its own requestUID.

// Words that answer an approval or a login in a text message.
var (
	yesWords = []string{"approve", "approved", "yes", "y", "ok", "done"}
	noWords  = []string{"decline", "declined", "deny", "denied", "reject", "rejected", "no", "n"}
)

// followUp answers the request of the task msg names and returns the task with the request's name.
func (ep *endpoint) followUp(ctx context.Context, msg *a2a.Message) (view, string, *a2a.Error) {
	v, rpcErr := ep.read(ctx, msg.TaskID)
	if rpcErr != nil {
		return view{}, "", rpcErr
	}
	if msg.ContextID != "" && msg.ContextID != v.run.Annotations[ContextAnnotation] {
		return view{}, "", a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: contextId %q is not the context of task %s", msg.ContextID, msg.TaskID)
	}
	state, _ := stateOf(v.run)
	switch {
	case state.Terminal():
		return view{}, "", a2a.Errorf(a2a.CodeUnsupportedOperation, "UNSUPPORTED_OPERATION",
			"Task %s is %s and accepts no more messages", msg.TaskID, state.Short())
	case !state.Interrupted():
		return view{}, "", a2a.Errorf(a2a.CodeUnsupportedOperation, "UNSUPPORTED_OPERATION",
			"Task %s is %s and asks for nothing: a message answers a task that is input_required or auth_required", msg.TaskID, state.Short())
	}
	preq, answer, rpcErr := answerOf(v, msg)
	if rpcErr != nil {
		return view{}, "", rpcErr
	}
	raw, err := json.Marshal(map[string]any{"status": map[string]any{"answer": answer}})
	if err != nil {
		return view{}, "", a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: the answer is not JSON: %v", err)
	}
	if err := ep.caller.client.Status().Patch(ctx, preq, client.RawPatch(types.MergePatchType, raw)); err != nil {
		return view{}, "", refused(err, "answering PendingRequest "+preq.Name)
	}
	ep.log.Info("Answered a PendingRequest for an A2A caller", "run", v.run.Name, "request", preq.Name, "ok", answer.OK)
	return v, preq.Name, nil
}

// answerOf reads the answer msg gives and the request it is for.
func answerOf(v view, msg *a2a.Message) (*toolnexusv1alpha1.PendingRequest, *toolnexusv1alpha1.Answer, *a2a.Error) {
	if part, ok := msg.Answer(); ok {
		preq, rpcErr := target(v, part.Request, part.RequestUID)
		if rpcErr != nil {
			return nil, nil, rpcErr
		}
		answer := &toolnexusv1alpha1.Answer{ID: preq.Spec.Request.ID, RequestUID: part.RequestUID, OK: part.OK, Reason: part.Reason}
		if answer.RequestUID == "" {
			answer.RequestUID = string(preq.UID)
		}
		if part.Data != nil {
			raw, err := json.Marshal(part.Data)
			if err != nil {
				return nil, nil, a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: the answer's data is not JSON: %v", err)
			}
			answer.Data = &apiextensionsv1.JSON{Raw: raw}
		}
		return preq, answer, nil
	}
	text := strings.TrimSpace(msg.Text())
	if text == "" {
		return nil, nil, a2a.Errorf(a2a.CodeInvalidParams, "", `Invalid parameters: answer with text, or with a data part {"ok": true|false, "data": {...}, "reason": "..."}`)
	}
	preq, rpcErr := target(v, "", "")
	if rpcErr != nil {
		return nil, nil, rpcErr
	}
	answer := &toolnexusv1alpha1.Answer{ID: preq.Spec.Request.ID, RequestUID: string(preq.UID)}
	switch kind := preq.Spec.Request.Kind; kind {
	case wire.KindInput, wire.KindQuestion:
		raw, err := json.Marshal(map[string]string{wire.OutputKey: text})
		if err != nil {
			return nil, nil, a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: %v", err)
		}
		answer.OK, answer.Data = true, &apiextensionsv1.JSON{Raw: raw}
	case wire.KindApproval, wire.KindAuthorization:
		word := strings.ToLower(strings.Trim(text, ".!"))
		switch {
		case slices.Contains(yesWords, word):
			answer.OK = true
		case slices.Contains(noWords, word):
			answer.Reason = wire.ReasonDeclined
		default:
			return nil, nil, a2a.Errorf(a2a.CodeInvalidParams, "", `Invalid parameters: a request of kind %s is answered with "approve" or "decline" (or a data part {"ok": ...}), not %q`,
				kind, clip.Marked(text, 64))
		}
	default:
		return nil, nil, a2a.Errorf(a2a.CodeInvalidParams, "", `Invalid parameters: a request of kind %s is answered with a data part {"ok": true, "data": {...}}`, kind)
	}
	return preq, answer, nil
}

// target is the open request named by name or uid, else the first one; the caller must be able
// to read it.
func target(v view, name, uid string) (*toolnexusv1alpha1.PendingRequest, *a2a.Error) {
	for _, p := range v.run.Status.Pending {
		preq := v.details[p.Name]
		if name != "" && p.Name != name {
			continue
		}
		if preq == nil {
			return nil, a2a.Errorf(a2a.CodeRefused, "FORBIDDEN", "PendingRequest %s cannot be read as you: you may not answer it", p.Name)
		}
		if uid != "" && name == "" && string(preq.UID) != uid {
			continue
		}
		return preq, nil
	}
	return nil, a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: task %s waits on no request %s", v.run.Name, strings.TrimSpace(name+" "+uid))
}

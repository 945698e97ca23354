package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/toolnexus/operator/internal/a2a"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// An A2A tool is a remote agent spoken to over A2A 1.0 (package a2a, the JSON-RPC binding). A call
// sends the agent a message (SendMessage, returning at once) and, unless the agent answers at
// once, waits on the task it made as external work (Waiting, kind a2a-task): the run is parked
// with the task id in its record, holding no connection, and each look is one GetTask. A task
// that asks for input (input-required) or a login (auth-required) becomes a suspension of the
// call, so a person of this run answers it; the answer goes back as the follow-up message on the
// task, and the call waits again. The task's result is the call's output.

// a2aPollInterval is when a task that is working is looked at again: A2A has no poll hint.
const a2aPollInterval = 2 * time.Second

// maxA2AResponseBytes bounds one response of the agent.
const maxA2AResponseBytes = 4 << 20

// A2AToolSpec describes a remote A2A agent as a tool.
type A2AToolSpec struct {
	Name        string
	Description string
	// InputSchema is the JSON Schema of the arguments; nil is {message: string}.
	InputSchema map[string]any
	// URL is the agent's JSON-RPC endpoint.
	URL     string
	Headers []Header
	// Timeout bounds each request (DefaultHTTPTimeout).
	Timeout time.Duration
	// Client carries the requests (the network guard's); redirects stay within the origin.
	Client *http.Client
	// MaxOutputBytes caps the task's result (DefaultMaxOutputBytes).
	MaxOutputBytes int
}

type a2aTool struct{ spec A2AToolSpec }

// A2ATool returns the tool spec describes. The spec is checked here, so a bad URL is a
// configuration error rather than a failing call.
func A2ATool(spec A2AToolSpec) (Tool, error) {
	t, err := newA2ATool(spec)
	if err != nil {
		return Tool{}, err
	}
	schema := t.spec.InputSchema
	if schema == nil {
		schema = map[string]any{"type": "object", "required": []any{"message"}, "properties": map[string]any{
			"message": map[string]any{"type": "string", "description": "The message to the agent"}}}
	}
	return Tool{Name: Sanitize(spec.Name), Description: spec.Description, InputSchema: schema,
		Source: SourceA2A, URL: spec.URL, Execute: t.execute}, nil
}

func newA2ATool(spec A2AToolSpec) (*a2aTool, error) {
	if spec.Name == "" {
		return nil, errors.New("a2a tool: name is empty")
	}
	if u, err := url.Parse(spec.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("a2a tool %s: url %q is not an absolute http(s) URL", spec.Name, spec.URL)
	}
	if spec.Timeout <= 0 {
		spec.Timeout = DefaultHTTPTimeout
	}
	if spec.MaxOutputBytes <= 0 {
		spec.MaxOutputBytes = DefaultMaxOutputBytes
	}
	spec.Client = sameOriginRedirects(spec.Client)
	return &a2aTool{spec: spec}, nil
}

func (t *a2aTool) failure(msg string) ToolResult {
	return ToolResult{Output: fmt.Sprintf("A2A tool %s: %s", t.spec.Name, msg), IsError: true}
}

// session is the client of one call, with its headers resolved.
func (t *a2aTool) session(ctx context.Context) (*a2a.Client, resolvedHeaders, error) {
	hdrs, err := resolveHeaders(ctx, t.spec.Headers)
	if err != nil {
		return nil, resolvedHeaders{}, err
	}
	return &a2a.Client{URL: t.spec.URL, HTTPClient: t.spec.Client, Header: hdrs.header, MaxResponseBytes: maxA2AResponseBytes}, hdrs, nil
}

func (t *a2aTool) execute(ctx context.Context, args map[string]any, tc *ToolContext) (ToolResult, error) {
	if tc == nil {
		tc = &ToolContext{}
	}
	ctx, cancel := context.WithTimeout(ctx, t.spec.Timeout)
	defer cancel()
	c, hdrs, err := t.session(ctx)
	if err != nil {
		if tc.Wait != nil {
			h := *tc.Wait
			h.PollError = err.Error()
			return Waiting(h), nil
		}
		return t.failure(err.Error()), nil
	}
	if tc.Wait != nil {
		return t.look(ctx, c, hdrs, tc), nil
	}
	parts, err := messageParts(args)
	if err != nil {
		return t.failure(err.Error()), nil
	}
	resp, err := c.SendMessage(ctx, a2a.SendMessageRequest{
		Message:       a2a.Message{MessageID: messageID(tc.IdempotencyKey, "", tc.CallID), Role: a2a.RoleUser, Parts: parts},
		Configuration: &a2a.SendMessageConfiguration{ReturnImmediately: true},
	})
	if err != nil {
		return t.failure(hdrs.redact(explainA2A(err))), nil
	}
	if resp.Task == nil {
		// A direct answer, without a task.
		return ToolResult{Output: capOutput(hdrs.redact(resp.Message.Text()), t.spec.MaxOutputBytes, false, -1)}, nil
	}
	if resp.Task.ID == "" {
		return t.failure("the agent answered with a task without an id"), nil
	}
	if resp.Task.Status.State.Terminal() {
		return t.ended(resp.Task, hdrs), nil
	}
	// Even a task that asks for input at once is waited on first: the suspension must carry the
	// task's handle, and the next look raises it.
	return Waiting(t.handle(resp.Task)), nil
}

// handle is the wait on task.
func (t *a2aTool) handle(task *a2a.Task) Wait {
	return Wait{Kind: WaitKindA2ATask, Server: t.spec.Name, ID: task.ID, PollIntervalMs: a2aPollInterval.Milliseconds(),
		Status: task.Status.State.Short(), Message: clip.Marked(task.Status.Message.Text(), wire.MaxWaitMessageBytes)}
}

// look reads the task tc.Wait names, after sending it tc.Answer when the task still asks what was
// answered.
func (t *a2aTool) look(ctx context.Context, c *a2a.Client, hdrs resolvedHeaders, tc *ToolContext) ToolResult {
	h := *tc.Wait
	task, err := c.GetTask(ctx, h.ID)
	var rpcErr *a2a.Error
	switch {
	case errors.As(err, &rpcErr) && rpcErr.Code == a2a.CodeTaskNotFound:
		return t.failure(fmt.Sprintf("task %s is not known to the agent any more: %s", h.ID, hdrs.redact(rpcErr.Message)))
	case err != nil:
		h.PollError = hdrs.redact(explainA2A(err))
		return Waiting(h)
	}
	answered := ""
	if a := tc.Answer; a != nil && task.Status.State.Interrupted() {
		if asked := t.request(task); asked.ID == a.ID {
			followUp := a2a.Message{MessageID: messageID(tc.IdempotencyKey, a.ID, tc.CallID), TaskID: task.ID,
				ContextID: task.ContextID, Role: a2a.RoleUser, Parts: answerParts(*a, asked)}
			resp, err := c.SendMessage(ctx, a2a.SendMessageRequest{Message: followUp,
				Configuration: &a2a.SendMessageConfiguration{ReturnImmediately: true}})
			if err != nil {
				// The agent refused the answer (its own rules), or could not be reached: the model is
				// told, and the task, still asking, is cancelled with the call.
				return t.failure(fmt.Sprintf("task %s: the agent did not take the answer: %s", h.ID, hdrs.redact(explainA2A(err))))
			}
			answered = a.ID
			if resp.Task != nil && resp.Task.ID == task.ID {
				task = resp.Task
			}
		}
	}
	h = t.handle(task)
	switch state := task.Status.State; {
	case state == a2a.TaskStateSubmitted || state == a2a.TaskStateWorking:
		return Waiting(h)
	case state.Interrupted():
		req := t.request(task)
		if req.ID == answered {
			// The agent has the answer and has not moved on yet.
			return Waiting(h)
		}
		return Pending(req)
	case state.Terminal():
		return t.ended(task, hdrs)
	}
	h.PollError = fmt.Sprintf("the agent answered the unknown task state %q", task.Status.State)
	return Waiting(h)
}

// ended is the call's result for a task that ended.
func (t *a2aTool) ended(task *a2a.Task, hdrs resolvedHeaders) ToolResult {
	why := hdrs.redact(task.Status.Message.Text())
	switch task.Status.State {
	case a2a.TaskStateCompleted:
		out := task.ArtifactText()
		if out == "" {
			out = task.Status.Message.Text()
		}
		return ToolResult{Output: capOutput(hdrs.redact(out), t.spec.MaxOutputBytes, false, -1)}
	case a2a.TaskStateCanceled:
		return t.failure(fmt.Sprintf("task %s was canceled: %s", task.ID, why))
	case a2a.TaskStateRejected:
		return t.failure(fmt.Sprintf("task %s was rejected by the agent: %s", task.ID, why))
	}
	return t.failure(fmt.Sprintf("task %s failed: %s", task.ID, why))
}

// request is what an interrupted task asks, as a Request of this run: a toolnexus agent's request
// as it is (kind, prompt, URL, data), another agent's status message as input (or authorization,
// for auth-required). Its id is a digest of the task and of what identifies the question there
// (the remote request's UID, else the status message's id), so another question is another id.
func (t *a2aTool) request(task *a2a.Task) Request {
	msg := task.Status.Message
	var remote a2a.RequestPart
	if parts := msg.Requests(); len(parts) > 0 {
		remote = parts[0]
	}
	identity := remote.UID
	if identity == "" && msg != nil {
		identity = msg.MessageID
	}
	if identity == "" {
		identity = task.Status.Timestamp
	}
	sum := sha256.Sum256([]byte(task.ID + "\x00" + identity))
	req := Request{ID: "a2a-" + hex.EncodeToString(sum[:8]), Kind: remote.Kind, Prompt: remote.Prompt, URL: remote.URL}
	if req.Kind == "" {
		req.Kind = KindInput
		if task.Status.State == a2a.TaskStateAuthRequired {
			req.Kind = KindAuthorization
		}
	}
	if req.Prompt == "" {
		req.Prompt = msg.Text()
	}
	if req.Prompt == "" {
		req.Prompt = fmt.Sprintf("The agent of %s asks for %s", t.spec.Name, task.Status.State.Short())
	}
	req.Prompt = clip.Marked(req.Prompt, wire.MaxPromptLen)
	if _, err := time.Parse(time.RFC3339, remote.ExpiresAt); err == nil {
		req.ExpiresAt = remote.ExpiresAt
	}
	req.Data = map[string]any{}
	for k, v := range remote.Data {
		req.Data[k] = v
	}
	origin := map[string]any{"task": task.ID}
	if remote.Name != "" {
		origin["request"], origin["requestUID"] = remote.Name, remote.UID
	}
	if remote.Tool != "" {
		origin["tool"], origin["arguments"] = remote.Tool, remote.Arguments
	}
	req.Data["a2a"] = origin
	return req
}

// answerParts is the follow-up message that answers asked with a: the answer as text, for any
// agent, and as an AnswerPart bound to the remote request, for a toolnexus agent.
func answerParts(a Answer, asked Request) []a2a.Part {
	text := "approve"
	if out, err := a.OutputOf(); err == nil {
		text = out
	} else if !a.OK {
		text = "decline"
	}
	part := a2a.AnswerPart{OK: a.OK, Data: a.Data, Reason: a.Reason}
	if origin, ok := asked.Data["a2a"].(map[string]any); ok {
		part.Request, _ = origin["request"].(string)
		part.RequestUID, _ = origin["requestUID"].(string)
	}
	raw, err := json.Marshal(part)
	if err != nil {
		return []a2a.Part{{Text: text}}
	}
	return []a2a.Part{{Text: text}, {Data: raw, MediaType: "application/json"}}
}

// messageParts is the message a call sends: its message argument as text, and any other
// arguments as a JSON data part.
func messageParts(args map[string]any) ([]a2a.Part, error) {
	text, isText := args["message"].(string)
	var parts []a2a.Part
	if isText && text != "" {
		parts = append(parts, a2a.Part{Text: text})
	}
	if len(args) > 1 || (!isText && len(args) > 0) {
		raw, err := json.Marshal(args)
		if err != nil {
			return nil, fmt.Errorf("the arguments are not JSON: %w", err)
		}
		parts = append(parts, a2a.Part{Data: raw, MediaType: "application/json"})
	}
	if len(parts) == 0 {
		return nil, errors.New("the call has no message for the agent: give a message argument")
	}
	return parts, nil
}

// messageID is the id of a message of the call: its idempotency key (and the answer's id, for a
// follow-up), so that a re-executed step sends the same message again, which the agent may
// recognise (§3.3.1).
func messageID(key, answerID, callID string) string {
	if key == "" {
		key = callID
	}
	id := key
	if answerID != "" {
		id += "/" + answerID
	}
	if len(id) > 200 {
		sum := sha256.Sum256([]byte(id))
		id = "tn-" + hex.EncodeToString(sum[:16])
	}
	return id
}

// explainA2A describes an error of the agent or of the way to it.
func explainA2A(err error) string {
	var rpcErr *a2a.Error
	if errors.As(err, &rpcErr) {
		return fmt.Sprintf("%s (A2A error %d)", clip.Marked(rpcErr.Message, 2048), rpcErr.Code)
	}
	return clip.Marked(err.Error(), 2048)
}

// CancelA2ATask asks the agent of spec to cancel the task w (CancelTask). A task that already
// ended is not an error.
func CancelA2ATask(ctx context.Context, spec A2AToolSpec, w Wait) error {
	if w.Kind != WaitKindA2ATask {
		return fmt.Errorf("a2a tool %s: %s %s is not an A2A task", spec.Name, w.Kind, w.ID)
	}
	t, err := newA2ATool(spec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, t.spec.Timeout)
	defer cancel()
	c, hdrs, err := t.session(ctx)
	if err != nil {
		return fmt.Errorf("a2a tool %s: %w", spec.Name, err)
	}
	_, err = c.CancelTask(ctx, w.ID)
	var rpcErr *a2a.Error
	if errors.As(err, &rpcErr) && rpcErr.Code == a2a.CodeTaskNotCancelable {
		return nil
	}
	if err != nil {
		return fmt.Errorf("a2a tool %s: cancelling task %s: %s", spec.Name, w.ID, hdrs.redact(explainA2A(err)))
	}
	return nil
}

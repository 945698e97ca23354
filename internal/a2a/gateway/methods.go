package gateway

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/a2a"
	"github.com/toolnexus/operator/internal/telemetry"
)

// Bounds of what a caller sends.
const (
	maxMessageIDLen = 256
	maxContextIDLen = 128
	maxParts        = 64
	// maxPromptLen is spec.prompt's bound (characters).
	maxPromptLen = 65536
	// defaultPageSize and maxPageSize bound a ListTasks page; maxListed the runs it looks at.
	defaultPageSize = 50
	maxPageSize     = 100
	maxListed       = 10000
)

var contextIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:/-]+$`)

// sendMessage starts a task, or continues the one the message names, and answers with the task:
// at once when the client asks for that, else once it ended or asks for input (bounded by
// BlockingTimeout).
func (ep *endpoint) sendMessage(ctx context.Context, r *http.Request, params json.RawMessage) (any, *a2a.Error) {
	var req a2a.SendMessageRequest
	if err := decodeParams(params, &req); err != nil {
		return nil, err
	}
	v, done, rpcErr := ep.deliver(ctx, r, &req.Message)
	if rpcErr != nil {
		return nil, rpcErr
	}
	cfg := req.Configuration
	if cfg == nil || !cfg.ReturnImmediately {
		if release, ok := ep.g.acquire(ctx); ok {
			ctx, cancel := context.WithTimeout(ctx, ep.g.opts.BlockingTimeout)
			v = ep.waitFor(ctx, v, done)
			cancel()
			release()
		}
	}
	var history *int32
	if cfg != nil {
		history = cfg.HistoryLength
	}
	t := v.task(history, true)
	return a2a.SendMessageResponse{Task: &t}, nil
}

// deliver creates the task a message starts or answers the request of the task it names, and
// returns the task with what a blocking send waits for.
func (ep *endpoint) deliver(ctx context.Context, r *http.Request, msg *a2a.Message) (view, func(view) bool, *a2a.Error) {
	if err := checkMessage(msg); err != nil {
		return view{}, nil, err
	}
	if msg.TaskID != "" {
		v, answered, err := ep.followUp(ctx, msg)
		return v, answeredDone(answered), err
	}
	v, err := ep.create(ctx, r, msg)
	return v, func(v view) bool {
		state, _ := stateOf(v.run)
		return state.Terminal() || state.Interrupted()
	}, err
}

// answeredDone is when a task that was answered has moved on: it ended, or asks something other
// than the request answered.
func answeredDone(answered string) func(view) bool {
	return func(v view) bool {
		state, _ := stateOf(v.run)
		if state.Terminal() {
			return true
		}
		return state.Interrupted() && !slices.ContainsFunc(v.run.Status.Pending, func(p toolnexusv1alpha1.PendingSummary) bool {
			return p.Name == answered
		})
	}
}

// checkMessage bounds what a client's message holds.
func checkMessage(msg *a2a.Message) *a2a.Error {
	switch {
	case msg.Role != a2a.RoleUser:
		return a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: message.role must be %s, not %q", a2a.RoleUser, msg.Role)
	case msg.MessageID == "" || utf8.RuneCountInString(msg.MessageID) > maxMessageIDLen:
		return a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: message.messageId must be 1 to %d characters", maxMessageIDLen)
	case len(msg.Parts) == 0 || len(msg.Parts) > maxParts:
		return a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: message.parts must hold 1 to %d parts, it holds %d", maxParts, len(msg.Parts))
	case msg.ContextID != "" && (len(msg.ContextID) > maxContextIDLen || !contextIDPattern.MatchString(msg.ContextID)):
		return a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: message.contextId must be 1 to %d of A-Z a-z 0-9 . _ : / -", maxContextIDLen)
	}
	for i, p := range msg.Parts {
		if len(p.Raw) > 0 || p.URL != "" {
			return a2a.Errorf(a2a.CodeContentTypeNotSupported, "CONTENT_TYPE_NOT_SUPPORTED",
				"message.parts[%d] is a file: this agent takes text and JSON data parts only", i)
		}
	}
	return nil
}

// create starts a run of the agent with the message as its prompt. Its name is derived from the
// caller and the messageId, so a message sent twice (a client's retry) is one task.
func (ep *endpoint) create(ctx context.Context, r *http.Request, msg *a2a.Message) (view, *a2a.Error) {
	c := ep.caller.client
	agent := &toolnexusv1alpha1.Agent{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ep.namespace, Name: ep.agent}, agent); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
			return view{}, a2a.Errorf(a2a.CodeInvalidParams, "AGENT_NOT_FOUND", "there is no Agent %s/%s that you may read", ep.namespace, ep.agent)
		}
		return view{}, refused(err, "reading the Agent")
	}
	prompt, rpcErr := promptOf(msg)
	if rpcErr != nil {
		return view{}, rpcErr
	}
	contextID := msg.ContextID
	if contextID == "" {
		contextID = string(uuid.NewUUID())
	}
	run := &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: ep.namespace, Name: runName(ep.agent, ep.caller.user, ep.namespace, msg.MessageID),
			Annotations: map[string]string{ContextAnnotation: contextID, MessageAnnotation: msg.MessageID}},
		Spec: toolnexusv1alpha1.AgentRunSpec{AgentRef: &toolnexusv1alpha1.AgentReference{Name: ep.agent}, Prompt: prompt},
	}
	// The caller's trace, when it sent one, is the run's parent (as the annotation does for kubectl).
	if tp := r.Header.Get("traceparent"); tp != "" {
		if _, err := telemetry.ParseTraceparent(tp); err == nil {
			run.Annotations[toolnexusv1alpha1.TraceparentAnnotation] = tp
		}
	}
	err := c.Create(ctx, run)
	if apierrors.IsAlreadyExists(err) {
		existing, rpcErr := ep.read(ctx, run.Name)
		if rpcErr == nil && existing.run.Spec.RequestedBy == ep.caller.user && existing.run.Annotations[MessageAnnotation] == msg.MessageID {
			return existing, nil
		}
		return view{}, a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: messageId %q already started a task that is not yours", msg.MessageID)
	}
	if err != nil {
		return view{}, refused(err, "creating a run of the agent")
	}
	ep.log.Info("Created a run for an A2A message", "run", run.Name)
	return view{run: run}, nil
}

// promptOf is the run's prompt: the message's text parts, then its data parts as JSON.
func promptOf(msg *a2a.Message) (string, *a2a.Error) {
	var parts []string
	for _, p := range msg.Parts {
		switch {
		case p.Text != "":
			parts = append(parts, p.Text)
		case len(p.Data) > 0:
			parts = append(parts, string(p.Data))
		}
	}
	prompt := strings.Join(parts, "\n")
	if prompt == "" {
		return "", a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: the message has no text and no data")
	}
	if n := utf8.RuneCountInString(prompt); n > maxPromptLen {
		return "", a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: the message is %d characters; a run's prompt holds at most %d", n, maxPromptLen)
	}
	return prompt, nil
}

// runName is <agent>-<digest of caller, namespace, agent and messageId>, at most 53 characters, a
// valid label value (the run's name labels its requests).
func runName(agent, user, namespace, messageID string) string {
	sum := sha256.Sum256([]byte(user + "\x00" + namespace + "\x00" + agent + "\x00" + messageID))
	prefix := strings.ReplaceAll(agent, ".", "-")
	if len(prefix) > 40 {
		prefix = prefix[:40]
	}
	return strings.TrimRight(prefix, "-") + "-" + hex.EncodeToString(sum[:6])
}

// read is the task id as the caller sees it: the run and the requests it waits on. A run the
// caller may not read, or of another agent, is not found.
func (ep *endpoint) read(ctx context.Context, id string) (view, *a2a.Error) {
	notFound := a2a.Errorf(a2a.CodeTaskNotFound, "TASK_NOT_FOUND", "Task not found: %s", id)
	if id == "" || len(validation.IsDNS1123Subdomain(id)) > 0 {
		return view{}, notFound
	}
	run := &toolnexusv1alpha1.AgentRun{}
	if err := ep.caller.client.Get(ctx, types.NamespacedName{Namespace: ep.namespace, Name: id}, run); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
			return view{}, notFound
		}
		return view{}, refused(err, "reading the task's run")
	}
	if run.Spec.AgentRef == nil || run.Spec.AgentRef.Name != ep.agent {
		return view{}, notFound
	}
	return ep.viewOf(ctx, run), nil
}

// viewOf reads the requests run waits on, as far as the caller may.
func (ep *endpoint) viewOf(ctx context.Context, run *toolnexusv1alpha1.AgentRun) view {
	v := view{run: run}
	for _, p := range run.Status.Pending {
		preq := &toolnexusv1alpha1.PendingRequest{}
		if err := ep.caller.client.Get(ctx, types.NamespacedName{Namespace: run.Namespace, Name: p.Name}, preq); err != nil {
			continue // the status summary is shown instead
		}
		if v.details == nil {
			v.details = map[string]*toolnexusv1alpha1.PendingRequest{}
		}
		v.details[p.Name] = preq
	}
	return v
}

func (ep *endpoint) getTask(ctx context.Context, params json.RawMessage) (any, *a2a.Error) {
	var req a2a.GetTaskRequest
	if err := decodeParams(params, &req); err != nil {
		return nil, err
	}
	v, err := ep.read(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	return v.task(req.HistoryLength, true), nil
}

// cancelTask sets spec.cancel on the run, as the caller.
func (ep *endpoint) cancelTask(ctx context.Context, params json.RawMessage) (any, *a2a.Error) {
	var req a2a.CancelTaskRequest
	if err := decodeParams(params, &req); err != nil {
		return nil, err
	}
	v, rpcErr := ep.read(ctx, req.ID)
	if rpcErr != nil {
		return nil, rpcErr
	}
	if state, _ := stateOf(v.run); state.Terminal() {
		return nil, a2a.Errorf(a2a.CodeTaskNotCancelable, "TASK_NOT_CANCELABLE", "Task %s is %s and cannot be canceled", req.ID, state.Short())
	}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"cancel":true}}`))
	if err := ep.caller.client.Patch(ctx, v.run, patch); err != nil {
		return nil, refused(err, "cancelling the run")
	}
	ep.log.Info("Cancelled a run for an A2A caller", "run", v.run.Name)
	return view{run: v.run}.task(nil, true), nil
}

// listTasks lists the caller's own tasks of the agent: the runs of it whose spec.requestedBy is
// the caller, most recently changed first.
func (ep *endpoint) listTasks(ctx context.Context, params json.RawMessage) (any, *a2a.Error) {
	var req a2a.ListTasksRequest
	if len(params) > 0 {
		if err := decodeParams(params, &req); err != nil {
			return nil, err
		}
	}
	size := int32(defaultPageSize)
	if req.PageSize != nil {
		if *req.PageSize < 1 || *req.PageSize > maxPageSize {
			return nil, a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: pageSize must be 1 to %d", maxPageSize)
		}
		size = *req.PageSize
	}
	var after time.Time
	if req.StatusTimestampAfter != "" {
		var err error
		if after, err = time.Parse(time.RFC3339Nano, req.StatusTimestampAfter); err != nil {
			return nil, a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: statusTimestampAfter is not an ISO 8601 timestamp: %v", err)
		}
	}
	cursor, err := decodeCursor(req.PageToken)
	if err != nil {
		return nil, a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: pageToken is not one this agent gave")
	}
	runs, rpcErr := ep.ownRuns(ctx)
	if rpcErr != nil {
		return nil, rpcErr
	}
	var matched []*toolnexusv1alpha1.AgentRun
	for _, run := range runs {
		state, _ := stateOf(run)
		switch {
		case req.ContextID != "" && run.Annotations[ContextAnnotation] != req.ContextID,
			req.Status != "" && req.Status != a2a.TaskStateUnspecified && state != req.Status,
			!after.IsZero() && !statusTime(run).After(after):
			continue
		}
		matched = append(matched, run)
	}
	slices.SortFunc(matched, func(a, b *toolnexusv1alpha1.AgentRun) int {
		return cmp.Or(statusTime(b).Compare(statusTime(a)), strings.Compare(a.Name, b.Name))
	})
	start := 0
	if cursor != nil {
		start = slices.IndexFunc(matched, func(run *toolnexusv1alpha1.AgentRun) bool { return cursor.before(run) })
		if start < 0 {
			start = len(matched)
		}
	}
	end := min(start+int(size), len(matched))
	out := a2a.ListTasksResponse{Tasks: []a2a.Task{}, PageSize: size, TotalSize: int32(len(matched))}
	artifacts := req.IncludeArtifacts != nil && *req.IncludeArtifacts
	for _, run := range matched[start:end] {
		out.Tasks = append(out.Tasks, view{run: run}.task(req.HistoryLength, artifacts))
	}
	if end < len(matched) {
		out.NextPageToken = encodeCursor(matched[end-1])
	}
	return out, nil
}

// ownRuns lists the runs of the agent the caller requested, as the caller.
func (ep *endpoint) ownRuns(ctx context.Context) ([]*toolnexusv1alpha1.AgentRun, *a2a.Error) {
	var out []*toolnexusv1alpha1.AgentRun
	opts := &client.ListOptions{Namespace: ep.namespace, Limit: 500}
	for seen := 0; ; {
		list := &toolnexusv1alpha1.AgentRunList{}
		if err := ep.caller.client.List(ctx, list, opts); err != nil {
			return nil, refused(err, "listing the runs")
		}
		for i := range list.Items {
			run := &list.Items[i]
			if run.Spec.AgentRef != nil && run.Spec.AgentRef.Name == ep.agent && run.Spec.RequestedBy == ep.caller.user {
				out = append(out, run)
			}
		}
		if seen += len(list.Items); list.Continue == "" {
			return out, nil
		}
		if seen >= maxListed {
			return nil, a2a.Errorf(a2a.CodeInternalError, "", "the namespace holds more than %d runs; ListTasks looks at at most that many", maxListed)
		}
		opts.Continue = list.Continue
	}
}

var errBadCursor = errors.New("a page token holds a time and a name")

// cursor is where a page ends: the status time and name of its last task.
type cursor struct {
	at   time.Time
	name string
}

// before reports whether run comes after the cursor in the list's order.
func (c *cursor) before(run *toolnexusv1alpha1.AgentRun) bool {
	t := statusTime(run).Truncate(time.Millisecond)
	return t.Before(c.at) || (t.Equal(c.at) && run.Name > c.name)
}

func encodeCursor(run *toolnexusv1alpha1.AgentRun) string {
	return base64.RawURLEncoding.EncodeToString([]byte(stamp(statusTime(run)) + " " + run.Name))
}

func decodeCursor(token string) (*cursor, error) {
	if token == "" {
		return nil, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return nil, err
	}
	at, name, ok := strings.Cut(string(raw), " ")
	if !ok {
		return nil, errBadCursor
	}
	t, err := time.Parse("2006-01-02T15:04:05.000Z", at)
	if err != nil {
		return nil, err
	}
	return &cursor{at: t, name: name}, nil
}

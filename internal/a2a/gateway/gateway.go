// Package gateway serves the namespace's Agents over A2A 1.0 (the JSON-RPC binding of package
// a2a), as a process of its own: cmd/a2a-gateway. Each Agent is an endpoint,
// /agents/<namespace>/<name>/, with its card under it; a message creates an AgentRun of the Agent
// (its task), the task's state follows the run, and a follow-up message on a task that asks for
// input answers the PendingRequest it waits on.
//
// The gateway holds no state and decides nothing: every read and write is made as the caller,
// authenticated by their Kubernetes token (TokenReview) and impersonated, so what a caller may do
// over A2A is what RBAC and the admission policies let them do with kubectl. Its own
// ServiceAccount may create TokenReviews and impersonate users and groups, nothing else; it
// refuses to act as a ServiceAccount or any system: identity (docs/security.md).
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/a2a"
)

// Defaults of Options.
const (
	DefaultMaxBodyBytes      = 1 << 20
	DefaultBlockingTimeout   = time.Minute
	DefaultMaxStreamDuration = 30 * time.Minute
	DefaultMaxStreams        = 256
)

// Options configure a Gateway.
type Options struct {
	// Config is the gateway's own identity: it reviews tokens, and the clients that impersonate
	// callers are made from it.
	Config *rest.Config
	// Scheme holds the toolnexus.dev types and the built-in ones.
	Scheme *runtime.Scheme
	// PublicURL is where callers reach the gateway (https://a2a.example.com): agent cards name
	// their endpoints under it.
	PublicURL string
	// Audiences, when set, are the token audiences the gateway accepts (TokenReview audiences).
	Audiences []string
	// MaxBodyBytes bounds a request body (DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// BlockingTimeout bounds how long a blocking SendMessage waits for its task to end or to ask
	// for input before it answers with the task as it is (DefaultBlockingTimeout).
	BlockingTimeout time.Duration
	// MaxStreamDuration bounds a stream (SendStreamingMessage, SubscribeToTask); the client
	// subscribes again to go on (DefaultMaxStreamDuration).
	MaxStreamDuration time.Duration
	// MaxStreams bounds the streams and blocking sends open at once (DefaultMaxStreams).
	MaxStreams int
	// Log receives the gateway's logs; never a token, a prompt or an answer.
	Log logr.Logger
}

// Gateway serves A2A.
type Gateway struct {
	opts    Options
	own     client.Client
	mapper  meta.RESTMapper
	streams chan struct{}
}

// New returns a gateway acting with o.Config.
func New(o Options) (*Gateway, error) {
	if o.Config == nil || o.Scheme == nil {
		return nil, errors.New("a2a gateway: Config and Scheme are required")
	}
	if !strings.HasPrefix(o.PublicURL, "http://") && !strings.HasPrefix(o.PublicURL, "https://") {
		return nil, fmt.Errorf("a2a gateway: the public URL %q is not an http(s) URL", o.PublicURL)
	}
	o.PublicURL = strings.TrimSuffix(o.PublicURL, "/")
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.BlockingTimeout <= 0 {
		o.BlockingTimeout = DefaultBlockingTimeout
	}
	if o.MaxStreamDuration <= 0 {
		o.MaxStreamDuration = DefaultMaxStreamDuration
	}
	if o.MaxStreams <= 0 {
		o.MaxStreams = DefaultMaxStreams
	}
	// A fixed mapping of the kinds the gateway touches: no discovery per caller.
	mapper := meta.NewDefaultRESTMapper(nil)
	for _, kind := range []string{"AgentRun", "Agent", "PendingRequest"} {
		mapper.Add(toolnexusv1alpha1.GroupVersion.WithKind(kind), meta.RESTScopeNamespace)
	}
	mapper.Add(authenticationGVK, meta.RESTScopeRoot)
	own, err := client.New(o.Config, client.Options{Scheme: o.Scheme, Mapper: mapper})
	if err != nil {
		return nil, fmt.Errorf("a2a gateway: %w", err)
	}
	return &Gateway{opts: o, own: own, mapper: mapper, streams: make(chan struct{}, o.MaxStreams)}, nil
}

// Handler serves the agents' endpoints and cards, and /healthz.
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("GET /agents/{namespace}/{name}/"+a2a.WellKnownCardPath, g.serveCard)
	mux.HandleFunc("POST /agents/{namespace}/{name}/{$}", g.serveRPC)
	mux.HandleFunc("POST /agents/{namespace}/{name}", g.serveRPC)
	return mux
}

// Endpoint is the URL the agent namespace/name is served at.
func (g *Gateway) Endpoint(namespace, name string) string {
	return g.opts.PublicURL + "/agents/" + namespace + "/" + name + "/"
}

// endpoint is one request to one agent, by one caller.
type endpoint struct {
	g         *Gateway
	caller    *caller
	namespace string
	agent     string
	log       logr.Logger
}

// open authenticates r and names the agent its path addresses; false when it answered r itself.
func (g *Gateway) open(w http.ResponseWriter, r *http.Request) (*endpoint, bool) {
	namespace, name := r.PathValue("namespace"), r.PathValue("name")
	if len(validation.IsDNS1123Label(namespace)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		http.Error(w, "the path names no agent: /agents/<namespace>/<name>/", http.StatusNotFound)
		return nil, false
	}
	c, err := g.authenticate(r.Context(), r)
	if err != nil {
		var refused *authError
		if errors.As(err, &refused) {
			if refused.status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="toolnexus-a2a"`)
			}
			writeJSON(w, refused.status, map[string]string{"error": refused.msg})
			return nil, false
		}
		g.opts.Log.Error(err, "Cannot authenticate a request")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "the gateway cannot review tokens now"})
		return nil, false
	}
	log := g.opts.Log.WithValues("user", c.user, "agent", namespace+"/"+name)
	return &endpoint{g: g, caller: c, namespace: namespace, agent: name, log: log}, true
}

// serveRPC answers one JSON-RPC request.
func (g *Gateway) serveRPC(w http.ResponseWriter, r *http.Request) {
	ep, ok := g.open(w, r)
	if !ok {
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.opts.MaxBodyBytes))
	if err != nil {
		writeRPC(w, nil, nil, a2a.Errorf(a2a.CodeInvalidRequest, "", "the request body exceeds %d bytes or cannot be read", g.opts.MaxBodyBytes))
		return
	}
	var req a2a.Request
	if err := json.Unmarshal(body, &req); err != nil {
		writeRPC(w, nil, nil, a2a.Errorf(a2a.CodeParseError, "", "Invalid JSON payload: %v", err))
		return
	}
	if req.JSONRPC != "2.0" || req.Method == "" || len(req.ID) == 0 || string(req.ID) == "null" {
		writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeInvalidRequest, "", `a request needs "jsonrpc": "2.0", a method and an id`))
		return
	}
	if v := requestedVersion(r); v != a2a.ProtocolVersion {
		writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeVersionNotSupported, "VERSION_NOT_SUPPORTED",
			"A2A version %q is not supported: this agent speaks %s (send the header %s: %s)",
			v, a2a.ProtocolVersion, a2a.VersionHeader, a2a.ProtocolVersion))
		return
	}
	ep.log.V(1).Info("A2A request", "method", req.Method)
	ctx := r.Context()
	var result any
	var rpcErr *a2a.Error
	switch req.Method {
	case a2a.MethodSendMessage:
		result, rpcErr = ep.sendMessage(ctx, r, req.Params)
	case a2a.MethodSendStreamingMessage, a2a.MethodSubscribeToTask:
		ep.stream(w, r, req)
		return
	case a2a.MethodGetTask:
		result, rpcErr = ep.getTask(ctx, req.Params)
	case a2a.MethodListTasks:
		result, rpcErr = ep.listTasks(ctx, req.Params)
	case a2a.MethodCancelTask:
		result, rpcErr = ep.cancelTask(ctx, req.Params)
	case "CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig", "ListTaskPushNotificationConfigs", "DeleteTaskPushNotificationConfig":
		rpcErr = a2a.Errorf(a2a.CodePushNotificationNotSupported, "PUSH_NOTIFICATION_NOT_SUPPORTED",
			"push notifications are not supported: poll GetTask or stream with SubscribeToTask")
	case "GetExtendedAgentCard":
		rpcErr = a2a.Errorf(a2a.CodeUnsupportedOperation, "UNSUPPORTED_OPERATION", "this agent has no extended card")
	default:
		rpcErr = a2a.Errorf(a2a.CodeMethodNotFound, "", "Method not found: %s", req.Method)
	}
	writeRPC(w, req.ID, result, rpcErr)
}

// requestedVersion is the A2A-Version of r, from its header or its query; empty means 0.3 (§3.6.2).
func requestedVersion(r *http.Request) string {
	v := r.Header.Get(a2a.VersionHeader)
	if v == "" {
		v = r.URL.Query().Get(a2a.VersionHeader)
	}
	if v == "" {
		return "0.3"
	}
	return strings.TrimSpace(v)
}

// decodeParams decodes params into v; fields the gateway does not know are ignored (§5.7).
func decodeParams(params json.RawMessage, v any) *a2a.Error {
	if len(params) == 0 {
		return a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: params are required")
	}
	if err := json.Unmarshal(params, v); err != nil {
		return a2a.Errorf(a2a.CodeInvalidParams, "", "Invalid parameters: %v", err)
	}
	return nil
}

// refused maps an error of the API server, for a write the caller asked for, to the JSON-RPC
// error the caller is given: the API server's own message, which names what was refused and why.
func refused(err error, what string) *a2a.Error {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return a2a.Errorf(a2a.CodeInternalError, "", "%s: %v", what, err)
	}
	msg := status.Status().Message
	switch {
	case apierrors.IsForbidden(err):
		return a2a.Errorf(a2a.CodeRefused, "FORBIDDEN", "%s was refused: %s", what, msg)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return a2a.Errorf(a2a.CodeInvalidParams, "INVALID", "%s was refused: %s", what, msg)
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
		return a2a.Errorf(a2a.CodeRefused, "CONFLICT", "%s was refused: %s", what, msg)
	}
	return a2a.Errorf(a2a.CodeInternalError, "", "%s failed: %s", what, msg)
}

func writeRPC(w http.ResponseWriter, id json.RawMessage, result any, rpcErr *a2a.Error) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	resp := a2a.Response{JSONRPC: "2.0", ID: id, Error: rpcErr}
	if rpcErr == nil {
		raw, err := json.Marshal(result)
		if err != nil {
			resp.Error = a2a.Errorf(a2a.CodeInternalError, "", "Internal error: %v", err)
		} else {
			resp.Result = raw
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// acquire takes a slot for a long request (a stream, a blocking send), or false when all are
// taken.
func (g *Gateway) acquire(ctx context.Context) (func(), bool) {
	select {
	case g.streams <- struct{}{}:
		return func() { <-g.streams }, true
	case <-ctx.Done():
		return nil, false
	default:
		return nil, false
	}
}

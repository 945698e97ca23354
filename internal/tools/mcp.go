package tools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolnexus/operator/internal/netguard"
)

// DefaultMCPTimeout bounds each phase of talking to an MCP server when the spec names none.
const DefaultMCPTimeout = 30 * time.Second

// MCPServerSpec describes one remote MCP server, reached over streamable HTTP.
type MCPServerSpec struct {
	Name string
	URL  string
	// Headers are added to every HTTP request of every session, resolved per session.
	Headers []Header
	// AllowTools lists the tools to expose, by the names the server gives them; empty means all.
	AllowTools []string
	// Timeout bounds each phase separately: connecting, listing the tools, and each tool call.
	// It defaults to DefaultMCPTimeout.
	Timeout time.Duration
	// HTTPClient defaults to a netguard client; its Transport carries the requests. Whatever the
	// client, redirects stay within the origin, since every request carries the Headers.
	HTTPClient *http.Client
	// MaxOutputBytes caps a tool's output; it defaults to DefaultMaxOutputBytes.
	MaxOutputBytes int
	// OAuth, when set, signs the sessions in (OAuth). Listing the tools without a login fails
	// with a *LoginRequiredError; SignInTools stand in for them until someone signs in.
	OAuth OAuth
}

// MCPServer is a connected MCP server: the tools it offered when it was listed.
//
// Every tool call opens its own MCP session and closes it when the call returns. That is what
// makes the elicitation bridge exact (an elicitation arriving on a session belongs to the one
// call in flight on it), isolates a call from a session another call broke, and needs no
// reconnection logic when the server restarts between calls. The cost is one initialize round
// trip per call, and that session-scoped server state does not carry from one call to the next:
// state a tool relies on must be keyed on something stable, such as the user's credentials.
type MCPServer struct {
	spec    MCPServerSpec
	tools   []Tool
	missing []string
	// revision is the protocol revision negotiated when listing; tasks says the server declares
	// the tasks extension, so its calls go through taskRPC (mcp_task.go).
	revision string
	tasks    bool
}

// ConnectMCP connects to the server, lists its tools (following pagination) and closes the
// session. An error means the server is unusable; the caller reports it (as a condition) and
// carries on without the server's tools.
func ConnectMCP(ctx context.Context, spec MCPServerSpec) (*MCPServer, error) {
	s, err := newMCPServer(spec)
	if err != nil {
		return nil, err
	}
	var listErr error
	_, _, refused, err := signedIn(ctx, s.spec.OAuth, s.spec.URL, func(ctx context.Context, token string, seen *challenges) ToolResult {
		listErr = s.list(withLogin(ctx, token, seen))
		return ToolResult{}
	})
	switch {
	case err != nil:
		return nil, fmt.Errorf("mcp server %s: %w", s.spec.Name, err)
	case refused:
		return nil, &LoginRequiredError{Server: s.spec.Name}
	case listErr != nil:
		return nil, listErr
	}
	return s, nil
}

// newMCPServer checks spec and fills in its defaults.
func newMCPServer(spec MCPServerSpec) (*MCPServer, error) {
	if spec.Name == "" {
		return nil, errors.New("mcp server: name is empty")
	}
	if u, err := url.Parse(spec.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("mcp server %s: url %q is not an absolute http(s) URL", spec.Name, spec.URL)
	}
	if spec.Timeout <= 0 {
		spec.Timeout = DefaultMCPTimeout
	}
	spec.HTTPClient = sameOriginRedirects(spec.HTTPClient)
	if spec.MaxOutputBytes <= 0 {
		spec.MaxOutputBytes = DefaultMaxOutputBytes
	}
	return &MCPServer{spec: spec}, nil
}

// LoginRequiredError says an MCP server signed in with OAuth offers its tools only after a login.
type LoginRequiredError struct{ Server string }

func (e *LoginRequiredError) Error() string {
	return fmt.Sprintf("mcp server %s: its tools are offered once someone signs in (auth.oauth)", e.Server)
}

// list lists the server's tools, following pagination.
func (s *MCPServer) list(ctx context.Context) error {
	s.tools, s.missing = nil, nil
	// The listing session advertises elicitation like a call session does: servers may offer
	// tools only to clients that can answer their elicitations. Nothing elicits while listing.
	session, err := s.open(ctx, func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		return &mcp.ElicitResult{Action: "cancel"}, nil
	})
	if err != nil {
		return err
	}
	defer closeSession(session.ClientSession)
	if res := session.InitializeResult(); res != nil {
		s.revision = res.ProtocolVersion
	}
	s.tasks = tasksDeclared(session.ClientSession)
	listCtx, cancel := context.WithTimeout(ctx, s.spec.Timeout)
	defer cancel()
	seen := map[string]bool{}
	for t, err := range session.Tools(listCtx, nil) {
		if err != nil {
			return fmt.Errorf("mcp server %s: listing tools: %s", s.spec.Name, session.explain(err))
		}
		seen[t.Name] = true
		if len(s.spec.AllowTools) == 0 || slices.Contains(s.spec.AllowTools, t.Name) {
			s.tools = append(s.tools, s.tool(t))
		}
	}
	for _, name := range s.spec.AllowTools {
		if !seen[name] {
			s.missing = append(s.missing, name)
		}
	}
	return nil
}

// Tools are the server's tools, named Sanitize(server)+"_"+Sanitize(tool).
func (s *MCPServer) Tools() []Tool { return s.tools }

// MissingTools are names in AllowTools the server does not offer, for a condition to report.
func (s *MCPServer) MissingTools() []string { return s.missing }

func (s *MCPServer) tool(t *mcp.Tool) Tool {
	schema, ok := jsonNative(t.InputSchema).(map[string]any)
	if !ok {
		schema = map[string]any{"type": "object"}
	}
	name := t.Name
	return Tool{
		Name:        Sanitize(s.spec.Name) + "_" + Sanitize(name),
		Description: t.Description,
		InputSchema: schema,
		Source:      SourceMCP,
		URL:         s.spec.URL,
		Remote:      name,
		Execute: func(ctx context.Context, args map[string]any, tc *ToolContext) (ToolResult, error) {
			return s.signedCall(ctx, name, args, tc), nil
		},
	}
}

// signedCall is call signed in with the server's login, when it has one.
func (s *MCPServer) signedCall(ctx context.Context, name string, args map[string]any, tc *ToolContext) ToolResult {
	fail := func(msg string) ToolResult {
		return ToolResult{Output: fmt.Sprintf("MCP server %s: tool %s: %s", s.spec.Name, name, msg), IsError: true}
	}
	return callSignedIn(ctx, s.spec.OAuth, s.spec.URL, fail, func(ctx context.Context, token string, seen *challenges) ToolResult {
		return s.call(withLogin(ctx, token, seen), name, args, tc)
	})
}

// loginKey carries the login a session is signed in with, so every path that opens one carries it.
type loginKey struct{}

type login struct {
	token string
	seen  *challenges
}

func withLogin(ctx context.Context, token string, seen *challenges) context.Context {
	return context.WithValue(ctx, loginKey{}, login{token: token, seen: seen})
}

// mcpSession is an open session, and what its errors are explained with.
type mcpSession struct {
	*mcp.ClientSession
	hdrs   resolvedHeaders
	bodies *bodyErrors
}

// explain is the text of a session error for a result or a condition, with header values
// redacted. A response body cut by the client's bound is named as such: the SDK reports a cut
// event stream only as "request terminated without response".
func (s *mcpSession) explain(err error) string {
	if tooLarge := s.bodies.tooLarge(); tooLarge != nil {
		err = tooLarge
	}
	return s.hdrs.redact(err.Error())
}

// open connects a new session whose elicitations go to elicit.
func (s *MCPServer) open(ctx context.Context, elicit func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error)) (*mcpSession, error) {
	hdrs, err := resolveHeaders(ctx, s.spec.Headers)
	if err != nil {
		return nil, fmt.Errorf("mcp server %s: %w", s.spec.Name, err)
	}
	httpClient, bodies, hdrs := s.httpClient(ctx, hdrs)
	// The SDK's own multi round-trip handling is off: it would answer an input_required result
	// within the call, through elicit, while the call must park on it instead (Asking).
	client := mcp.NewClient(clientInfo, &mcp.ClientOptions{ElicitationHandler: elicit, Capabilities: clientCapabilities(),
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}})
	connectCtx, cancel := context.WithTimeout(ctx, s.spec.Timeout)
	defer cancel()
	transport := &mcp.StreamableClientTransport{Endpoint: s.spec.URL, HTTPClient: httpClient}
	session, err := client.Connect(connectCtx, transport, nil)
	conn := &mcpSession{ClientSession: session, hdrs: hdrs, bodies: bodies}
	if err != nil {
		return nil, fmt.Errorf("mcp server %s: connecting to %s: %s", s.spec.Name, s.spec.URL, conn.explain(err))
	}
	return conn, nil
}

// clientInfo is how the client names itself to servers.
var clientInfo = &mcp.Implementation{Name: "toolnexus-operator", Version: "v1alpha1"}

// clientCapabilities are what every request declares. Both elicitation modes are advertised: form
// elicitations become input requests and URL elicitations authorization requests. The tasks
// extension is declared too: a server may then answer a call with a task, which the run waits on
// without holding anything (mcp_task.go). The roots default is left out on purpose.
func clientCapabilities() *mcp.ClientCapabilities {
	caps := &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{
		Form: &mcp.FormElicitationCapabilities{}, URL: &mcp.URLElicitationCapabilities{},
	}}
	caps.AddExtension(tasksExtension, nil)
	return caps
}

// httpClient is the spec's client carrying hdrs on every request, with its cut bodies watched,
// signed in with the login ctx carries (withLogin); the headers returned redact its token too.
func (s *MCPServer) httpClient(ctx context.Context, hdrs resolvedHeaders) (*http.Client, *bodyErrors, resolvedHeaders) {
	httpClient := *s.spec.HTTPClient
	base := httpClient.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	bodies := &bodyErrors{base: base}
	var signed http.RoundTripper = bodies
	if l, ok := ctx.Value(loginKey{}).(login); ok {
		signed = challengeTransport{base: bodies, seen: l.seen}
		hdrs = hdrs.authorized(l.token)
	}
	httpClient.Transport = headerTransport{base: signed, header: hdrs.header}
	return &httpClient, bodies, hdrs
}

// bodyErrors remembers the first response body of a session that went past the client's bound
// (a netguard.ResponseTooLargeError), so the session's errors can name it.
type bodyErrors struct {
	base  http.RoundTripper
	mu    sync.Mutex
	first error
}

func (b *bodyErrors) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.base.RoundTrip(req)
	if err == nil && resp.Body != nil {
		resp.Body = watchedBody{ReadCloser: resp.Body, errs: b}
	}
	return resp, err
}

func (b *bodyErrors) tooLarge() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.first
}

type watchedBody struct {
	io.ReadCloser
	errs *bodyErrors
}

func (w watchedBody) Read(p []byte) (int, error) {
	n, err := w.ReadCloser.Read(p)
	var tooLarge *netguard.ResponseTooLargeError
	if errors.As(err, &tooLarge) {
		w.errs.mu.Lock()
		if w.errs.first == nil {
			w.errs.first = err
		}
		w.errs.mu.Unlock()
	}
	return n, err
}

// closeSession ends the session in the background, so the caller has its result at once. The
// SDK bounds the DELETE it sends to a few seconds, so the goroutine always ends.
func closeSession(session *mcp.ClientSession) {
	go func() { _ = session.Close() }()
}

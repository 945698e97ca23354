// Package runspec turns an agent's spec (an AgentRun's, or an Agent's) into what the loop runs:
// the model client with its options and approval gates, the tools that need no connection, and
// the MCP servers a step connects. It is the one builder: a run builds with its Secrets resolved,
// the Agent controller builds with none to say whether the agent can run. No I/O.
package runspec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/tools"
)

// DefaultModelTimeout bounds one model request when the spec sets no requestTimeout.
const DefaultModelTimeout = 120 * time.Second

// Error is a spec that passed admission but cannot run, with the reason an Agent's Ready
// condition names (a run fails InvalidSpec with the message).
type Error struct {
	Reason string
	Err    error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

func invalid(reason string, err error) *Error { return &Error{Reason: reason, Err: err} }

// Env is what a build takes from its host. The zero Env builds for validation: no credentials,
// no client, no hooks into the host.
type Env struct {
	// APIKey is the model's key, read from spec.model.apiKeySecretRef.
	APIKey string
	// Headers turns the header specs of the tool or MCP server named by what into tool headers
	// (Secret values resolved at call time); nil keeps only literal values.
	Headers func(hs []toolnexusv1alpha1.HTTPHeader, what string) []tools.Header
	// HTTPClient carries model, tool and MCP traffic.
	HTTPClient *http.Client
	// IdempotencyPrefix starts every tool call's Idempotency-Key (the run's UID).
	IdempotencyPrefix string
	// OnEvent, Clock, Tracer and MaxToolCallsPerTurn go to the loop's Options as they are.
	OnEvent             func(loop.Event)
	Clock               func() time.Time
	Tracer              loop.Tracer
	MaxToolCallsPerTurn int
	// Policies returns the gates the platform's ApprovalPolicies raise over a call, in the order
	// they are asked; nil raises none (an Agent's validation).
	Policies func(ctx context.Context, call PolicyCall) ([]PolicyGate, error)
	// OAuth signs in the tool or MCP server named by what, whose requests go to URLs under base
	// (an MCP server's URL; an HTTP tool's up to its first placeholder), with spec; nil signs
	// nothing in (an Agent's validation).
	OAuth func(spec toolnexusv1alpha1.OAuthSpec, base, what string) tools.OAuth
	// SubAgents carries out the calls of agentRef tools (agent.go); nil fails them saying so (an
	// Agent's validation).
	SubAgents func(ctx context.Context, call SubAgentCall) tools.ToolResult
}

// PolicyCall is a tool call as the platform's policies are asked about it.
type PolicyCall struct {
	// Tool is the call's tool name; URL and Remote what it reaches (tools.Tool).
	Tool, URL, Remote string
	Args              map[string]any
	// ID and RawArguments are the call's id and its arguments as JSON.
	ID, RawArguments string
}

// PolicyGate is one gate an ApprovalPolicy raises over a call.
type PolicyGate struct {
	// Key tells it from the call's other gates: "policy/<name>".
	Key string
	// Refused, when set, refuses the call with this message: the policy cannot be applied, and
	// a gate that cannot be applied never lets a call through.
	Refused string
	// Request is the approval request; Timeout, when set, is when it expires.
	Request *tools.Request
	Timeout time.Duration
	// OnTimeout and Terms are saved with the call (state.Gate).
	OnTimeout string
	Terms     json.RawMessage
}

// RunGateKey is the key of the gate a run's own spec.approvals raise.
const RunGateKey = "run"

// Built is a spec ready to step.
type Built struct {
	Client *loop.Client
	// Local are the tools that need no connection: HTTP, A2A and agentRef tools, and built-ins.
	Local []tools.Tool
	// A2A are the A2A tools' specs, for stopping a remote task a call no longer waits on.
	A2A []tools.A2AToolSpec
	// MCP are the servers a step connects (Toolkit).
	MCP []tools.MCPServerSpec
}

// Build builds spec. Every error is an *Error naming the field.
func Build(spec *toolnexusv1alpha1.AgentSpec, env Env) (*Built, error) {
	headers := func(hs []toolnexusv1alpha1.HTTPHeader, what string) []tools.Header {
		if env.Headers != nil {
			return env.Headers(hs, what)
		}
		var out []tools.Header
		for _, h := range hs {
			if h.Value != nil {
				out = append(out, tools.Header{Name: h.Name, Value: *h.Value})
			}
		}
		return out
	}
	signIn := func(auth *toolnexusv1alpha1.ToolAuth, base, what string) tools.OAuth {
		if auth == nil || auth.OAuth == nil || env.OAuth == nil {
			return nil
		}
		return env.OAuth(*auth.OAuth, base, what)
	}
	b := &Built{}
	for i, t := range spec.Tools {
		if t.AgentRef != nil {
			b.Local = append(b.Local, agentTool(t, env))
			continue
		}
		if t.A2A != nil {
			a2aSpec := tools.A2AToolSpec{Name: t.Name, Description: t.Description, InputSchema: jsonObject(t.Parameters),
				URL: t.A2A.URL, Timeout: durationOr(t.A2A.Timeout, 0), Client: env.HTTPClient,
				Headers: headers(t.A2A.Headers, fmt.Sprintf("spec.tools[%d].a2a.headers", i))}
			tool, err := tools.A2ATool(a2aSpec)
			if err != nil {
				return nil, invalid(toolnexusv1alpha1.ReasonInvalidTool, fmt.Errorf("spec.tools[%d]: %w", i, err))
			}
			b.Local, b.A2A = append(b.Local, tool), append(b.A2A, a2aSpec)
			continue
		}
		if t.HTTP == nil {
			return nil, invalid(toolnexusv1alpha1.ReasonInvalidTool, fmt.Errorf("spec.tools[%d]: set one of http, agentRef or a2a", i))
		}
		tool, err := tools.HTTPTool(tools.HTTPToolSpec{
			Name: t.Name, Description: t.Description, InputSchema: jsonObject(t.Parameters),
			URL: t.HTTP.URL, Method: string(t.HTTP.Method), Timeout: durationOr(t.HTTP.Timeout, 0),
			Headers: headers(t.HTTP.Headers, fmt.Sprintf("spec.tools[%d].http.headers", i)),
			Client:  env.HTTPClient,
			OAuth:   signIn(t.HTTP.Auth, tools.URLBase(t.HTTP.URL), fmt.Sprintf("spec.tools[%d]", i)),
		})
		if err != nil {
			return nil, invalid(toolnexusv1alpha1.ReasonInvalidTool, fmt.Errorf("spec.tools[%d]: %w", i, err))
		}
		b.Local = append(b.Local, tool)
	}
	for i, s := range spec.MCPServers {
		b.MCP = append(b.MCP, tools.MCPServerSpec{
			Name: s.Name, URL: s.URL, AllowTools: s.Tools, Timeout: durationOr(s.Timeout, 0),
			Headers:    headers(s.Headers, fmt.Sprintf("spec.mcpServers[%d].headers", i)),
			HTTPClient: env.HTTPClient,
			OAuth:      signIn(s.Auth, s.URL, fmt.Sprintf("spec.mcpServers[%d]", i)),
		})
	}
	for _, builtin := range spec.Builtins {
		if builtin == toolnexusv1alpha1.BuiltinQuestion {
			b.Local = append(b.Local, tools.QuestionTool())
		}
	}
	if _, err := tools.NewToolkit(b.Local...); err != nil {
		return nil, invalid(toolnexusv1alpha1.ReasonInvalidTool, err)
	}
	hooks, err := gateHooks(spec.Approvals, env)
	if err != nil {
		return nil, invalid(toolnexusv1alpha1.ReasonInvalidApproval, err)
	}
	b.Client, err = loop.New(loop.Options{
		BaseURL: spec.Model.BaseURL, Style: string(spec.Model.Style), Model: spec.Model.Name, APIKey: env.APIKey,
		SystemPrompt: spec.SystemPrompt, MaxTurns: int(spec.MaxTurns), Hooks: hooks,
		RequestTimeout: durationOr(spec.Model.RequestTimeout, DefaultModelTimeout), HTTPClient: env.HTTPClient,
		IdempotencyPrefix: env.IdempotencyPrefix, OnEvent: env.OnEvent, Clock: env.Clock,
		SuspensionTimeout: SuspensionTimeout(spec.Suspension), MaxToolCallsPerTurn: env.MaxToolCallsPerTurn,
		Tracer: env.Tracer,
	})
	if err != nil {
		return nil, invalid(toolnexusv1alpha1.ReasonInvalidModel, err)
	}
	return b, nil
}

// MCPReport is how the run's MCP servers answered when its tools were built.
type MCPReport struct {
	// Failures names each server that could not be reached or does not offer an allow-listed
	// tool, with why (its tools are left out).
	Failures []string
	// Revisions names each server that answered with the MCP revision negotiated with it,
	// "<name> (MCP <revision>)", in the spec's order.
	Revisions []string
}

// Toolkit connects the MCP servers and returns every tool, with how the servers answered. A tool
// set that cannot be put together is an *Error.
func (b *Built) Toolkit(ctx context.Context) (tk *tools.Toolkit, report MCPReport, err error) {
	all := append([]tools.Tool(nil), b.Local...)
	failed := map[string]error{}
	for _, spec := range b.MCP {
		server, err := tools.ConnectMCP(ctx, spec)
		if login := (*tools.LoginRequiredError)(nil); errors.As(err, &login) {
			standIns, err := tools.SignInTools(spec)
			if err != nil {
				return nil, report, invalid(toolnexusv1alpha1.ReasonInvalidTool, err)
			}
			all = append(all, standIns...)
			continue
		}
		if err != nil {
			report.Failures = append(report.Failures, fmt.Sprintf("%s: %v", spec.Name, err))
			failed[spec.Name] = err
			continue
		}
		all = append(all, server.Tools()...)
		report.Revisions = append(report.Revisions, fmt.Sprintf("%s (MCP %s)", spec.Name, server.Revision()))
		if missing := server.MissingTools(); len(missing) > 0 {
			// An allow-list entry the server does not offer is most likely a typo: say so.
			report.Failures = append(report.Failures, fmt.Sprintf("%s: does not offer the allow-listed tools %s", spec.Name, strings.Join(missing, ", ")))
		}
	}
	if tk, err = tools.NewToolkit(all...); err != nil {
		return nil, report, invalid(toolnexusv1alpha1.ReasonInvalidTool, err)
	}
	for server, err := range failed {
		tk.Unreachable(server, err)
	}
	return tk, report, nil
}

// gateHooks turns the platform's policies and spec.approvals into the BeforeTool hook that raises
// approval requests: every policy gate over a call first, in the order env.Policies gives them,
// then the run's own; each once, the next only once the one before approved (loop.Hooks).
func gateHooks(approvals []toolnexusv1alpha1.ApprovalGate, env Env) (loop.Hooks, error) {
	var gates *tools.Gates
	if len(approvals) > 0 {
		specs := make([]tools.GateSpec, len(approvals))
		for i, a := range approvals {
			specs[i] = tools.GateSpec{Tools: a.Tools, When: a.When, Prompt: a.Prompt}
		}
		var err error
		if gates, err = tools.NewGates(specs); err != nil {
			return loop.Hooks{}, fmt.Errorf("spec.approvals: %w", err)
		}
	}
	if gates == nil && env.Policies == nil {
		return loop.Hooks{}, nil
	}
	now := env.Clock
	if now == nil {
		now = time.Now
	}
	return loop.Hooks{BeforeTool: func(ctx context.Context, ev loop.BeforeToolEvent) (*loop.ToolOverride, error) {
		raw, err := json.Marshal(ev.Args)
		if err != nil {
			return nil, err
		}
		if env.Policies != nil {
			policies, err := env.Policies(ctx, PolicyCall{Tool: ev.Name, URL: ev.URL, Remote: ev.Remote, Args: ev.Args,
				ID: ev.ID, RawArguments: string(raw)})
			if err != nil {
				return nil, err
			}
			for _, g := range policies {
				if slices.Contains(ev.Passed, g.Key) {
					continue
				}
				if g.Refused != "" {
					res := tools.ToolResult{Output: fmt.Sprintf("%s was not run: %s", ev.Name, g.Refused), IsError: true}
					return &loop.ToolOverride{Result: &res}, nil
				}
				req := *g.Request
				if g.Timeout > 0 {
					req.ExpiresAt = now().Add(g.Timeout).UTC().Format(time.RFC3339)
				}
				res := tools.Pending(req)
				return &loop.ToolOverride{Result: &res, Gate: &loop.Gate{Key: g.Key, OnTimeout: g.OnTimeout, Terms: g.Terms}}, nil
			}
		}
		// A call gated before gates had keys passed the run's gate under the empty key.
		if gates == nil || slices.Contains(ev.Passed, RunGateKey) || slices.Contains(ev.Passed, "") {
			return nil, nil
		}
		req, err := gates.Check(ev.Name, ev.Args, ev.ID, string(raw))
		if errors.Is(err, tools.ErrPromptRender) {
			// The run ends InvalidSpec: no call of this gate could be shown.
			return nil, invalid(toolnexusv1alpha1.ReasonInvalidApproval, err)
		}
		if req == nil {
			return nil, err
		}
		if err != nil {
			// A `when` that cannot be evaluated requires approval; the approver sees why.
			req.Data["whenError"] = err.Error()
		}
		res := tools.Pending(*req)
		return &loop.ToolOverride{Result: &res, Gate: &loop.Gate{Key: RunGateKey}}, nil
	}}, nil
}

// jsonObject decodes an optional JSON object field; nil or non-object JSON gives nil.
func jsonObject(j *apiextensionsv1.JSON) map[string]any {
	if j == nil {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(j.Raw, &m) != nil {
		return nil
	}
	return m
}

// SuspensionTimeout is how long the requests of a spec with policy p wait before they expire; 0
// is forever.
func SuspensionTimeout(p *toolnexusv1alpha1.SuspensionPolicy) time.Duration {
	if p == nil {
		return 0
	}
	return durationOr(p.Timeout, 0)
}

// durationOr returns d, or def when d is unset.
func durationOr(d *metav1.Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.Duration
}

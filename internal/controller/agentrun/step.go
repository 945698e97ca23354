package agentrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/controller/policy"
	"github.com/toolnexus/operator/internal/controller/runspec"
	"github.com/toolnexus/operator/internal/executor"
	"github.com/toolnexus/operator/internal/kube"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/oauth"
	"github.com/toolnexus/operator/internal/runstore"
	"github.com/toolnexus/operator/internal/telemetry"
	"github.com/toolnexus/operator/internal/tools"
)

// Model requests and tool calls never run on a reconcile worker. A reconcile decides that the run
// can take a step, submits it to the executor with a copy of the state, and returns; the step runs
// there (the tool calls of a turn, then the next model turn: a model turn is always saved before
// the tool calls it asks for run), keeps its outcome here, and wakes the run, whose next reconcile
// saves the outcome and goes on. While a step is in flight the run's state is not touched.

// stepOutcome is what a finished step left for its run's next reconcile.
type stepOutcome struct {
	uid types.UID
	// from is the record the step started from, as the reconcile that submitted it left it (nothing
	// touches it since): the reconcile that takes the outcome starts from it, with no read, and
	// applies the outcome to it. Another writer meanwhile makes the save conflict (the head's
	// resourceVersion), and the step is taken again from a fresh read.
	from  *runstore.Record
	state *loop.State
	err   error
	// toolsBuilt says whether the MCP servers were connected, and mcp how they answered.
	toolsBuilt bool
	mcp        runspec.MCPReport
	// events are those of the reconcile that submitted the step with state it had not saved (an
	// answer consumed): they are recorded once the outcome, which holds that state, is saved.
	events []func()
	// done gives the memory the step held back to the executor (see executor.Keep): once its
	// outcome is saved, or dropped.
	done func()
}

// release gives back what the outcome holds in the executor's memory budget; nil does nothing.
func (o *stepOutcome) release() {
	if o != nil && o.done != nil {
		o.done()
	}
}

// submitStep hands the run's next step to the executor, admitted by the memory it may hold (its
// copy of the state's structure, the request it sends; what it reads is charged as it arrives).
// The step works on a copy of the state made when it starts, so a queued step holds none; the
// saved state is not touched while a step is in flight.
func (r *Reconciler) submitStep(s *scope, rt *stepper) {
	key, uid, from, events := runKey(s.run), s.run.UID, s.rec, s.events
	if s.dirty {
		s.events = nil
	} else {
		events = nil
	}
	wake := &toolnexusv1alpha1.AgentRun{}
	wake.Name, wake.Namespace = s.run.Name, s.run.Namespace
	r.Executor.Submit(executor.Job{Key: key.String(), Share: s.run.Namespace, Bytes: rt.Client.StepBytes(from.State), Run: func(ctx context.Context) {
		ctx = r.Tracing.Step(ctx, rt.trace)
		st := from.State.Clone()
		o := &stepOutcome{uid: uid, from: from, state: st, events: events}
		var tk *tools.Toolkit
		tk, o.mcp, o.err = rt.Toolkit(ctx)
		if o.err == nil {
			o.toolsBuilt = true
			o.err = rt.Client.StepUntilSaved(ctx, st, tk, r.store.Limits().MaxRawBytes)
		}
		// What the step read stays counted until the reconcile that takes the outcome saves it.
		o.done = executor.Keep(ctx)
		r.steps.put(ctx, key, o)
	}, Done: func(ctx context.Context) {
		// Once the key is free: the reconcile it wakes finds the step over and takes its outcome.
		kube.Wake(ctx, r.steps.wake, wake)
	}})
}

// failureOf classifies the error a step ended with for Settle (nil: it finished).
func failureOf(err error) *state.Failure {
	var invalid *runspec.Error
	if errors.As(err, &invalid) {
		return &state.Failure{InvalidSpec: true, Message: clip.Marked(invalid.Error(), 2048)}
	}
	f := loop.Classify(err)
	if f != nil {
		f.Message = clip.Marked(f.Message, 2048)
	}
	return f
}

// runKey names a run in the executor and in steps.
func runKey(run *toolnexusv1alpha1.AgentRun) types.NamespacedName {
	return types.NamespacedName{Namespace: run.Namespace, Name: run.Name}
}

// readSecret reads one key of a Secret in namespace, uncached: the manager does not keep Secret
// values in memory, and a rotated Secret is picked up by the next read.
func (r *Reconciler) readSecret(ctx context.Context, namespace string, ref toolnexusv1alpha1.SecretKeyReference, what string) (string, error) {
	return kube.ReadSecretKey(ctx, r.APIReader, r.RequireSecretLabel, namespace, ref, what)
}

// stepper is what a step needs: the run's spec built with its Secrets (the reconcile reads them;
// connecting the MCP servers is network I/O, done by the step itself) and the run's trace, which
// the step's spans join.
type stepper struct {
	*runspec.Built
	trace telemetry.Run
}

// prepare builds the run's spec with its Secrets, without network I/O but the API server's, for a
// step of turn (the turn whose calls it runs: a sub-agent call's child is named after it). Secret
// values for headers are resolved at call time; the API key is read now because every model
// request needs it.
func (r *Reconciler) prepare(ctx context.Context, run *toolnexusv1alpha1.AgentRun, spec *toolnexusv1alpha1.AgentRunSpec, turn int, observe func(loop.Event)) (*stepper, error) {
	apiKey := ""
	if ref := spec.Model.APIKeySecretRef; ref != nil {
		var err error
		if apiKey, err = r.readSecret(ctx, run.Namespace, *ref, "spec.model.apiKeySecretRef"); err != nil {
			return nil, err
		}
	}
	// Header Secrets are checked up front too, so a missing one parks the run before it starts
	// rather than failing a tool call later.
	for i, t := range spec.Tools {
		var err error
		switch {
		case t.HTTP != nil:
			err = r.checkHeaders(ctx, run.Namespace, t.HTTP.Headers, fmt.Sprintf("spec.tools[%d].http.headers", i))
			if err == nil {
				err = r.checkClientSecret(ctx, run.Namespace, t.HTTP.Auth, fmt.Sprintf("spec.tools[%d].http.auth.oauth.clientSecretRef", i))
			}
		case t.A2A != nil:
			err = r.checkHeaders(ctx, run.Namespace, t.A2A.Headers, fmt.Sprintf("spec.tools[%d].a2a.headers", i))
		}
		if err != nil {
			return nil, err
		}
	}
	for i, s := range spec.MCPServers {
		if err := r.checkHeaders(ctx, run.Namespace, s.Headers, fmt.Sprintf("spec.mcpServers[%d].headers", i)); err != nil {
			return nil, err
		}
		if err := r.checkClientSecret(ctx, run.Namespace, s.Auth, fmt.Sprintf("spec.mcpServers[%d].auth.oauth.clientSecretRef", i)); err != nil {
			return nil, err
		}
	}
	trace := r.runTrace(ctx, run)
	built, err := runspec.Build(&spec.AgentSpec, runspec.Env{
		APIKey: apiKey,
		Headers: func(hs []toolnexusv1alpha1.HTTPHeader, what string) []tools.Header {
			return r.headers(run.Namespace, hs, what)
		},
		HTTPClient: r.HTTPClient, IdempotencyPrefix: string(run.UID), OnEvent: observe, Clock: r.Clock.Now,
		Tracer: r.Tracing.Loop(trace), MaxToolCallsPerTurn: r.MaxToolCallsPerTurn,
		Policies: r.policyGates(run), OAuth: r.signIn(run), SubAgents: r.subAgents(run, turn),
	})
	if err != nil {
		return nil, err
	}
	return &stepper{Built: built, trace: trace}, nil
}

// signIn gives each tool of run with auth.oauth its login, kept for the spec's token scope.
func (r *Reconciler) signIn(run *toolnexusv1alpha1.AgentRun) func(toolnexusv1alpha1.OAuthSpec, string, string) tools.OAuth {
	if r.Logins == nil {
		return func(_ toolnexusv1alpha1.OAuthSpec, _, what string) tools.OAuth {
			return oauth.Unusable(what + ".auth.oauth: this manager keeps no logins: it does not know its own namespace, where they live (set POD_NAMESPACE)")
		}
	}
	ref := oauth.Run{Namespace: run.Namespace, Name: run.Name, UID: string(run.UID)}
	return func(spec toolnexusv1alpha1.OAuthSpec, base, what string) tools.OAuth {
		scope := spec.TokenScope
		if scope == "" {
			scope = toolnexusv1alpha1.TokenScopeRequester
		}
		var subject string
		switch scope {
		case toolnexusv1alpha1.TokenScopeRequester:
			if subject = run.Spec.RequestedBy; subject == "" {
				return oauth.Unusable(what + ".auth.oauth: tokenScope Requester keeps a login per requester, and this run does not say who created it " +
					"(spec.requestedBy is empty: config/policies is not installed, or the run predates it); use tokenScope Run")
			}
		case toolnexusv1alpha1.TokenScopeAgent:
			if run.Spec.AgentRef == nil {
				return oauth.Unusable(what + ".auth.oauth: tokenScope Agent keeps a login per Agent, and this run names none (spec.agentRef)")
			}
			subject = run.Spec.AgentRef.Name
		case toolnexusv1alpha1.TokenScopeRun:
			subject = string(run.UID)
		}
		client := oauth.Client{ID: spec.ClientID, Scopes: spec.Scopes}
		if ref := spec.ClientSecretRef; ref != nil {
			client.Secret = &oauth.SecretRef{Namespace: run.Namespace, Name: ref.Name, Key: ref.Key}
		}
		key := oauth.Key{Namespace: run.Namespace, Scope: string(scope), Subject: subject, ClientID: spec.ClientID, Base: base}
		return r.Logins.For(key, client, ref, what)
	}
}

// policyGates asks the platform's policies about each call of run, at call time, so a policy
// created while the run waits gates its next matching call.
func (r *Reconciler) policyGates(run *toolnexusv1alpha1.AgentRun) func(context.Context, runspec.PolicyCall) ([]runspec.PolicyGate, error) {
	if r.Policies == nil {
		return nil
	}
	namespace, labels, requestedBy := run.Namespace, maps.Clone(run.Labels), run.Spec.RequestedBy
	return func(ctx context.Context, c runspec.PolicyCall) ([]runspec.PolicyGate, error) {
		gates, err := r.Policies.Check(ctx, policy.Call{Namespace: namespace, Labels: labels, Tool: c.Tool, URL: c.URL,
			RemoteTool: c.Remote, Args: c.Args, ID: c.ID, RawArguments: c.RawArguments})
		if err != nil {
			return nil, err
		}
		out := make([]runspec.PolicyGate, len(gates))
		for i, g := range gates {
			if g.Refused == "" && g.Terms.ExcludeRequester && requestedBy == "" {
				// Nobody could be excluded: the gate is refused rather than let the requester approve.
				g.Refused = fmt.Sprintf("ApprovalPolicy %s excludes the requester from approving, and this run does not say who created it "+
					"(spec.requestedBy is empty: the run predates the requester stamp, or config/policies is not installed)", g.Policy)
			}
			out[i] = runspec.PolicyGate{Key: "policy/" + g.Policy, Refused: g.Refused, Request: g.Request,
				Timeout: g.Terms.Timeout, OnTimeout: string(g.Terms.OnTimeout)}
			if g.Refused != "" {
				continue
			}
			if out[i].Terms, err = json.Marshal(g.Terms); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
}

func (r *Reconciler) checkHeaders(ctx context.Context, namespace string, hs []toolnexusv1alpha1.HTTPHeader, what string) error {
	for _, h := range hs {
		if h.ValueFrom == nil {
			continue
		}
		if _, err := r.readSecret(ctx, namespace, h.ValueFrom.SecretKeyRef, what+" "+h.Name); err != nil {
			return err
		}
	}
	return nil
}

// checkClientSecret checks that an OAuth client's secret can be read, as a header's is checked.
func (r *Reconciler) checkClientSecret(ctx context.Context, namespace string, auth *toolnexusv1alpha1.ToolAuth, what string) error {
	if auth == nil || auth.OAuth == nil || auth.OAuth.ClientSecretRef == nil {
		return nil
	}
	_, err := r.readSecret(ctx, namespace, *auth.OAuth.ClientSecretRef, what)
	return err
}

// headers turns header specs into tool headers whose Secret values are read on every request.
func (r *Reconciler) headers(namespace string, hs []toolnexusv1alpha1.HTTPHeader, what string) []tools.Header {
	out := make([]tools.Header, 0, len(hs))
	for _, h := range hs {
		th := tools.Header{Name: h.Name}
		switch {
		case h.Value != nil:
			th.Value = *h.Value
		case h.ValueFrom != nil:
			ref, label := h.ValueFrom.SecretKeyRef, what+" "+h.Name
			th.Resolve = func(ctx context.Context) (string, error) {
				return r.readSecret(ctx, namespace, ref, label)
			}
		}
		out = append(out, th)
	}
	return out
}

// steps is what this process keeps of each run between its reconciles: one runMemo per run, for
// the run with the UID it names (a run deleted and created again under the same name inherits
// nothing).
type steps struct {
	mu   sync.Mutex
	runs map[types.NamespacedName]*runMemo
	// wake tells the controller a step finished.
	wake chan event.GenericEvent
}

// runMemo is what this process keeps of one run.
type runMemo struct {
	uid types.UID
	// outcome is what its finished step left, until a reconcile takes it.
	outcome *stepOutcome
	// retryAt is when the run, whose model failed transiently, may try again.
	retryAt time.Time
	// reportedAt is when this process last patched the run's status.
	reportedAt time.Time
	// owedStart and owedEnd are the start and end this process saved and no status patch has
	// shown yet.
	owedStart, owedEnd bool
}

func newSteps() *steps {
	return &steps{runs: map[types.NamespacedName]*runMemo{}, wake: make(chan event.GenericEvent, 1024)}
}

// of is the memo of the run with uid, made afresh when the kept one was another run's; the caller
// holds s.mu.
func (s *steps) of(key types.NamespacedName, uid types.UID) *runMemo {
	m := s.runs[key]
	if m == nil || m.uid != uid {
		if m != nil {
			m.outcome.release()
		}
		m = &runMemo{uid: uid}
		s.runs[key] = m
	}
	return m
}

// put keeps the outcome of a step whose job context is ctx, unless that context was cancelled (the
// run was cancelled or deleted, or this process lost its leadership): then nothing may apply it,
// and what it holds is given back now. Checked under the lock, as Cancel cancels the context before
// the reconcile that cancels drops what is kept, so an outcome is never kept after that drop.
func (s *steps) put(ctx context.Context, key types.NamespacedName, o *stepOutcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ctx.Err() != nil {
		o.release()
		return
	}
	m := s.of(key, o.uid)
	m.outcome.release()
	m.outcome = o
}

// take removes and returns the outcome left for the run with uid, if any. The caller releases it
// once it has applied and saved it.
func (s *steps) take(key types.NamespacedName, uid types.UID) *stepOutcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.of(key, uid)
	o := m.outcome
	m.outcome = nil
	return o
}

func (s *steps) backoff(key types.NamespacedName, uid types.UID, at time.Time) {
	s.mu.Lock()
	s.of(key, uid).retryAt = at
	s.mu.Unlock()
}

// notBefore is when the run may take its next step; zero when it may now.
func (s *steps) notBefore(key types.NamespacedName, uid types.UID, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.of(key, uid)
	if !now.Before(m.retryAt) {
		m.retryAt = time.Time{}
	}
	return m.retryAt
}

// reportedAt remembers that the run's status was patched at t.
func (s *steps) reportedAt(key types.NamespacedName, uid types.UID, t time.Time) {
	s.mu.Lock()
	s.of(key, uid).reportedAt = t
	s.mu.Unlock()
}

// reportDue reports whether the run's status was last patched by this process longer than
// statusInterval before now (or never).
func (s *steps) reportDue(key types.NamespacedName, uid types.UID, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := s.of(key, uid).reportedAt
	return at.IsZero() || now.Sub(at) >= statusInterval
}

// owe notes that this process saved the run's start or end: they are reported (events, the run
// span) once a status patch shows them, in this reconcile or, when its patch failed, a later one.
func (s *steps) owe(key types.NamespacedName, uid types.UID, start, ended bool) {
	if !start && !ended {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.of(key, uid)
	m.owedStart, m.owedEnd = m.owedStart || start, m.owedEnd || ended
}

// shown returns what was owed for the run and clears it: a status patch has just shown it.
func (s *steps) shown(key types.NamespacedName, uid types.UID) (start, ended bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.of(key, uid)
	start, ended = m.owedStart, m.owedEnd
	m.owedStart, m.owedEnd = false, false
	return start, ended
}

// drop discards the outcome and the backoff of a run's step: the run was cancelled, and what its
// aborted step left must not be applied. What it still owes is kept.
func (s *steps) drop(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.runs[key]; m != nil {
		m.outcome.release()
		m.outcome, m.retryAt = nil, time.Time{}
	}
}

// forget drops whatever is kept for a run that is gone or has ended.
func (s *steps) forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.runs[key]; m != nil {
		m.outcome.release()
		delete(s.runs, key)
	}
}

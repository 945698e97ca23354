package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// RequestIDPrefix starts the id of a policy gate's approval Request: "policy:<policy>:<call id>",
// or "policy:<SHA-256 of both, hex>" when that would not fit a request id.
const RequestIDPrefix = "policy:"

// Gate is one policy that applies to a tool call: the call runs only once every Gate over it is
// approved. Exactly one of Refused and Request is set.
type Gate struct {
	// Policy and Generation name the policy as applied.
	Policy     string
	Generation int64
	// Refused is set when the policy cannot be applied (a selector, glob, when or prompt it
	// cannot use, or a prompt that cannot be rendered for this call): the call must be refused
	// with this message, which names the policy.
	Refused string
	// Request is the approval the call waits on: kind approval, id "policy:<name>:<call id>",
	// data {tool, arguments, policy} and, when the policy's when could not be evaluated,
	// whenError (such a call is gated, as by a run's own gate).
	Request *tools.Request
	// Terms say who decides the request, and how.
	Terms Terms
}

// Registry holds every ApprovalPolicy compiled, and the labels of every namespace, as the
// manager's informers last saw them: Check, on the path of every tool call, neither lists nor
// decodes nor copies an object. SetupWithManager feeds it.
type Registry struct {
	// synced are closed once the handlers have had the informers' initial lists; until then
	// Check waits, so no call runs ungated by a policy not read yet.
	synced []<-chan struct{}
	// now times a prompt's render (its bound is in real time, like a run gate's).
	now func() time.Time

	mu sync.RWMutex
	// policies are sorted by name. The slice is replaced on every change, never written in
	// place, so Check uses what it read without holding the lock.
	policies   []*compiled
	namespaces map[string]labels.Set
	// namespaceAdded is closed, and replaced, when a namespace is first seen.
	namespaceAdded chan struct{}
}

// NewRegistry returns a registry that nothing feeds yet: Check waits until SetupWithManager's
// handlers have synced.
func NewRegistry() *Registry {
	return &Registry{synced: []<-chan struct{}{make(chan struct{})}, now: time.Now,
		namespaces: map[string]labels.Set{}, namespaceAdded: make(chan struct{})}
}

// maxWait bounds how long a call waits for the policies and its namespace to be read.
const maxWait = 30 * time.Second

// noLabels and noArgs stand in for a run without labels and a call without arguments; never
// written.
var (
	noLabels = map[string]string{}
	noArgs   = map[string]any{}
)

// Check returns the gates of the policies that apply to a call of tool by a run in namespace
// with runLabels, sorted by policy name; none when no policy applies. A policy applies when its
// namespaceSelector matches the namespace's labels, its runSelector the run's labels, one of its
// tool globs the tool, and its when holds (or cannot be evaluated). callID and rawArguments are
// the call's id and arguments as the model sent them.
//
// Check waits, within ctx and at most maxWait, until the registry has read every policy, and
// until it has seen the namespace (one created a moment ago); the error then wraps ctx's (a
// deadline is a transient failure of the step), and the call must not run.
func (r *Registry) Check(ctx context.Context, c Call) ([]Gate, error) {
	if !r.ready(c.Namespace) {
		// Bounded, so a registry that cannot read (its RBAC missing) holds no call for good: the
		// step fails as a transient failure naming what was not read, and the run retries.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, maxWait)
		defer cancel()
	}
	if err := r.waitSynced(ctx); err != nil {
		return nil, err
	}
	policies, namespaceLabels, err := r.read(ctx, c.Namespace)
	if err != nil {
		return nil, err
	}
	if c.Labels == nil {
		c.Labels = noLabels
	}
	if c.Args == nil {
		c.Args = noArgs
	}
	var gates []Gate
	for _, p := range policies {
		if !p.namespaces.Matches(namespaceLabels) || !p.matchesTool(c.Tool) || !p.runs.Matches(labels.Set(c.Labels)) {
			continue
		}
		if g, applies := p.apply(&c, r.now); applies {
			gates = append(gates, g)
		}
	}
	return gates, nil
}

// Call is one tool call of a run as Check sees it.
type Call struct {
	// Namespace and Labels are the run's.
	Namespace string
	Labels    map[string]string
	// Tool is the call's final tool name, which the run's author chose; URL (an HTTP tool's URL,
	// an MCP tool's server URL) and RemoteTool (an MCP tool's own name on its server) are what it
	// reaches, whatever it is called.
	Tool, URL, RemoteTool string
	Args                  map[string]any
	// ID and RawArguments are the call's id and its arguments as JSON.
	ID, RawArguments string

	// vars are its CEL variables, made for the first when.
	vars map[string]any
}

func (c *Call) celVars() map[string]any {
	if c.vars == nil {
		c.vars = map[string]any{"tool": c.Tool, "args": c.Args, "namespace": c.Namespace, "labels": c.Labels,
			"url": c.URL, "remoteTool": c.RemoteTool}
	}
	return c.vars
}

func (p *compiled) matchesTool(tool string) bool {
	return p.gate == nil || p.gate.Matches(tool)
}

// apply is the policy's gate over a call its selectors and globs match, and whether its when
// lets it apply. A policy that cannot be used applies to every such call, refused.
func (p *compiled) apply(c *Call, now func() time.Time) (Gate, bool) {
	g := Gate{Policy: p.name, Generation: p.generation, Terms: p.terms.clone()}
	if p.problem != "" {
		g.Refused = p.refusal(p.problem)
		return g, true
	}
	holds, whenErr := p.gate.Holds(c.celVars())
	if !holds {
		return Gate{}, false
	}
	req, err := p.gate.Approval(requestID(p.name, c.ID), "Approve the call to "+c.Tool+"? (policy "+p.name+")",
		c.Tool, c.Args, c.RawArguments, now)
	if err != nil {
		g.Refused = p.refusal(clip.Marked("spec.prompt: "+err.Error(), maxProblemBytes))
		return g, true
	}
	req.Data["policy"] = p.name
	if whenErr != nil {
		req.Data["whenError"] = whenErr.Error()
	}
	g.Request = req
	return g, true
}

// requestID is the id of policy's request for call callID, within what a request id holds.
// Policy names have no colon, so a hashed id never equals a plain one.
func requestID(policy, callID string) string {
	if id := RequestIDPrefix + policy + ":" + callID; len(id) <= wire.MaxRequestIDLen {
		return id
	}
	sum := sha256.Sum256([]byte(policy + ":" + callID))
	return RequestIDPrefix + hex.EncodeToString(sum[:])
}

// ready reports whether Check can answer for namespace without waiting: every handler has synced
// and the namespace has been seen (or no policy could depend on it).
func (r *Registry) ready(namespace string) bool {
	for _, synced := range r.synced {
		select {
		case <-synced:
		default:
			return false
		}
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, seen := r.namespaces[namespace]
	return seen || len(r.policies) == 0
}

// waitSynced waits until every handler has had its informer's initial list.
func (r *Registry) waitSynced(ctx context.Context) error {
	for _, synced := range r.synced {
		select {
		case <-synced:
		default:
			select {
			case <-synced:
			case <-ctx.Done():
				return fmt.Errorf("the ApprovalPolicies and namespaces have not been read yet: %w", context.Cause(ctx))
			}
		}
	}
	return nil
}

// read returns the policies and the labels of namespace, waiting within ctx until the namespace
// is seen when a policy could depend on them.
func (r *Registry) read(ctx context.Context, namespace string) ([]*compiled, labels.Set, error) {
	for {
		r.mu.RLock()
		policies, added := r.policies, r.namespaceAdded
		namespaceLabels, seen := r.namespaces[namespace]
		r.mu.RUnlock()
		if seen || len(policies) == 0 {
			return policies, namespaceLabels, nil
		}
		select {
		case <-added:
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("namespace %s has not been seen yet: %w", namespace, context.Cause(ctx))
		}
	}
}

// setPolicy compiles p into the registry, replacing the policy of that name; a policy seen
// again at the generation already compiled (its status changed) is left as it is. The
// informer's handler is its one caller (a handler's events come one at a time).
func (r *Registry) setPolicy(p *toolnexusv1alpha1.ApprovalPolicy) {
	r.mu.RLock()
	i, found := r.find(p.Name)
	same := found && r.policies[i].uid == p.UID && r.policies[i].generation == p.Generation
	r.mu.RUnlock()
	if same {
		return
	}
	c := compile(p) // outside the lock: CEL compiles take a while
	r.mu.Lock()
	defer r.mu.Unlock()
	policies := slices.Clone(r.policies)
	if i, found := r.find(p.Name); found {
		policies[i] = c
	} else {
		policies = slices.Insert(policies, i, c)
	}
	r.policies = policies
}

// deletePolicy drops the policy named name.
func (r *Registry) deletePolicy(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i, found := r.find(name); found {
		r.policies = slices.Delete(slices.Clone(r.policies), i, i+1)
	}
}

// find is where the policy named name is, or would be, in r.policies; r.mu is held.
func (r *Registry) find(name string) (int, bool) {
	return slices.BinarySearchFunc(r.policies, name, func(c *compiled, name string) int { return strings.Compare(c.name, name) })
}

// setNamespace records the labels of the namespace name.
func (r *Registry) setNamespace(name string, namespaceLabels map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, seen := r.namespaces[name]
	r.namespaces[name] = maps.Clone(namespaceLabels)
	if !seen {
		close(r.namespaceAdded)
		r.namespaceAdded = make(chan struct{})
	}
}

// deleteNamespace forgets the namespace name.
func (r *Registry) deleteNamespace(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.namespaces, name)
}

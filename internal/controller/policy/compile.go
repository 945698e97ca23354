// Package policy is the ApprovalPolicy room (SPEC.md section 11): a reconciler that says in each
// policy's Ready condition whether it can be applied, and the Registry the call path asks, for
// every tool call of every run, which policies gate it.
package policy

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/tools"
)

// Terms are who decides a policy's gate and how, as the policy said at the generation applied:
// what the PendingRequest of the gate copies. The coordinator keeps them as JSON in the run's
// state (loop/state Gate.Terms) and rebuilds the request from them after a restart.
type Terms struct {
	Policy           toolnexusv1alpha1.PolicyReference  `json:"policy"`
	Approvers        toolnexusv1alpha1.Approvers        `json:"approvers"`
	Required         int32                              `json:"required"`
	ExcludeRequester bool                               `json:"excludeRequester,omitempty"`
	Escalation       []toolnexusv1alpha1.EscalationStep `json:"escalation,omitempty"`
	// Timeout is how long the request waits before it expires (nanoseconds in JSON); 0: the
	// run's own timeout, or never.
	Timeout   time.Duration               `json:"timeout,omitempty"`
	OnTimeout toolnexusv1alpha1.OnTimeout `json:"onTimeout,omitempty"`
}

// clone is a copy of t that shares nothing with the registry's.
func (t Terms) clone() Terms {
	t.Approvers = *t.Approvers.DeepCopy()
	t.Escalation = cloneSteps(t.Escalation)
	return t
}

func cloneSteps(steps []toolnexusv1alpha1.EscalationStep) []toolnexusv1alpha1.EscalationStep {
	if steps == nil {
		return nil
	}
	out := make([]toolnexusv1alpha1.EscalationStep, len(steps))
	for i := range steps {
		steps[i].DeepCopyInto(&out[i])
	}
	return out
}

// gateEnv compiles every policy's when: CEL over tool, args, namespace and the run's labels.
var gateEnv = func() *tools.GateEnv {
	env, err := tools.NewGateEnv(tools.GateVariables{Strings: []string{"namespace", "url", "remoteTool"}, StringMaps: []string{"labels"}})
	if err != nil {
		panic(fmt.Sprintf("policy: the CEL environment of when: %v", err))
	}
	return env
}()

// maxProblemBytes bounds what a policy's Ready message and a refused call say about it.
const maxProblemBytes = 1024

// compiled is one ApprovalPolicy as the call path applies it. It is never changed once made.
type compiled struct {
	name       string
	uid        types.UID
	generation int64
	namespaces labels.Selector
	runs       labels.Selector
	// gate is the policy's tools, when and prompt. When the policy cannot be used it holds the
	// tool globs alone, and is nil when those are broken too: then the policy matches every tool.
	gate *tools.Gate
	// problem says what cannot be used (each field at fault and why); empty when the policy can.
	problem string
	terms   Terms
}

// compile compiles p. It always returns a policy that can be applied: one that cannot be used
// fails closed. A selector that does not parse selects everything; a when or prompt that does
// not compile leaves the tool globs to decide, and broken globs match every tool; each call it
// matches is then refused, naming the policy.
func compile(p *toolnexusv1alpha1.ApprovalPolicy) *compiled {
	s := &p.Spec
	c := &compiled{name: p.Name, uid: p.UID, generation: p.Generation, terms: terms(p)}
	var problems []string
	var err error
	if c.namespaces, err = metav1.LabelSelectorAsSelector(s.NamespaceSelector.AsMeta()); err != nil {
		problems = append(problems, "spec.namespaceSelector: "+err.Error())
		c.namespaces = labels.Everything()
	}
	if c.runs, err = metav1.LabelSelectorAsSelector(s.RunSelector.AsMeta()); err != nil {
		problems = append(problems, "spec.runSelector: "+err.Error())
		c.runs = labels.Everything()
	}
	spec := tools.GateSpec{Tools: s.Tools, When: s.When, Prompt: s.Prompt}
	if c.gate, err = gateEnv.Compile(p.Name, spec); err != nil {
		gateErr := err
		// Compiled one at a time, each field says for itself whether it is at fault.
		if c.gate, err = gateEnv.Compile(p.Name, tools.GateSpec{Tools: s.Tools}); err != nil {
			problems = append(problems, "spec.tools: "+err.Error())
		}
		if _, err := gateEnv.Compile(p.Name, tools.GateSpec{When: s.When}); err != nil {
			problems = append(problems, "spec.when: "+err.Error())
		}
		if _, err := gateEnv.Compile(p.Name, tools.GateSpec{Prompt: s.Prompt}); err != nil {
			problems = append(problems, "spec.prompt: "+err.Error())
		}
		if len(problems) == 0 { // the fields only fail together: still refused
			problems = append(problems, "spec: "+gateErr.Error())
		}
	}
	c.problem = clip.Marked(strings.Join(problems, "; "), maxProblemBytes)
	return c
}

// terms are the policy's decision terms at its generation, defaults applied.
func terms(p *toolnexusv1alpha1.ApprovalPolicy) Terms {
	s := &p.Spec
	t := Terms{
		Policy:           toolnexusv1alpha1.PolicyReference{Name: p.Name, Generation: p.Generation},
		Approvers:        *s.Approvers.DeepCopy(),
		Required:         max(s.Required, 1),
		ExcludeRequester: s.ExcludeRequester,
		Escalation:       cloneSteps(s.Escalation),
		OnTimeout:        s.OnTimeout,
	}
	if s.Timeout != nil {
		t.Timeout = s.Timeout.Duration
	}
	if t.OnTimeout == "" {
		t.OnTimeout = toolnexusv1alpha1.OnTimeoutDecline
	}
	return t
}

// refusal is what a call the policy matches is told when the policy cannot be used.
func (c *compiled) refusal(problem string) string {
	return fmt.Sprintf("ApprovalPolicy %s cannot be applied, so the calls it gates are refused until it is fixed: %s", c.name, problem)
}

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ApprovalPolicySpec is an approval a platform team requires of every run in the namespaces it
// selects (SPEC.md section 11). Each policy matching a call is its own gate with its own
// PendingRequest; a run's own approvals and approvers add gates, never remove or widen this one.
// +kubebuilder:validation:XValidation:rule="!has(self.escalation) || self.escalation.all(s, self.escalation.all(t, !has(s.notify) || !has(t.notify) || s == t || s.notify.all(n, !t.notify.exists(m, m.name == n.name))))",message="escalation notify sink names must be unique across the steps"
type ApprovalPolicySpec struct {
	// namespaceSelector selects the namespaces whose runs the policy gates, by namespace labels.
	// Empty or unset: every namespace.
	// +optional
	NamespaceSelector *LabelSelector `json:"namespaceSelector,omitempty"`

	// runSelector narrows the policy to runs with these AgentRun labels. Unset: every run. A run's
	// labels are its author's and may change: this narrows for cooperative authors only; enforce
	// with namespaceSelector.
	// +optional
	RunSelector *LabelSelector `json:"runSelector,omitempty"`

	// tools are globs over final tool names (for MCP tools, <server>_<tool>).
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=128
	Tools []string `json:"tools"`

	// when is a CEL expression over `tool` (string), `args` (map), `namespace` (string), `labels`
	// (the run's labels), `url` (what the call reaches: an HTTP tool's URL as its spec writes it,
	// an MCP tool's server URL) and `remoteTool` (an MCP tool's own name on its server) that must
	// be true for the policy to gate the call, for example `args.amount > 1000`. Tool names are
	// the run author's choice; url and remoteTool are not. Empty means always. One that cannot be
	// evaluated for a call gates it.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	When string `json:"when,omitempty"`

	// prompt shown to the approver, a Go template over {{.tool}} and {{.arguments}}.
	// Default: "Approve the call to <tool>? (policy <name>)".
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Prompt string `json:"prompt,omitempty"`

	// approvers who may approve a call this policy gates; at least one user or group.
	// +required
	// +kubebuilder:validation:XValidation:rule="(has(self.users) && size(self.users) > 0) || (has(self.groups) && size(self.groups) > 0)",message="approvers must name at least one user or group"
	Approvers Approvers `json:"approvers"`

	// required is how many distinct approvers must approve (default 1).
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	Required int32 `json:"required,omitempty"`

	// excludeRequester refuses the approval of the user who created the run (spec.requestedBy).
	// +optional
	ExcludeRequester bool `json:"excludeRequester,omitempty"`

	// timeout after which an undecided request of this policy expires (at most 720h). Unset: the
	// run's spec.suspension.timeout, or never. A run's shorter timeout still applies.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('720h')",message="timeout must be at most 720h (30 days)"
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// onTimeout is Decline (the default: the model is told the call was not approved) or Fail
	// (the run fails RequestExpired).
	// +optional
	// +kubebuilder:default=Decline
	OnTimeout OnTimeout `json:"onTimeout,omitempty"`

	// escalation steps, applied in order, each once: when a step's after has passed since the
	// request opened with no decision, its approvers may approve too and its sinks are notified.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4
	Escalation []EscalationStep `json:"escalation,omitempty"`
}

// LabelSelector is metav1.LabelSelector with bounds: matchLabels and matchExpressions are ANDed;
// an empty selector selects everything.
type LabelSelector struct {
	// matchLabels are key=value pairs that must all be present.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) <= 317)",message="label keys are at most 317 characters"
	MatchLabels map[string]LabelValue `json:"matchLabels,omitempty"`

	// matchExpressions are label requirements that must all hold.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	MatchExpressions []LabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

// LabelValue is the value of a label.
// +kubebuilder:validation:MaxLength=63
type LabelValue string

// LabelSelectorRequirement is metav1.LabelSelectorRequirement with bounds.
type LabelSelectorRequirement struct {
	// key is the label key the requirement applies to.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	Key string `json:"key"`

	// operator is In, NotIn, Exists or DoesNotExist.
	// +required
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist
	Operator metav1.LabelSelectorOperator `json:"operator"`

	// values for In and NotIn; empty for Exists and DoesNotExist.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=63
	Values []string `json:"values,omitempty"`
}

// EscalationStep widens who may approve an undecided request once after has passed.
type EscalationStep struct {
	// after is how long after the request opened the step applies.
	// +required
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	After metav1.Duration `json:"after"`

	// approvers added to who may approve.
	// +optional
	Approvers *Approvers `json:"approvers,omitempty"`

	// notify are the sinks told, once, that the request escalated (their `on` is not used: they
	// are told only this). A urlFrom or header Secret of a policy's sink is read from the
	// manager's own namespace, never from the run's.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4
	Notify []NotifySink `json:"notify,omitempty"`
}

// ApprovalPolicyStatus says whether the policy can be applied.
type ApprovalPolicyStatus struct {
	// conditions of the policy: Ready is False, with a reason and message, when the policy's selectors, tools,
	// when or prompt cannot be used. A policy that is not Ready refuses every call it would
	// gate (it fails closed).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the generation the conditions describe.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// ApprovalPolicy requires an approval of the tool calls it matches, in every run of the
// namespaces it selects. It is cluster-scoped: cluster admins write it; run authors can only read it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=apol,categories=toolnexus
// +kubebuilder:printcolumn:name="Tools",type=string,JSONPath=`.spec.tools`
// +kubebuilder:printcolumn:name="Required",type=integer,JSONPath=`.spec.required`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ApprovalPolicy struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitzero"`

	// spec says which calls the policy gates and who approves them.
	// +required
	Spec ApprovalPolicySpec `json:"spec"`

	// status says whether the policy can be applied.
	// +optional
	Status ApprovalPolicyStatus `json:"status,omitzero"`
}

// ApprovalPolicyList is a list of ApprovalPolicies.
// +kubebuilder:object:root=true
type ApprovalPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitzero"`
	Items           []ApprovalPolicy `json:"items"`
}

// PolicyReference names the ApprovalPolicy, at the generation that was applied, whose gate a
// PendingRequest is.
type PolicyReference struct {
	// name of the ApprovalPolicy.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// generation of the policy that was applied.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=9007199254740991
	Generation int64 `json:"generation"`
}

// ApprovalEntry is one approver's decision on a request that needs several (spec.required > 1).
// The API server stamps user and at; each entry is written by its own user and never changes.
type ApprovalEntry struct {
	// user who decided: your own user name (an empty one is filled in by the API server); an
	// entry for anyone else is refused.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	User string `json:"user"`

	// requestUID binds the entry to the request its approver saw: when given, it must equal the
	// PendingRequest's metadata.uid (the API server refuses it otherwise), as an answer's does.
	// `kubectl toolnexus approve` and the inbox always send it.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	RequestUID string `json:"requestUID,omitempty"`

	// ok is true to approve, false to decline.
	// +required
	OK bool `json:"ok"`

	// reason explains a decline.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`

	// at is when the entry was written, stamped by the API server.
	// +optional
	At *metav1.Time `json:"at,omitempty"`
}

// EscalationRecord is the manager's record that an escalation step was applied: its sinks were
// handed to the notifier. Only the manager writes it.
type EscalationRecord struct {
	// step is the index of the step in spec.escalation.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3
	Step int32 `json:"step"`

	// time the step was applied.
	// +required
	Time metav1.Time `json:"time"`
}

// AsMeta returns the selector as a metav1.LabelSelector (nil selects everything, as an empty one
// does).
func (s *LabelSelector) AsMeta() *metav1.LabelSelector {
	if s == nil {
		return &metav1.LabelSelector{}
	}
	out := &metav1.LabelSelector{}
	if len(s.MatchLabels) > 0 {
		out.MatchLabels = make(map[string]string, len(s.MatchLabels))
		for k, v := range s.MatchLabels {
			out.MatchLabels[k] = string(v)
		}
	}
	for _, r := range s.MatchExpressions {
		out.MatchExpressions = append(out.MatchExpressions, metav1.LabelSelectorRequirement{
			Key: r.Key, Operator: r.Operator, Values: append([]string(nil), r.Values...),
		})
	}
	return out
}

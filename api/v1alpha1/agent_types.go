package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Agent condition types and reasons.
const (
	// ConditionReady is True when the agent can run, and False with a reason when it cannot.
	ConditionReady = "Ready"

	// ReasonValid: the agent's spec compiles: its tools, approval gates and model options.
	ReasonValid = "Valid"
	// ReasonInvalidTool: a tool of the agent cannot be built (for example two tools of one name).
	ReasonInvalidTool = "InvalidTool"
	// ReasonInvalidApproval: an approval gate does not compile (a `when` that is not valid CEL, a
	// prompt that is not a valid template).
	ReasonInvalidApproval = "InvalidApproval"
	// ReasonInvalidModel: the model options are refused (for example an unknown style).
	ReasonInvalidModel = "InvalidModel"
	// ReasonAgentNotFound: the run's spec.agentRef names an Agent that does not exist; the run
	// starts when it appears.
	ReasonAgentNotFound = "AgentNotFound"
)

// AgentStatus says whether the agent can run.
type AgentStatus struct {
	// conditions are Ready (False with a reason when the agent cannot run) and, for kstatus,
	// Stalled with the same reason when Ready is False.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the generation this status describes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// Agent is the reusable part of a run: model, system prompt, tools and policies. Runs name it in
// spec.agentRef and give the prompt; each run snapshots the agent when it starts.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=toolnexus
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="has(self.spec.model)",message="spec.model is required on an Agent"
type Agent struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitzero"`

	// spec is the agent: model, system prompt, tools and policies. It may be edited; runs that
	// have started keep the snapshot they took.
	// +required
	Spec AgentSpec `json:"spec"`

	// status says whether the agent can run; only the manager writes it.
	// +optional
	Status AgentStatus `json:"status,omitzero"`
}

// AgentList is a list of Agents.
// +kubebuilder:object:root=true
type AgentList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitzero"`
	Items           []Agent `json:"items"`
}

// StatusConditions gives condition helpers the agent's conditions to set.
func (a *Agent) StatusConditions() *[]metav1.Condition { return &a.Status.Conditions }

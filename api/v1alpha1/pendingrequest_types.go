package v1alpha1

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RunReference names the AgentRun a PendingRequest belongs to, in the same namespace.
type RunReference struct {
	// name of the AgentRun.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// ToolCall is the suspended call as the model made it.
type ToolCall struct {
	// id the model gave the call.
	// +required
	// +kubebuilder:validation:MaxLength=256
	ID string `json:"id"`
	// name of the tool.
	// +required
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`
	// arguments as the model sent them (a JSON object, as a string; truncated when very long).
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	Arguments string `json:"arguments,omitempty"`
}

// Request is the toolnexus Request a tool suspended with; its keys are byte-identical.
type Request struct {
	// id of the request; an answer's id, when given, must echo it.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	ID string `json:"id"`

	// kind is authorization, approval, input, question, tool_call or any (an open vocabulary).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	Kind string `json:"kind"`

	// prompt for the person.
	// +optional
	// +kubebuilder:validation:MaxLength=16384
	Prompt string `json:"prompt,omitempty"`

	// url to visit, for authorization.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	URL string `json:"url,omitempty"`

	// data is kind-specific: schema (input), questions (question), auth_id (authorization),
	// tool and arguments (approval gates), calls (tool_call).
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	Data *apiextensionsv1.JSON `json:"data,omitempty"`

	// The rule's pattern is the shape the admission policy toolnexus-answer-rules reads; the
	// conversion refuses a date the calendar does not have (February 30), which it lets through.

	// expiresAt is when the request expires, an RFC 3339 date-time such as 2026-12-01T00:00:00Z:
	// the run's spec.suspension.timeout, or the tool's own when that is earlier. The API server
	// refuses an answer stamped after it, except the manager's own expiry.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]([.][0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$') && timestamp(self) >= timestamp('1970-01-01T00:00:00Z')",message="spec.request.expiresAt must be an RFC 3339 date-time from 1970 on, with seconds and a zone, e.g. 2026-12-01T00:00:00Z or 2026-12-01T01:00:00+01:00"
	ExpiresAt string `json:"expiresAt,omitempty"`
}

// PendingRequestSpec is written once by the controller and never changes.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: it is written once by the controller; answer through status.answer"
type PendingRequestSpec struct {
	// runRef is the AgentRun whose call is suspended.
	// +required
	RunRef RunReference `json:"runRef"`

	// toolCall is the suspended call.
	// +required
	ToolCall ToolCall `json:"toolCall"`

	// request is what the tool asked for.
	// +required
	Request Request `json:"request"`

	// approvers restrict who may answer; they are copied from the run's spec.suspension.approvers.
	// +optional
	Approvers *Approvers `json:"approvers,omitempty"`

	// notify are the sinks told about this request; they are copied from the run's
	// spec.suspension.notify.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Notify []NotifySink `json:"notify,omitempty"`

	// requestedBy is the user who created the run, copied from its spec.requestedBy.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	RequestedBy string `json:"requestedBy,omitempty"`

	// policy names the ApprovalPolicy, and the generation applied, whose gate this request is.
	// Unset for the run's own gates and for a tool's own suspensions.
	// +optional
	Policy *PolicyReference `json:"policy,omitempty"`

	// required is how many distinct approvers must approve (from the policy; default 1). Above 1,
	// approvers add entries to status.approvals and the manager writes the answer.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	Required int32 `json:"required,omitempty"`

	// excludeRequester refuses an answer or approval entry from requestedBy (from the policy).
	// +optional
	ExcludeRequester bool `json:"excludeRequester,omitempty"`

	// escalation are the policy's escalation steps: once a step's after has passed since the
	// request was created, its approvers may approve too.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4
	Escalation []EscalationStep `json:"escalation,omitempty"`
}

// RequestPhase is a display summary of the request's conditions.
// +kubebuilder:validation:Enum=Waiting;Answered;Expired;Cancelled
type RequestPhase string

// Request phases.
const (
	RequestPhaseWaiting   RequestPhase = "Waiting"
	RequestPhaseAnswered  RequestPhase = "Answered"
	RequestPhaseExpired   RequestPhase = "Expired"
	RequestPhaseCancelled RequestPhase = "Cancelled"
)

// PendingRequestStatus holds the answer and what the run did with it.
type PendingRequestStatus struct {
	// conditions are Answered, Resolved (the run has consumed the answer) and, when spec.notify
	// or an applied escalation step names sinks, Notified.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// answer is set by the person or automation answering, e.g.
	// `kubectl patch preq NAME --subresource=status --type=merge -p '{"status":{"answer":{"ok":true}}}'`.
	// Once set it cannot be changed or removed.
	// +optional
	Answer *Answer `json:"answer,omitempty"`

	// answeredBy is the user who set the answer, stamped by the API server.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	AnsweredBy string `json:"answeredBy,omitempty"`

	// answeredAt is when the answer was set, stamped by the API server.
	// +optional
	AnsweredAt *metav1.Time `json:"answeredAt,omitempty"`

	// phase is a display summary: Waiting, Answered, Expired or Cancelled.
	// +optional
	Phase RequestPhase `json:"phase,omitempty"`

	// observedGeneration is the generation this status describes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// notifications records every event the manager finished delivering to a sink of
	// spec.notify, delivered or given up. Only the manager writes it.
	// +optional
	// +listType=map
	// +listMapKey=sink
	// +listMapKey=event
	// +kubebuilder:validation:MaxItems=48
	Notifications []NotificationRecord `json:"notifications,omitempty"`

	// approvals are the approvers' decisions on a request that needs several (spec.required > 1),
	// one entry per user, each written by its own user and never changed:
	// `kubectl toolnexus approve NAME` adds yours.
	// +optional
	// +listType=map
	// +listMapKey=user
	// +kubebuilder:validation:MaxItems=32
	Approvals []ApprovalEntry `json:"approvals,omitempty"`

	// escalations records the escalation steps the manager applied. Only the manager writes it.
	// +optional
	// +listType=map
	// +listMapKey=step
	// +kubebuilder:validation:MaxItems=4
	Escalations []EscalationRecord `json:"escalations,omitempty"`

	// audited lists the audit events (requested, approval/<user>, answered, expired, cancelled,
	// executed) the manager delivered to --audit-sink-url. Only the manager writes it; the
	// finalizer toolnexus.dev/audit stays until every event of the request is in it.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=40
	// +kubebuilder:validation:items:MaxLength=560
	Audited []string `json:"audited,omitempty"`
}

// PendingRequest is one suspended tool call, waiting for an answer in status.answer.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=preq,categories=toolnexus
// +kubebuilder:printcolumn:name="Run",type=string,JSONPath=`.spec.runRef.name`
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=`.spec.request.kind`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Prompt",type=string,JSONPath=`.spec.request.prompt`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.status) || !has(oldSelf.status.answer) || (has(self.status) && has(self.status.answer) && self.status.answer == oldSelf.status.answer)",message="status.answer cannot be changed or removed once set"
// +kubebuilder:validation:XValidation:rule="!has(self.status) || !has(self.status.answer) || !has(self.status.answer.id) || size(self.status.answer.id) == 0 || self.status.answer.id == self.spec.request.id",message="status.answer.id must equal spec.request.id (or be left out)"
type PendingRequest struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitzero"`

	// spec is the suspended call and what it asks for, written once by the manager.
	// +required
	Spec PendingRequestSpec `json:"spec"`

	// status holds the answer, set by the person or automation answering, and the manager's
	// conditions.
	// +optional
	Status PendingRequestStatus `json:"status,omitzero"`
}

// PendingRequestList is a list of PendingRequests.
// +kubebuilder:object:root=true
type PendingRequestList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitzero"`
	Items           []PendingRequest `json:"items"`
}

package v1alpha1

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// SecretKeyReference names one key of a Secret in the object's own namespace. A run never reads
// Secrets from another namespace.
type SecretKeyReference struct {
	// name of the Secret, in the run's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// key within the Secret's data.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key"`
}

// Approvers restricts who may answer a PendingRequest. A user may answer when they are listed in
// users or belong to one of groups. When both lists are empty, RBAC alone decides.
type Approvers struct {
	// users who may answer, by Kubernetes user name (as `kubectl auth whoami` prints it).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	Users []string `json:"users,omitempty"`

	// groups whose members may answer.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	Groups []string `json:"groups,omitempty"`
}

// Answer resolves a PendingRequest. Its keys are byte-identical to the toolnexus Answer.
// +kubebuilder:validation:XValidation:rule="!has(self.reason) || size(self.reason) == 0 || !self.ok",message="answer.reason is only allowed when ok is false; drop reason or set ok to false"
type Answer struct {
	// id must equal spec.request.id of the PendingRequest it answers, when given.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	ID string `json:"id,omitempty"`

	// requestUID binds the answer to the object its answerer saw: when given, it must equal the
	// PendingRequest's metadata.uid (the API server refuses it otherwise, so a request deleted and
	// re-created under the same name is never answered by a command shown for the old one). The
	// tool never sees it. Every command this project prints for a person carries it.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	RequestUID string `json:"requestUID,omitempty"`

	// ok is true to approve, to report a completed login, or to supply a result; false to decline.
	// +required
	OK bool `json:"ok"`

	// data carries the result for kinds that need one. The loop reads data.results first, then
	// data.output (a string). An input request needs data.output, or, when the request has a
	// data.schema, an object holding the schema's required fields; a question request needs a
	// non-empty object.
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	Data *apiextensionsv1.JSON `json:"data,omitempty"`

	// reason explains a refusal (ok false): declined, cancelled, expired, or free text that the
	// model is shown after "reason: ".
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`
}

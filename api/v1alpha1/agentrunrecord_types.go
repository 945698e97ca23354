package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RecordPart says which part of a run's record an AgentRunRecord holds.
// +kubebuilder:validation:Enum=Head;Segment
type RecordPart string

const (
	// RecordPartHead is the part rewritten after every step: the loop state of the current turn and
	// the messages not yet sealed.
	RecordPartHead RecordPart = "Head"
	// RecordPartSegment is a sealed, never-changing run of older messages.
	RecordPartSegment RecordPart = "Segment"
)

// RecordEncoding is the only encoding of AgentRunRecord data: gzip-compressed JSON.
const RecordEncoding = "gzip+json"

// MaxRecordDataBytes bounds one AgentRunRecord's data (before base64), so that the object stays
// well under etcd's request limit after base64 and metadata.
const MaxRecordDataBytes = 768 << 10

// RecordRunReference names the AgentRun a record belongs to, by name and UID, so a record can
// never be mistaken for the record of a namesake run.
type RecordRunReference struct {
	// name of the AgentRun.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// uid of the AgentRun.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	UID string `json:"uid"`
}

// AgentRunRecord holds part of an AgentRun's durable record: the loop state, the transcript and
// the controller's marks (which request was created for which call, which answer was consumed).
// The controller decides from it, so only the manager may create, change or delete records: the
// generated RBAC grants writes to the manager alone, and people get read access through the
// built-in view role (`kubectl toolnexus transcript RUN` reads them). A run has one Head record,
// rewritten after every step, and Segment records sealed once and never changed.
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=arrec,categories=toolnexus
// +kubebuilder:printcolumn:name="Run",type=string,JSONPath=`.run.name`
// +kubebuilder:printcolumn:name="Part",type=string,JSONPath=`.part`
// +kubebuilder:printcolumn:name="Index",type=integer,JSONPath=`.index`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.run == oldSelf.run && self.part == oldSelf.part && self.index == oldSelf.index",message="run, part and index of an AgentRunRecord are immutable"
type AgentRunRecord struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitzero"`

	// run is the AgentRun this record belongs to.
	// +required
	Run RecordRunReference `json:"run"`

	// part is Head (rewritten after every step) or Segment (sealed, never changed).
	// +required
	Part RecordPart `json:"part"`

	// index is 0 for the head and 1, 2, ... for segments, in transcript order.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	Index int32 `json:"index"`

	// encoding of data: gzip+json.
	// +required
	// +kubebuilder:validation:Enum=gzip+json
	Encoding string `json:"encoding"`

	// data is the encoded record part.
	// +required
	// +kubebuilder:validation:MaxLength=1048576
	Data []byte `json:"data"`
}

// AgentRunRecordList is a list of AgentRunRecords.
// +kubebuilder:object:root=true
type AgentRunRecordList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitzero"`
	Items           []AgentRunRecord `json:"items"`
}

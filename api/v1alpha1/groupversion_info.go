// Package v1alpha1 contains the toolnexus.dev/v1alpha1 API: AgentRun and PendingRequest.
// +kubebuilder:object:generate=true
// +groupName=toolnexus.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of these objects.
	GroupVersion = schema.GroupVersion{Group: "toolnexus.dev", Version: "v1alpha1"}

	// SchemeBuilder adds the types of this group and version to a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this group and version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &AgentRun{}, &AgentRunList{}, &PendingRequest{}, &PendingRequestList{},
		&AgentRunRecord{}, &AgentRunRecordList{}, &Agent{}, &AgentList{}, &ApprovalPolicy{}, &ApprovalPolicyList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Package v1alpha1 contains the toolnexus.dev/v1alpha1 API: AgentRun and PendingRequest.
// +kubebuilder:object:generate=true
// +groupName=toolnexus.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of these objects.
	GroupVersion = schema.GroupVersion{Group: "toolnexus.dev", Version: "v1alpha1"}

	// SchemeBuilder adds the types of this group and version to a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this group and version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

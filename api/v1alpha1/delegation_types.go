package v1alpha1

import "strings"

// MaxDelegationDepth bounds how deep sub-agent calls go: a run whose spec.delegatedBy.path holds
// this many runs makes no further sub-agent call (the call's result says so), so an agent that
// calls itself, directly or through others, ends.
const MaxDelegationDepth = 4

// Delegation records the run that delegated this one (a sub-agent call) and the runs above it.
// The operator writes it once, when the call creates the run.
type Delegation struct {
	// path names the runs that delegated this one, the root run first and the parent last; its
	// length is the run's depth.
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=4
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	Path []string `json:"path"`

	// parentUID is the uid of the parent run, the last of path.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	ParentUID string `json:"parentUID"`

	// rootUID is the uid of the root run, the first of path.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	RootUID string `json:"rootUID"`

	// callID is the parent's tool call this run answers.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	CallID string `json:"callID"`
}

// Depth is how many runs delegated this one: 0 for a run a person or a program created.
func (s *AgentRunSpec) Depth() int {
	if s.DelegatedBy == nil {
		return 0
	}
	return len(s.DelegatedBy.Path)
}

// Labels and annotations of delegated runs and their PendingRequests. The labels serve
// selection (kubectl get ar,preq -l toolnexus.dev/root-run=NAME) and are set only when the name
// fits a label value; what the operator decides from is spec.delegatedBy.
const (
	// RootRunLabel names the root run of a delegated run, and of each of its PendingRequests.
	RootRunLabel = "toolnexus.dev/root-run"
	// ParentRunLabel names the parent of a delegated run.
	ParentRunLabel = "toolnexus.dev/parent-run"
	// RootRunUIDLabel is the root run's uid, on the PendingRequests of delegated runs: the root
	// lists them by it in its status.pending.
	RootRunUIDLabel = "toolnexus.dev/root-run-uid"
	// RunPathAnnotation is, on a PendingRequest of a delegated run, the runs from the root to the
	// request's own, joined by "/" (kubectl toolnexus pending, the inbox and notifications show
	// it as root → child).
	RunPathAnnotation = "toolnexus.dev/run-path"
)

// RunPath is the path from the root run to the request's run that RunPathAnnotation records;
// nil for a request of a run nobody delegated, or a path longer than delegation goes.
func (p *PendingRequest) RunPath() []string {
	v := p.Annotations[RunPathAnnotation]
	if v == "" {
		return nil
	}
	path := strings.SplitN(v, "/", MaxDelegationDepth+2)
	if len(path) > MaxDelegationDepth+1 {
		return nil
	}
	return path
}

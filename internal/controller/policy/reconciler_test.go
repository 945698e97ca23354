package policy

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv/gitopshealth"
)

// A policy reads as Ready, or not Ready with the field at fault, and kstatus (Flux, cli-utils
// appliers) reads a policy that cannot be applied as Failed.
func TestSetPolicyReady(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*toolnexusv1alpha1.ApprovalPolicySpec)
		edited  bool
		ready   metav1.ConditionStatus
		reason  string
		message string
		kstatus status.Status
	}{
		{name: "valid", ready: metav1.ConditionTrue, reason: toolnexusv1alpha1.ReasonValid,
			message: "The policy's selectors, tools, when and prompt are valid", kstatus: status.CurrentStatus},
		{name: "a when that does not compile", edit: func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.When = "args.amount >" },
			ready: metav1.ConditionFalse, reason: toolnexusv1alpha1.ReasonInvalidPolicy,
			message: `The calls this policy matches are refused until it is fixed: spec.when: when "args.amount >": ERROR: <input>:1:14: Syntax error`,
			kstatus: status.FailedStatus},
		{name: "edited, not checked yet", edited: true, ready: metav1.ConditionTrue, reason: toolnexusv1alpha1.ReasonValid,
			message: "The policy's selectors", kstatus: status.InProgressStatus},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPolicy("p", tt.edit)
			p.TypeMeta = metav1.TypeMeta{APIVersion: toolnexusv1alpha1.GroupVersion.String(), Kind: "ApprovalPolicy"}
			setPolicyReady(p, compile(p).problem, time.Unix(100, 0))
			if tt.edited {
				p.Generation++
			}
			ready := meta.FindStatusCondition(p.Status.Conditions, toolnexusv1alpha1.ConditionReady)
			if ready == nil || ready.Status != tt.ready || ready.Reason != tt.reason || !strings.HasPrefix(ready.Message, tt.message) || ready.ObservedGeneration != 1 {
				t.Errorf("Ready = %+v, want %s %s %q… at generation 1", ready, tt.ready, tt.reason, tt.message)
			}
			if p.Status.ObservedGeneration != 1 {
				t.Errorf("observedGeneration = %d, want 1", p.Status.ObservedGeneration)
			}
			if got := gitopshealth.Kstatus(t, gitopshealth.AsServed(t, p)); got.Status != string(tt.kstatus) {
				t.Errorf("kstatus %+v, want %s", got, tt.kstatus)
			}
		})
	}
	// Fixed, the policy is Ready again and no longer Stalled.
	p := newPolicy("p", func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.When = "args.amount >" })
	setPolicyReady(p, compile(p).problem, time.Unix(100, 0))
	p.Spec.When, p.Generation = "args.amount > 1.0", 2
	setPolicyReady(p, compile(p).problem, time.Unix(200, 0))
	if !meta.IsStatusConditionTrue(p.Status.Conditions, toolnexusv1alpha1.ConditionReady) ||
		meta.FindStatusCondition(p.Status.Conditions, toolnexusv1alpha1.ConditionStalled) != nil {
		t.Errorf("fixed: conditions %+v, want Ready and no Stalled", p.Status.Conditions)
	}
}

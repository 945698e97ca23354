package agent

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller/runspec"
	"github.com/toolnexus/operator/internal/testenv/gitopshealth"
)

// An Agent in Git reads as Healthy when it can run and Degraded, with the reason, when it cannot,
// to kstatus and to Argo CD alike; a spec the controller has not checked yet is in progress.
func TestHealthOfAgent(t *testing.T) {
	script := gitopshealth.ArgoScript(t, "Agent")
	valid := toolnexusv1alpha1.AgentSpec{Model: toolnexusv1alpha1.ModelSpec{Name: "gpt-4o-mini", BaseURL: "http://127.0.0.1:1/v1"}}
	invalid := *valid.DeepCopy()
	invalid.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"buy"}, When: "args.amount >"}}
	cases := []struct {
		name       string
		spec       toolnexusv1alpha1.AgentSpec
		edited     bool
		kstatus    status.Status
		argo       string
		argoReason string
	}{
		{name: "valid", spec: valid, kstatus: status.CurrentStatus, argo: "Healthy", argoReason: toolnexusv1alpha1.ReasonValid},
		{name: "invalid", spec: invalid, kstatus: status.FailedStatus, argo: "Degraded", argoReason: toolnexusv1alpha1.ReasonInvalidApproval},
		{name: "edited, not checked yet", spec: valid, edited: true, kstatus: status.InProgressStatus, argo: "Progressing"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			agent := &toolnexusv1alpha1.Agent{TypeMeta: metav1.TypeMeta{APIVersion: toolnexusv1alpha1.GroupVersion.String(), Kind: "Agent"},
				ObjectMeta: metav1.ObjectMeta{Name: "buyer", Namespace: "team", Generation: 1}, Spec: tc.spec}
			var invalid *runspec.Error
			if _, err := runspec.Build(&agent.Spec, runspec.Env{}); err != nil && !errors.As(err, &invalid) {
				t.Fatal(err)
			}
			setAgentReady(agent, invalid, time.Unix(100, 0))
			if tc.edited {
				agent.Generation++
			}
			u := gitopshealth.AsServed(t, agent)
			if got := gitopshealth.Kstatus(t, u); got.Status != string(tc.kstatus) {
				t.Errorf("kstatus %+v, want %s", got, tc.kstatus)
			}
			got := gitopshealth.RunArgo(t, script, u)
			if got.Status != tc.argo {
				t.Errorf("Argo CD health %+v, want %s", got, tc.argo)
			}
			if tc.argoReason != "" && !strings.HasPrefix(got.Message, tc.argoReason+": ") {
				t.Errorf("Argo CD message %q, want it to start with the Ready condition's reason %s", got.Message, tc.argoReason)
			}
		})
	}
}

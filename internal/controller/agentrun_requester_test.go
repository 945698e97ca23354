package controller_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// This suite installs no admission policies: the run names its requester as the API server's
// stamp would (test/admission shows the stamp), and the manager copies it.
var _ = Describe("AgentRun requester", func() {
	It("is copied into every PendingRequest of the run", func() {
		ns := newNamespace()
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, "ordered" })
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "buy", Arguments: `{"item":"gpu"}`}),
			looptest.OpenAIText("bought"))
		run := newRun(ns, "requested", model.URL, ts, "buy")
		run.Spec.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"buy"}}}
		run.Spec.RequestedBy = "system:serviceaccount:" + ns + ":nightly"
		Expect(k8sClient.Create(ctx, run)).To(Succeed())

		gate := waitSuspended(run, 1)[0]
		Expect(gate.Spec.RequestedBy).To(Equal(getRun(run).Spec.RequestedBy))
		Expect(gate.Spec.RequestedBy).To(Equal("system:serviceaccount:" + ns + ":nightly"))

		answer(&gate, `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
	})
})

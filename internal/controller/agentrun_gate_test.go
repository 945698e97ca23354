package controller_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// resolvedOf is the status of a request's Resolved condition, empty before it is set.
func resolvedOf(run *toolnexusv1alpha1.AgentRun, name string) func() metav1.ConditionStatus {
	return func() metav1.ConditionStatus {
		if c := meta.FindStatusCondition(requestNamed(run, name).Status.Conditions, toolnexusv1alpha1.ConditionResolved); c != nil {
			return c.Status
		}
		return ""
	}
}

var _ = Describe("AgentRun with an approval gate on a tool that needs authorization", func() {
	It("gives the tool's own suspension its own request after the approval, and retries it once", func() {
		ns := newNamespace()
		const gateID = tools.ApprovalIDPrefix + "call_1"
		ts := toolstest.Serve(GinkgoT(), func(c toolstest.Call) (int, string) {
			if c.Answer != nil && c.Answer.OK {
				return 200, "3 unread messages"
			}
			return 200, `{"auth_required": true, "auth_url": "http://127.0.0.1:1/login", "auth_id": "a1"}`
		})
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "read_mail", Arguments: "{}"}),
			looptest.OpenAIText("you have 3 unread messages"))
		run := newRun(ns, "gated-auth", model.URL, ts, "read_mail")
		run.Spec.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"read_mail"}}}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())

		By("the gate parks the call before the tool runs")
		gate := waitSuspended(run, 1)[0]
		Expect(gate.Name).To(Equal("gated-auth-1-call-1"))
		Expect(gate.Spec.Request.Kind).To(Equal(tools.KindApproval))
		Expect(gate.Spec.Request.ID).To(Equal(gateID))
		Expect(ts.Calls()).To(BeEmpty())

		By("approved, the tool runs for the first time and suspends on its own")
		answer(&gate, `{"ok":true}`)
		Eventually(func() []toolnexusv1alpha1.PendingRequest { return requestsOf(run) }, eventually).Should(HaveLen(2))
		var own toolnexusv1alpha1.PendingRequest
		for _, p := range requestsOf(run) {
			if p.Name != gate.Name {
				own = p
			}
		}
		Expect(own.Spec.Request.Kind).To(Equal(tools.KindAuthorization))
		Expect(own.Spec.Request.ID).NotTo(Equal(gateID))
		Expect(own.Spec.Request.URL).To(Equal("http://127.0.0.1:1/login"))
		Expect(own.Spec.Request.Prompt).To(Equal(tools.DefaultAuthPrompt))
		Expect(string(own.Spec.Request.Data.Raw)).To(MatchJSON(`{"auth_id":"a1"}`))
		Expect(own.Spec.ToolCall).To(Equal(toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "read_mail", Arguments: "{}"}))
		Expect(metav1.IsControlledBy(&own, getRun(run))).To(BeTrue())
		Eventually(resolvedOf(run, gate.Name), eventually).Should(Equal(metav1.ConditionTrue))
		Expect(requestNamed(run, gate.Name).Status.Phase).To(Equal(toolnexusv1alpha1.RequestPhaseAnswered))
		Eventually(resolvedOf(run, own.Name), eventually).Should(Equal(metav1.ConditionFalse))
		// Requests are projected before the run's status, in the same reconcile.
		Eventually(func() []toolnexusv1alpha1.PendingSummary { return getRun(run).Status.Pending }, eventually).
			Should(ConsistOf(HaveField("Name", own.Name)))
		Expect(getRun(run).Status.Phase).To(Equal(toolnexusv1alpha1.RunPhaseSuspended))
		uid := string(getRun(run).UID)
		calls := ts.Calls()
		Expect(calls).To(HaveLen(1), "the approval is the tool's first run, not a retry")
		Expect(calls[0].IdempotencyKey).To(Equal(uid + "/call_1"))
		Expect(calls[0].Answer).To(BeNil(), "the gate's approval is not sent as the tool's answer")
		Expect(model.Requests()).To(HaveLen(1))

		By("authorized, the tool is retried once and the model gets its data")
		answer(&own, `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		calls = ts.Calls()
		Expect(calls).To(HaveLen(2))
		Expect(calls[1].IdempotencyKey).To(Equal(uid + "/call_1/answer"))
		Expect(calls[1].Answer).To(Equal(&tools.Answer{ID: own.Spec.Request.ID, OK: true}))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content", "3 unread messages")))
		Expect(getRun(run).Status.ToolCalls).To(ConsistOf(HaveField("Output", "3 unread messages")))
		Expect(getRun(run).Status.Text).To(Equal("you have 3 unread messages"))
		Eventually(resolvedOf(run, own.Name), eventually).Should(Equal(metav1.ConditionTrue))
		Expect(requestsOf(run)).To(HaveLen(2))
	})
})

package controller_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// inputRun is a run whose model calls the tool inputs_<tool> once, served by an input server.
func inputRun(ns, name string, is *toolstest.InputServer, tool string) (*toolnexusv1alpha1.AgentRun, *looptest.Server) {
	model := looptest.New(GinkgoT(),
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "inputs_" + tool, Arguments: `{"env":"prod"}`}),
		looptest.OpenAIText("finished"))
	run := newRun(ns, name, model.URL, nil)
	run.Spec.MCPServers = []toolnexusv1alpha1.MCPServerSpec{{Name: "inputs", URL: is.URL}}
	return run, model
}

// byKind are requests by their kind.
func byKind(reqs []toolnexusv1alpha1.PendingRequest) map[string]*toolnexusv1alpha1.PendingRequest {
	out := map[string]*toolnexusv1alpha1.PendingRequest{}
	for i := range reqs {
		out[reqs[i].Spec.Request.Kind] = &reqs[i]
	}
	return out
}

// resolvedReason is the reason of request name's Resolved condition once it is True.
func resolvedReason(run *toolnexusv1alpha1.AgentRun, name string) func() string {
	return func() string {
		if c := meta.FindStatusCondition(requestNamed(run, name).Status.Conditions, toolnexusv1alpha1.ConditionResolved); c != nil && c.Status == metav1.ConditionTrue {
			return c.Reason
		}
		return ""
	}
}

var _ = Describe("AgentRun with MCP multi round-trip input", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("parks two input requests of one result on two PendingRequests, answered apart across a restart, then retries once with both", func() {
		is := toolstest.ServeInputs(GinkgoT())
		run, model := inputRun(ns, "mrtr-two", is, "provision")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())

		reqs := byKind(waitSuspended(run, 2))
		form, consent := reqs["input"], reqs["authorization"]
		Expect(form).NotTo(BeNil())
		Expect(consent).NotTo(BeNil())
		Expect(form.Spec.Request.Prompt).To(Equal("Which region?"))
		Expect(string(form.Spec.Request.Data.Raw)).To(ContainSubstring(`"required":["region"]`))
		Expect(consent.Spec.Request.URL).To(Equal(toolstest.ConsentURL))
		Expect(form.Name).NotTo(Equal(consent.Name))
		Expect(form.Spec.ToolCall.Arguments).To(Equal(consent.Spec.ToolCall.Arguments))
		Expect(getRun(run).Status.PendingCount).To(Equal(int32(2)))
		Expect(condition(run, toolnexusv1alpha1.ConditionToolsReady).Message).To(Equal("Every MCP server answered: inputs (MCP 2026-07-28)"))

		answer(form, `{"ok":true,"data":{"region":"eu"}}`)
		Eventually(func() int32 { return getRun(run).Status.PendingCount }, eventually).Should(Equal(int32(1)))
		Consistently(func() int { return is.Calls("provision") }, "1s").Should(Equal(1), "the call waits for the other answer")
		Expect(getRun(run).Status.Phase).To(Equal(toolnexusv1alpha1.RunPhaseSuspended))

		restartManager() // nothing is held while the run waits: the round is in the record
		answer(consent, `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content", "provisioned in eu (consent: accept)")))
		Expect(is.Calls("provision")).To(Equal(2), "the call, and one retry with both answers")
		Expect(is.Echoed()).To(Equal(is.Issued()[:1]), "the retry carries the requestState verbatim")
		Eventually(resolvedReason(run, form.Name), eventually).Should(Equal(toolnexusv1alpha1.ReasonAnswerConsumed))
		Eventually(resolvedReason(run, consent.Name), eventually).Should(Equal(toolnexusv1alpha1.ReasonAnswerConsumed))
	})

	It("tells the model when the server refuses the requestState, and the run goes on", func() {
		is := toolstest.ServeInputs(GinkgoT())
		run, model := inputRun(ns, "mrtr-refused", is, "grant")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		Expect(reqs[0].Spec.Request.Kind).To(Equal("authorization"))
		is.RotateKey() // every requestState issued before is refused: expired
		answer(&reqs[0], `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		msgs := lastToolMessages(model)
		Expect(msgs).To(HaveLen(1))
		Expect(msgs[0]["content"]).To(ContainSubstring("MCP server inputs: tool grant: "))
		Expect(msgs[0]["content"]).To(ContainSubstring("requestState refused: it was tampered with or has expired"))
	})

	It("declines the call when one request of its round is declined, and withdraws the other", func() {
		is := toolstest.ServeInputs(GinkgoT())
		run, model := inputRun(ns, "mrtr-declined", is, "provision")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := byKind(waitSuspended(run, 2))
		answer(reqs["authorization"], `{"ok":false,"reason":"declined"}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content", "declined/expired: Grant access to the project\nreason: declined")))
		Expect(is.Calls("provision")).To(Equal(1))
		// The other request is no longer waited on: cancelled, never answered on anyone's behalf.
		Eventually(func() toolnexusv1alpha1.RequestPhase { return requestNamed(run, reqs["input"].Name).Status.Phase }, eventually).
			Should(Equal(toolnexusv1alpha1.RequestPhaseCancelled))
		Expect(requestNamed(run, reqs["input"].Name).Status.Answer).To(BeNil())
	})

	It("makes a server that asks the same again after the answers unresolved for the model", func() {
		is := toolstest.ServeInputs(GinkgoT())
		run, model := inputRun(ns, "mrtr-again", is, "again")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		answer(&reqs[0], `{"ok":true,"data":{"region":"us"}}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content", "unresolved: Which region?")))
		Expect(requestsOf(run)).To(HaveLen(1), "no second request for the same question")
	})
})

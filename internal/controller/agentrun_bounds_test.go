package controller_test

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

var _ = Describe("AgentRun whose tool suspends with a request no PendingRequest can hold", func() {
	DescribeTable("tells the model why the call cannot wait, and the run goes on to its end",
		func(req tools.Request, want string) {
			ns := newNamespace()
			ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, toolstest.Pending(req) })
			model := looptest.New(GinkgoT(),
				looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "purchase", Arguments: `{"amount":10}`}),
				looptest.OpenAIText("the purchase needs another way"))
			run := newRun(ns, "unholdable", model.URL, ts, "purchase")
			Expect(k8sClient.Create(ctx, run)).To(Succeed())

			Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
			Expect(model.Requests()).To(HaveLen(2), "the model's second turn saw the result")
			Expect(lastToolMessages(model)).To(ConsistOf(And(
				HaveKeyWithValue("tool_call_id", "call_1"), HaveKeyWithValue("content", want))))
			Expect(ts.Calls()).To(HaveLen(1), "the tool ran once and was never retried")
			Expect(getRun(run).Status.ToolCalls).To(ConsistOf(And(HaveField("Output", want), HaveField("IsError", true))))
			Expect(getRun(run).Status.Text).To(Equal("the purchase needs another way"))
			var preqs toolnexusv1alpha1.PendingRequestList
			Expect(k8sClient.List(ctx, &preqs, client.InNamespace(ns))).To(Succeed())
			Expect(preqs.Items).To(BeEmpty())
		},
		Entry("a request id of 300 characters",
			tools.Request{ID: strings.Repeat("i", 300), Kind: tools.KindApproval, Prompt: "Buy it?"},
			"purchase cannot wait for an answer: its request id is 300 characters; at most 256 fit"),
		Entry("an expiresAt that does not parse",
			tools.Request{ID: "r1", Kind: tools.KindApproval, Prompt: "Buy it?", ExpiresAt: "next week"},
			`purchase cannot wait for an answer: its expiresAt "next week" is not an RFC 3339 time such as 2026-12-01T00:00:00Z`),
	)
})

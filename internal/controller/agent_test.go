package controller_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// newAgent builds an Agent against the fake model at modelURL with HTTP tools served by ts, each
// behind an approval gate.
func newAgent(ns, name, modelURL string, ts *toolstest.Server, toolNames ...string) *toolnexusv1alpha1.Agent {
	agent := &toolnexusv1alpha1.Agent{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: newRun(ns, name, modelURL, ts, toolNames...).Spec.AgentSpec}
	if len(toolNames) > 0 {
		agent.Spec.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: toolNames}}
	}
	return agent
}

// runOf builds a run of the named Agent.
func runOf(ns, name, agent string) *toolnexusv1alpha1.AgentRun {
	return &toolnexusv1alpha1.AgentRun{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: toolnexusv1alpha1.AgentRunSpec{AgentRef: &toolnexusv1alpha1.AgentReference{Name: agent}, Prompt: "buy a gpu"}}
}

func agentCondition(agent *toolnexusv1alpha1.Agent, t string) func() string {
	return func() string {
		got := &toolnexusv1alpha1.Agent{}
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(agent), got)).To(Succeed())
		for _, c := range got.Status.Conditions {
			if c.Type == t && c.ObservedGeneration == got.Generation {
				return string(c.Status) + "/" + c.Reason
			}
		}
		return ""
	}
}

var _ = Describe("AgentRun of an Agent", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("runs the Agent: suspends, is answered, finishes, and names the Agent and generation it used, even once the Agent is deleted", func() {
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, "ordered" })
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "purchase", Arguments: `{"item":"gpu"}`}),
			looptest.OpenAIText("bought a gpu"))
		agent := newAgent(ns, "purchasing", model.URL, ts, "purchase")
		agent.Spec.SystemPrompt = "You are a purchasing assistant."
		Expect(k8sClient.Create(ctx, agent)).To(Succeed())
		Eventually(agentCondition(agent, toolnexusv1alpha1.ConditionReady), eventually).Should(Equal("True/" + toolnexusv1alpha1.ReasonValid))

		run := runOf(ns, "buy-gpu", "purchasing")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		p := waitSuspended(run, 1)[0]
		Expect(p.Spec.Request.Kind).To(Equal(tools.KindApproval))
		Expect(getRun(run).Status.Agent).To(Equal(&toolnexusv1alpha1.AgentSnapshotReference{Name: "purchasing", Generation: agent.Generation}))
		Expect(k8sClient.Delete(ctx, agent)).To(Succeed())
		answer(&p, `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("bought a gpu"))
		Expect(ts.Calls()).To(HaveLen(1))
		first := model.Requests()[0].JSON(GinkgoT())
		Expect(first["messages"]).To(ContainElement(HaveKeyWithValue("content", "You are a purchasing assistant.")))
	})

	It("keeps the snapshot it took: an Agent edited while the run is parked does not change it", func() {
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, "ordered" })
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "purchase", Arguments: `{"item":"gpu"}`}),
			looptest.OpenAIText("bought a gpu"))
		other := looptest.New(GinkgoT(), looptest.OpenAIText("wrong model"))
		agent := newAgent(ns, "purchasing", model.URL, ts, "purchase")
		Expect(k8sClient.Create(ctx, agent)).To(Succeed())
		run := runOf(ns, "buy-gpu", "purchasing")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		p := waitSuspended(run, 1)[0]

		By("the Agent loses its tool and gets another model")
		edited := agent.DeepCopy()
		edited.Spec.Tools, edited.Spec.Approvals = nil, nil
		edited.Spec.Model = toolnexusv1alpha1.ModelSpec{Name: "other", BaseURL: other.URL}
		Expect(k8sClient.Patch(ctx, edited, client.MergeFrom(agent))).To(Succeed())
		Expect(edited.Generation).To(BeNumerically(">", agent.Generation))

		answer(&p, `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("bought a gpu"))
		Expect(getRun(run).Status.Agent.Generation).To(Equal(agent.Generation))
		Expect(ts.Calls()).To(HaveLen(1), "the snapshot's tool ran")
		Expect(model.Requests()).To(HaveLen(2))
		Expect(other.Requests()).To(BeEmpty())
	})

	It("waits with AgentNotFound for an Agent that does not exist, and starts when it is created", func() {
		model := looptest.New(GinkgoT(), looptest.OpenAIText("hello"))
		run := runOf(ns, "early", "late-agent")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(func() string { return reasonOf(run) }, eventually).Should(Equal(toolnexusv1alpha1.ReasonAgentNotFound))
		Expect(condition(run, toolnexusv1alpha1.ConditionSucceeded).Status).To(Equal(metav1.ConditionUnknown))
		Expect(getRun(run).Status.Phase).To(Equal(toolnexusv1alpha1.RunPhasePending))
		Expect(model.Requests()).To(BeEmpty())

		Expect(k8sClient.Create(ctx, newAgent(ns, "late-agent", model.URL, nil))).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Agent.Name).To(Equal("late-agent"))
	})

	It("uses the run's own maxTurns over the Agent's", func() {
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, "again" })
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "poke", Arguments: "{}"}),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_2", Name: "poke", Arguments: "{}"}))
		agent := newAgent(ns, "poker", model.URL, ts, "poke")
		agent.Spec.Approvals, agent.Spec.MaxTurns = nil, 5
		Expect(k8sClient.Create(ctx, agent)).To(Succeed())
		run := runOf(ns, "short", "poker")
		run.Spec.MaxTurns = 1
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseIncomplete))
		Expect(getRun(run).Status.Turns).To(Equal(int32(1)))
	})
})

var _ = Describe("Agent", func() {
	It("reads Ready False with a reason, and Stalled, when a `when` does not compile", func() {
		agent := newAgent(newNamespace(), "bad-when", "http://127.0.0.1:1", nil)
		agent.Spec.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"*"}, When: "args.amount >"}}
		Expect(k8sClient.Create(ctx, agent)).To(Succeed())
		Eventually(agentCondition(agent, toolnexusv1alpha1.ConditionReady), eventually).Should(Equal("False/" + toolnexusv1alpha1.ReasonInvalidApproval))
		Expect(agentCondition(agent, toolnexusv1alpha1.ConditionStalled)()).To(Equal("True/" + toolnexusv1alpha1.ReasonInvalidApproval))

		By("fixed, it reads Ready True and no longer Stalled")
		fixed := agent.DeepCopy()
		fixed.Spec.Approvals[0].When = "args.amount > 1"
		Expect(k8sClient.Patch(ctx, fixed, client.MergeFrom(agent))).To(Succeed())
		Eventually(agentCondition(agent, toolnexusv1alpha1.ConditionReady), eventually).Should(Equal("True/" + toolnexusv1alpha1.ReasonValid))
		Expect(agentCondition(agent, toolnexusv1alpha1.ConditionStalled)()).To(BeEmpty())
	})
})

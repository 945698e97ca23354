package controller_test

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/telemetry"
	"github.com/toolnexus/operator/internal/testenv/operator"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// delegating is a model that calls tool with arguments until it is sent a tool's result, and then
// answers with said followed by that result.
func delegating(tool, arguments, said string) *looptest.Server {
	return looptest.Serve(GinkgoT(), func(r looptest.Request) looptest.Reply {
		chat, err := r.Chat()
		if err != nil {
			return looptest.OpenAIError(http.StatusBadRequest, err.Error())
		}
		if last := chat.Messages[len(chat.Messages)-1]; last.Role == "tool" {
			return looptest.OpenAIText(said + last.Text())
		}
		return looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: tool, Arguments: arguments})
	})
}

// purchasingAgent is an Agent whose tool approve_purchase asks for an approval only alice may give,
// and whose model says what the tool answered once approved.
func purchasingAgent(ns string) *toolnexusv1alpha1.Agent {
	ts := toolstest.Serve(GinkgoT(), func(c toolstest.Call) (int, string) {
		if c.Answer != nil {
			return 200, "purchase of gpu approved"
		}
		return 200, toolstest.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "Approve the purchase of a gpu?"})
	})
	model := delegating("approve_purchase", `{"item":"gpu"}`, "bought: ")
	agent := &toolnexusv1alpha1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "purchasing", Namespace: ns},
		Spec: newRun(ns, "purchasing", model.URL, ts, "approve_purchase").Spec.AgentSpec}
	agent.Spec.Suspension = &toolnexusv1alpha1.SuspensionPolicy{Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice"}}}
	return agent
}

// delegatingRun is an inline run, requested by carol, whose one tool buyer is the Agent agent, and
// whose own requests only bob may answer (none of which its child inherits).
func delegatingRun(ns, name, agent string, model *looptest.Server) *toolnexusv1alpha1.AgentRun {
	run := newRun(ns, name, model.URL, nil)
	run.Spec.Prompt = "buy a gpu for the lab"
	run.Spec.RequestedBy = "carol"
	run.Spec.Tools = []toolnexusv1alpha1.ToolSpec{{Name: "buyer", AgentRef: &toolnexusv1alpha1.AgentReference{Name: agent}}}
	run.Spec.Suspension = &toolnexusv1alpha1.SuspensionPolicy{Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"bob"}}}
	return run
}

// childrenOf lists the runs run's sub-agent calls created.
func childrenOf(run *toolnexusv1alpha1.AgentRun) []toolnexusv1alpha1.AgentRun {
	var list toolnexusv1alpha1.AgentRunList
	Expect(k8sClient.List(ctx, &list, client.InNamespace(run.Namespace),
		client.MatchingLabels{toolnexusv1alpha1.ParentRunLabel: run.Name})).To(Succeed())
	return list.Items
}

// onlyChild waits for run's one child and returns it.
func onlyChild(run *toolnexusv1alpha1.AgentRun) *toolnexusv1alpha1.AgentRun {
	Eventually(func() []toolnexusv1alpha1.AgentRun { return childrenOf(run) }, eventually).Should(HaveLen(1))
	return &childrenOf(run)[0]
}

var _ = Describe("Sub-agents", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("runs a child of the Agent, surfaces its request at the root, survives a restart while the child is parked, and returns the child's text", func() {
		Expect(k8sClient.Create(ctx, purchasingAgent(ns))).To(Succeed())
		model := delegating("buyer", `{"prompt":"buy a gpu"}`, "the lab has: ")
		run := delegatingRun(ns, "lab-order", "purchasing", model)
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		parent := getRun(run)

		By("the call creates one child run of the Agent, owned by the parent, for the parent's requester")
		child := onlyChild(run)
		Expect(child.Spec.AgentRef).To(Equal(&toolnexusv1alpha1.AgentReference{Name: "purchasing"}))
		Expect(child.Spec.Prompt).To(Equal("buy a gpu"))
		Expect(child.Spec.RequestedBy).To(Equal("carol"))
		Expect(child.Spec.DelegatedBy).To(Equal(&toolnexusv1alpha1.Delegation{Path: []string{"lab-order"},
			ParentUID: string(parent.UID), RootUID: string(parent.UID), CallID: "call_1"}))
		Expect(child.Labels).To(Equal(map[string]string{toolnexusv1alpha1.RootRunLabel: "lab-order", toolnexusv1alpha1.ParentRunLabel: "lab-order"}))
		Expect(child.Annotations[toolnexusv1alpha1.TraceparentAnnotation]).To(HavePrefix("00-"+telemetry.TraceID(string(parent.UID)).String()+"-"),
			"the child's trace is a child of the parent's call")
		owner := metav1.GetControllerOf(child)
		Expect(owner).NotTo(BeNil())
		Expect(owner.UID).To(Equal(parent.UID))
		Expect(*owner.BlockOwnerDeletion).To(BeTrue(), "deleting the parent in the foreground waits for its children")

		By("the child parks on its own Agent's request, which names the root and the path, and shows in the root's status.pending")
		reqs := waitSuspended(child, 1)
		preq := reqs[0]
		Expect(preq.Labels).To(HaveKeyWithValue(toolnexusv1alpha1.RootRunLabel, "lab-order"))
		Expect(preq.Labels).To(HaveKeyWithValue(toolnexusv1alpha1.RootRunUIDLabel, string(parent.UID)))
		Expect(preq.Annotations).To(HaveKeyWithValue(toolnexusv1alpha1.RunPathAnnotation, "lab-order/"+child.Name))
		Expect(preq.Spec.Approvers).To(Equal(&toolnexusv1alpha1.Approvers{Users: []string{"alice"}}), "the child's approvers are its Agent's, not its parent's")
		Expect(preq.Spec.RequestedBy).To(Equal("carol"))
		Eventually(func() []toolnexusv1alpha1.PendingSummary { return getRun(run).Status.Pending }, eventually).Should(Equal([]toolnexusv1alpha1.PendingSummary{{
			Name: preq.Name, Kind: tools.KindApproval, Prompt: "Approve the purchase of a gpu?", ToolCallID: "call_1", Run: child.Name}}))
		Expect(getRun(run).Status.Phase).To(Equal(toolnexusv1alpha1.RunPhaseSuspended))
		Expect(requestsOf(run)).To(BeEmpty(), "the parent itself asks nothing")
		Eventually(func() float64 {
			return metricValue("toolnexus_external_waits", map[string]string{"namespace": ns, "kind": "agentrun"})
		}, eventually).Should(Equal(1.0))
		Expect(model.Requests()).To(HaveLen(1), "the parent parks without another model turn")

		By("a restart while the child is parked loses nothing and makes no second child")
		restartManager()
		// Nothing looks at the child on a schedule: its end wakes the parent.
		looks := func() float64 {
			return metricValue("toolnexus_external_wait_polls_total", map[string]string{"tool": "buyer", "source": "agent"})
		}
		Consistently(looks, 2*time.Second+500*time.Millisecond).Should(BeZero())
		answer(&preq, `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("the lab has: bought: purchase of gpu approved"))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content", "bought: purchase of gpu approved")))
		Expect(getRun(child).Status.Phase).To(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(childrenOf(run)).To(HaveLen(1))
		Expect(looks()).To(Equal(1.0), "the parent looked at its child once, when it ended")
		Expect(getRun(run).Status.Pending).To(BeEmpty())
		Eventually(func() []string { return eventNotes(run, "SubRunCreated") }, eventually).
			Should(ConsistOf("Tool buyer called agent purchasing: run " + child.Name))
	})

	It("cancels the child when the parent is cancelled, and when the parent is deleted", func() {
		Expect(k8sClient.Create(ctx, purchasingAgent(ns))).To(Succeed())
		for _, deleted := range []bool{false, true} {
			run := delegatingRun(ns, map[bool]string{false: "cancelled-order", true: "deleted-order"}[deleted], "purchasing",
				delegating("buyer", `{"prompt":"buy a gpu"}`, "unused: "))
			Expect(k8sClient.Create(ctx, run)).To(Succeed())
			child := onlyChild(run)
			reqs := waitSuspended(child, 1)

			if deleted {
				// envtest runs no garbage collector: the child stays, cancelled, where a cluster deletes it.
				Expect(k8sClient.Delete(ctx, getRun(run))).To(Succeed())
			} else {
				Expect(k8sClient.Patch(ctx, getRun(run), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"cancel":true}}`)))).To(Succeed())
				Eventually(func() string { return reasonOf(run) }, eventually).Should(Equal(toolnexusv1alpha1.ReasonCancelled))
			}
			Eventually(func() string { return reasonOf(child) }, eventually).Should(Equal(toolnexusv1alpha1.ReasonCancelled))
			Expect(getRun(child).Spec.Cancel).To(BeTrue())
			Eventually(func() toolnexusv1alpha1.RequestPhase { return requestNamed(child, reqs[0].Name).Status.Phase }, eventually).
				Should(Equal(toolnexusv1alpha1.RequestPhaseCancelled))
			if !deleted {
				Eventually(func() []string { return eventNotes(run, "SubRunCancelled") }, eventually).
					Should(ContainElement(ContainSubstring("Cancelled sub-run " + child.Name)))
			}
		}
	})

	It("stops waiting on a child at the parent's suspension timeout, cancels it and tells the model", func() {
		Expect(k8sClient.Create(ctx, purchasingAgent(ns))).To(Succeed())
		run := delegatingRun(ns, "impatient-order", "purchasing", delegating("buyer", `{"prompt":"buy a gpu"}`, "said: "))
		run.Spec.Suspension.Timeout = &metav1.Duration{Duration: 3 * time.Second}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		child := onlyChild(run)
		waitSuspended(child, 1)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("said: agentrun " + child.Name + " on purchasing did not finish within 3s (last status: running); it was cancelled"))
		Eventually(func() string { return reasonOf(child) }, eventually).Should(Equal(toolnexusv1alpha1.ReasonCancelled))
	})

	It("ends a cycle at the depth bound: an agent whose tool is itself", func() {
		model := delegating("again", `{"prompt":"look deeper"}`, "depth answer: ")
		agent := &toolnexusv1alpha1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "recursive", Namespace: ns},
			Spec: newRun(ns, "recursive", model.URL, nil).Spec.AgentSpec}
		agent.Spec.Tools = []toolnexusv1alpha1.ToolSpec{{Name: "again", AgentRef: &toolnexusv1alpha1.AgentReference{Name: "recursive"}}}
		Expect(k8sClient.Create(ctx, agent)).To(Succeed())
		root := runOf(ns, "deep", "recursive")
		Expect(k8sClient.Create(ctx, root)).To(Succeed())

		Eventually(phaseOf(root), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		// Each run's call waits on the one below; the deepest is told it may go no deeper.
		chain, path := []*toolnexusv1alpha1.AgentRun{getRun(root)}, []string{"deep"}
		for len(childrenOf(chain[len(chain)-1])) > 0 {
			Expect(childrenOf(chain[len(chain)-1])).To(HaveLen(1))
			next := &childrenOf(chain[len(chain)-1])[0]
			Expect(next.Spec.DelegatedBy.Path).To(Equal(path))
			chain, path = append(chain, next), append(path, next.Name)
		}
		Expect(chain).To(HaveLen(toolnexusv1alpha1.MaxDelegationDepth + 1))
		refusal := "again: agent recursive was not called: sub-agent calls go at most 4 deep, and this run is 4 deep (" +
			strings.Join(path, " → ") + "); answer without it"
		Expect(chain[len(chain)-1].Status.ToolCalls).To(ConsistOf(And(
			HaveField("Output", refusal), HaveField("IsError", true))))
		Expect(getRun(root).Status.Text).To(Equal(strings.Repeat("depth answer: ", toolnexusv1alpha1.MaxDelegationDepth+1) + refusal))
	})

	It("tells the model when the Agent does not exist, and when the child failed", func() {
		missing := delegatingRun(ns, "ghost-order", "ghost", delegating("buyer", `{"prompt":"buy a gpu"}`, "said: "))
		Expect(k8sClient.Create(ctx, missing)).To(Succeed())
		Eventually(phaseOf(missing), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(missing).Status.Text).To(Equal("said: buyer: agent ghost was not called: there is no Agent ghost in namespace " + ns))
		Expect(childrenOf(missing)).To(BeEmpty())

		broken := &toolnexusv1alpha1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "broken", Namespace: ns},
			Spec: newRun(ns, "broken", looptest.New(GinkgoT(), looptest.OpenAIError(http.StatusBadRequest, "no such model")).URL, nil).Spec.AgentSpec}
		Expect(k8sClient.Create(ctx, broken)).To(Succeed())
		failing := delegatingRun(ns, "broken-order", "broken", delegating("buyer", `{"prompt":"buy a gpu"}`, "said: "))
		Expect(k8sClient.Create(ctx, failing)).To(Succeed())
		Eventually(phaseOf(failing), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		child := onlyChild(failing)
		Expect(getRun(failing).Status.Text).To(HavePrefix("said: agent broken: its run " + child.Name + " failed (ModelError): "))
		Expect(getRun(failing).Status.ToolCalls[0].IsError).To(BeTrue())
	})
})

// childCreatedThenSaveLost fails the first save of a run's record that follows the creation of a
// sub-agent's run: the step that created the child is lost, as in a crash between the two.
type childCreatedThenSaveLost struct {
	next          http.RoundTripper
	armed, failed atomic.Bool
}

func (f *childCreatedThenSaveLost) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPut && strings.Contains(req.URL.Path, "/agentrunrecords/") && f.armed.Load() && !f.failed.Swap(true) {
		return nil, errors.New("injected: the save after the child's creation is lost")
	}
	resp, err := f.next.RoundTrip(req)
	if req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/agentruns") && err == nil && resp.StatusCode == http.StatusCreated {
		f.armed.Store(true)
	}
	return resp, err
}

var _ = Describe("Sub-agents across a lost step", Ordered, func() {
	It("adopts the child a call created before its step was lost, and never creates a second", func() {
		ns := newNamespace()
		Expect(k8sClient.Create(ctx, purchasingAgent(ns))).To(Succeed())
		stopManager()
		faulty, fault := rest.CopyConfig(cfg), &childCreatedThenSaveLost{}
		faulty.Wrap(func(rt http.RoundTripper) http.RoundTripper { fault.next = rt; return fault })
		m := operator.New(GinkgoT(), faulty, func() controller.Options {
			return controller.Options{Registry: prometheus.NewRegistry(), MaxConcurrentReconciles: 2}
		})
		m.Start(GinkgoT())
		DeferCleanup(func() {
			Expect(m.Stop()).To(Succeed())
			startManager()
		})

		model := delegating("buyer", `{"prompt":"buy a gpu"}`, "the lab has: ")
		// The test creates its run with the suite's client: the fault watches the manager's own creates.
		run := delegatingRun(ns, "adopting-order", "purchasing", model)
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		child := onlyChild(run)
		reqs := waitSuspended(child, 1)
		Expect(fault.failed.Load()).To(BeTrue(), "the save after the child's creation was not the one that failed")
		answer(&reqs[0], `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("the lab has: bought: purchase of gpu approved"))
		Expect(childrenOf(run)).To(HaveLen(1))
	})
})

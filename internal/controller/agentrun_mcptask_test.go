package controller_test

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// taskRun is a run whose model calls the tool ci_<tool> once, served by a task server.
func taskRun(ns, name string, ts *toolstest.TaskServer, tool string) (*toolnexusv1alpha1.AgentRun, *looptest.Server) {
	model := looptest.New(GinkgoT(),
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "ci_" + tool, Arguments: `{"ref":"main"}`}),
		looptest.OpenAIText("finished"))
	run := newRun(ns, name, model.URL, nil)
	run.Spec.MCPServers = []toolnexusv1alpha1.MCPServerSpec{{Name: "ci", URL: ts.URL}}
	return run, model
}

var _ = Describe("AgentRun with MCP tasks", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("waits on a task across two manager restarts without a slot, creates it once, and gives its result to the model", func() {
		ts := toolstest.ServeTasks(GinkgoT(), map[string]toolstest.TaskSpec{"build": {Polls: 6}})
		ts.SetPollInterval(1000)
		run, model := taskRun(ns, "task-restarts", ts, "build")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())

		Eventually(ts.Polls, eventually).Should(BeNumerically(">=", 1))
		Eventually(func() float64 { return metricValue("toolnexus_external_waits", map[string]string{"namespace": ns}) }, eventually).Should(Equal(1.0))
		// Between looks the run holds no executor slot.
		Eventually(func() float64 { return metricValue("toolnexus_inflight_steps", map[string]string{"namespace": ns}) }, eventually).Should(BeZero())
		Expect(getRun(run).Status.Phase).NotTo(Equal(toolnexusv1alpha1.RunPhaseSucceeded))

		restartManager()
		polled := ts.Polls()
		Eventually(ts.Polls, eventually).Should(BeNumerically(">", polled), "the new manager looks at the task again")
		restartManager()

		Eventually(phaseOf(run), 3*eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(ts.Calls("build")).To(Equal(1), "the call is made once; every later look is a tasks/get")
		Expect(ts.Polls()).To(BeNumerically(">=", 7))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content", `build done with {"ref":"main"}`)))
		Expect(metricValue("toolnexus_external_wait_polls_total", map[string]string{"tool": "ci_build", "outcome": "done"})).To(BeNumerically(">=", 1))
		Eventually(func() float64 { return metricValue("toolnexus_external_waits", map[string]string{"namespace": ns}) }, eventually).Should(BeZero())
		Expect(ts.Cancelled()).To(BeEmpty())
		Eventually(func() []string { return getRun(run).Finalizers }, eventually).ShouldNot(ContainElement(toolnexusv1alpha1.ExternalWorkFinalizer),
			"a run that waits on nothing holds nothing")
	})

	It("cancels the task when the run is cancelled", func() {
		ts := toolstest.ServeTasks(GinkgoT(), map[string]toolstest.TaskSpec{"build": {Polls: 10_000}})
		run, _ := taskRun(ns, "task-cancel", ts, "build")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(ts.Polls, eventually).Should(BeNumerically(">=", 1))
		Expect(k8sClient.Patch(ctx, getRun(run), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"cancel":true}}`)))).To(Succeed())
		Eventually(ts.Cancelled, eventually).Should(Equal([]string{"task-1"}))
		Expect(ts.Status("task-1")).To(Equal("cancelled"))
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseFailed))
		Expect(condition(run, toolnexusv1alpha1.ConditionSucceeded).Reason).To(Equal(toolnexusv1alpha1.ReasonCancelled))
	})

	It("cancels the task when the run is deleted, then lets the run go", func() {
		ts := toolstest.ServeTasks(GinkgoT(), map[string]toolstest.TaskSpec{"build": {Polls: 10_000}})
		run, _ := taskRun(ns, "task-deleted", ts, "build")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(ts.Polls, eventually).Should(BeNumerically(">=", 1))
		Eventually(func() []string { return getRun(run).Finalizers }, eventually).Should(ContainElement(toolnexusv1alpha1.ExternalWorkFinalizer))
		Expect(k8sClient.Delete(ctx, getRun(run))).To(Succeed())
		Eventually(ts.Cancelled, eventually).Should(Equal([]string{"task-1"}))
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(run), &toolnexusv1alpha1.AgentRun{}))
		},
			eventually).Should(BeTrue(), "the run goes once its task is cancelled")
	})

	It("lets a deleted run go after a few attempts when its task's server is down", func() {
		ts := toolstest.ServeTasks(GinkgoT(), map[string]toolstest.TaskSpec{"build": {Polls: 10_000}})
		run, _ := taskRun(ns, "task-deleted-down", ts, "build")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(func() []string { return getRun(run).Finalizers }, eventually).Should(ContainElement(toolnexusv1alpha1.ExternalWorkFinalizer))
		ts.Refuse(true)
		deleted := getRun(run)
		Expect(k8sClient.Delete(ctx, deleted)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(run), &toolnexusv1alpha1.AgentRun{}))
		},
			eventually).Should(BeTrue(), "the deletion is not held past the attempts")
		Expect(ts.Cancelled()).To(BeEmpty())
		Eventually(func() int { return occurrences(deleted, "TaskCancelFailed") }, eventually).Should(Equal(1))
		Eventually(func() int { return occurrences(deleted, "ExternalWorkReleased") }, eventually).Should(Equal(1))
	})

	It("parks a task that asks for input on a PendingRequest and hands the answer to the task", func() {
		ts := toolstest.ServeTasks(GinkgoT(), map[string]toolstest.TaskSpec{"greet": {Polls: 1, Ask: map[string]*mcp.ElicitParams{
			"name": {Mode: "form", Message: "Your name?", RequestedSchema: map[string]any{"type": "object",
				"properties": map[string]any{"name": map[string]any{"type": "string"}}, "required": []any{"name"}}},
		}}})
		run, model := taskRun(ns, "task-input", ts, "greet")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		Expect(reqs[0].Spec.Request.Kind).To(Equal("input"))
		Expect(reqs[0].Spec.Request.Prompt).To(Equal("Your name?"))
		Expect(string(reqs[0].Spec.Request.Data.Raw)).To(ContainSubstring(`"required":["name"]`))
		answer(&reqs[0], `{"ok":true,"data":{"name":"Ada"}}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content",
			`greet done with {"ref":"main"}; name={"action":"accept","content":{"name":"Ada"}}`)))
		Expect(ts.Calls("greet")).To(Equal(1))
		Expect(ts.Updates()).To(Equal(1))
	})

	It("parks a task's two input requests on a PendingRequest each, in turn, and hands both to the task", func() {
		ts := toolstest.ServeTasks(GinkgoT(), map[string]toolstest.TaskSpec{"pair": {Ask: map[string]*mcp.ElicitParams{
			"a": {Mode: "form", Message: "First?", RequestedSchema: map[string]any{"type": "object"}},
			"b": {Mode: "url", Message: "Sign in", URL: "https://idp.example.com/consent"},
		}}})
		run, model := taskRun(ns, "task-pair", ts, "pair")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		first := waitSuspended(run, 1)[0]
		Expect(first.Spec.Request.Prompt).To(Equal("First?"))
		answer(&first, `{"ok":true,"data":{"name":"Ada"}}`)
		Eventually(func() []toolnexusv1alpha1.PendingRequest { return requestsOf(run) }, eventually).Should(HaveLen(2),
			"the second request gets a name of its own")
		var second toolnexusv1alpha1.PendingRequest
		for _, p := range requestsOf(run) {
			if p.Name != first.Name {
				second = p
			}
		}
		Expect(second.Spec.Request.Kind).To(Equal("authorization"))
		answer(&second, `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content",
			`pair done with {"ref":"main"}; a={"action":"accept","content":{"name":"Ada"}}; b={"action":"accept"}`)))
		Expect(ts.Calls("pair")).To(Equal(1))
		Expect(ts.Updates()).To(Equal(2))
	})

	It("tells the model when the server no longer knows the task, and the run goes on", func() {
		ts := toolstest.ServeTasks(GinkgoT(), map[string]toolstest.TaskSpec{"build": {Polls: 10_000}})
		ts.SetPollInterval(86_400_000) // a day: the loop looks again after a minute at the latest
		run, model := taskRun(ns, "task-forgotten", ts, "build")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(func() float64 { return metricValue("toolnexus_external_waits", map[string]string{"namespace": ns}) }, eventually).Should(Equal(1.0))
		ts.Forget()
		ts.SetPollInterval(0)
		// The run looks again within the bound (60s) and learns the task is gone.
		Eventually(phaseOf(run), 4*eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		msgs := lastToolMessages(model)
		Expect(msgs).To(HaveLen(1))
		Expect(msgs[0]["content"]).To(ContainSubstring("task task-1 is not known to the server any more"))
	})
})

package trust_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/testenv"
)

// Approvals a platform requires (SPEC.md section 11): the ApprovalPolicies are cluster-scoped and
// written by admin; the run authors are namespace editors; the approvers answer as themselves.

// prodNamespace is a new namespace labelled tier=prod.
func prodNamespace() string {
	GinkgoHelper()
	ns := newNamespace()
	Expect(admin.Patch(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		mergePatch(`{"metadata":{"labels":{"tier":"prod"}}}`))).To(Succeed())
	return ns
}

// createPolicy creates an ApprovalPolicy on the purchase tool in tier=prod namespaces, edited by
// edit, and waits until it is Ready; it is deleted when the spec ends.
func createPolicy(name string, edit func(*toolnexusv1alpha1.ApprovalPolicySpec)) *toolnexusv1alpha1.ApprovalPolicy {
	GinkgoHelper()
	p := &toolnexusv1alpha1.ApprovalPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: toolnexusv1alpha1.ApprovalPolicySpec{
			NamespaceSelector: &toolnexusv1alpha1.LabelSelector{MatchLabels: map[string]toolnexusv1alpha1.LabelValue{"tier": "prod"}},
			Tools:             []string{"purchase"},
			Approvers:         toolnexusv1alpha1.Approvers{Users: []string{"alice"}},
		},
	}
	if edit != nil {
		edit(&p.Spec)
	}
	Expect(admin.Create(ctx, p)).To(Succeed())
	DeferCleanup(func() { Expect(client.IgnoreNotFound(admin.Delete(ctx, p))).To(Succeed()) })
	Eventually(func() metav1.ConditionStatus {
		got := &toolnexusv1alpha1.ApprovalPolicy{}
		Expect(admin.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
		for _, c := range got.Status.Conditions {
			if c.Type == toolnexusv1alpha1.ConditionReady && c.ObservedGeneration == got.Generation {
				return c.Status
			}
		}
		return ""
	}, eventually).Should(Equal(metav1.ConditionTrue))
	return p
}

// ungatedRun is gatedRun without the run's own gate and approvers: only a policy can gate it.
func ungatedRun(ns, modelURL, toolURL string) *toolnexusv1alpha1.AgentRun {
	run := plainRun(ns, "buy", modelURL, toolURL)
	run.Spec.Tools[0].Name = "purchase"
	return run
}

// requestsOf lists the run's PendingRequests.
func requestsOf(run *toolnexusv1alpha1.AgentRun) []toolnexusv1alpha1.PendingRequest {
	var list toolnexusv1alpha1.PendingRequestList
	Expect(admin.List(ctx, &list, client.InNamespace(run.Namespace),
		client.MatchingLabels{toolnexusv1alpha1.RunLabel: run.Name})).To(Succeed())
	return list.Items
}

// waitRequestOfPolicy waits for the run's open request of policy name.
func waitRequestOfPolicy(run *toolnexusv1alpha1.AgentRun, name string) *toolnexusv1alpha1.PendingRequest {
	GinkgoHelper()
	var found *toolnexusv1alpha1.PendingRequest
	Eventually(func() bool {
		for _, p := range requestsOf(run) {
			if p.Spec.Policy != nil && p.Spec.Policy.Name == name && p.Status.Answer == nil {
				found = &p
				return true
			}
		}
		return false
	}, eventually).Should(BeTrue(), "a request of policy %s", name)
	return found
}

// answerAs sets preq's answer as c.
func answerAs(c client.Client, preq *toolnexusv1alpha1.PendingRequest, answer string) error {
	return c.Status().Patch(ctx, preq.DeepCopy(), mergePatch(`{"status":{"answer":`+answer+`}}`))
}

// addEntry adds c's entry to preq's status.approvals, as `kubectl toolnexus approve` does.
func addEntry(c client.Client, user string, preq *toolnexusv1alpha1.PendingRequest, ok bool, reason string) error {
	cur := &toolnexusv1alpha1.PendingRequest{}
	if err := admin.Get(ctx, client.ObjectKeyFromObject(preq), cur); err != nil {
		return err
	}
	entry, err := json.Marshal(toolnexusv1alpha1.ApprovalEntry{User: user, OK: ok, Reason: reason})
	if err != nil {
		return err
	}
	patch := fmt.Sprintf(`[{"op":"add","path":"/status/approvals","value":[%s]}]`, entry)
	if len(cur.Status.Approvals) > 0 {
		patch = fmt.Sprintf(`[{"op":"add","path":"/status/approvals/-","value":%s}]`, entry)
	}
	return c.Status().Patch(ctx, cur, client.RawPatch(types.JSONPatchType, []byte(patch)))
}

var _ = Describe("An ApprovalPolicy", func() {
	It("gates a call in a tier=prod namespace whose run asks for no approval; its author cannot get around it", func() {
		ns := prodNamespace()
		policy := createPolicy("prod-purchases", nil)
		ts, model := newToolServer(), purchaseModel()
		run := ungatedRun(ns, model.URL, ts.URL+"/purchase")
		Expect(erin.Create(ctx, run)).To(Succeed(), "an editor may start runs")

		preq := waitRequestOfPolicy(run, policy.Name)
		Expect(preq.Spec.Policy.Generation).To(Equal(policy.Generation))
		Expect(preq.Spec.Approvers.Users).To(ConsistOf("alice"))
		Expect(preq.Spec.RequestedBy).To(Equal("erin"))
		Expect(preq.Spec.ToolCall.Arguments).To(Equal(purchaseArgs))
		Expect(ts.Calls()).To(BeEmpty())

		By("the author can neither edit nor delete the policy, nor approve, nor widen its approvers")
		forbidden(erin.Delete(ctx, policy.DeepCopy()))
		forbidden(erin.Patch(ctx, policy.DeepCopy(), mergePatch(`{"spec":{"tools":["nothing"]}}`)))
		Expect(answerAs(erin, preq, `{"ok":true}`)).NotTo(Succeed())
		Expect(erin.Patch(ctx, getRun(run), mergePatch(`{"spec":{"suspension":{"approvers":{"users":["erin"]}}}}`))).NotTo(Succeed())
		widened := ungatedRun(ns, purchaseModel().URL, ts.URL+"/purchase")
		widened.Name = "buy-widened"
		widened.Spec.Suspension = &toolnexusv1alpha1.SuspensionPolicy{Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"erin"}}}
		Expect(erin.Create(ctx, widened)).To(Succeed())
		own := waitRequestOfPolicy(widened, policy.Name)
		Expect(own.Spec.Approvers.Users).To(ConsistOf("alice"), "a run's approvers never widen a policy's")
		Expect(answerAs(erin, own, `{"ok":true}`)).NotTo(Succeed())
		Consistently(ts.Calls, 2*time.Second).Should(BeEmpty())

		By("alice approves: the call runs once")
		Expect(answerAs(alice, preq, `{"ok":true}`)).To(Succeed())
		Eventually(succeeded(run), eventually).Should(Equal("True/" + toolnexusv1alpha1.ReasonCompleted))
		Expect(ts.Calls()).To(HaveLen(1))
	})

	It("over url, gates the endpoint however the run's author names the tool", func() {
		ns := prodNamespace()
		ts, model := newToolServer(), looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "definitely_not_purchase", Arguments: purchaseArgs}),
			looptest.OpenAIText("bought"))
		createPolicy("purchases-endpoint", func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.Tools, s.When = []string{"*"}, fmt.Sprintf("url.startsWith(%q)", ts.URL+"/purchase")
		})
		run := plainRun(ns, "renamed", model.URL, ts.URL+"/purchase")
		run.Spec.Tools[0].Name = "definitely_not_purchase"
		Expect(erin.Create(ctx, run)).To(Succeed())
		preq := waitRequestOfPolicy(run, "purchases-endpoint")
		Consistently(ts.Calls, time.Second).Should(BeEmpty())
		Expect(answerAs(alice, preq, `{"ok":true}`)).To(Succeed())
		Eventually(succeeded(run), eventually).Should(Equal("True/" + toolnexusv1alpha1.ReasonCompleted))
		Expect(ts.Calls()).To(HaveLen(1))
	})

	It("does not gate a namespace its selector leaves out", func() {
		createPolicy("prod-only", nil)
		ts, model := newToolServer(), purchaseModel()
		run := ungatedRun(newNamespace(), model.URL, ts.URL+"/purchase")
		Expect(erin.Create(ctx, run)).To(Succeed())
		Eventually(succeeded(run), eventually).Should(Equal("True/" + toolnexusv1alpha1.ReasonCompleted))
		Expect(requestsOf(run)).To(BeEmpty())
	})

	It("created while a run is parked, gates that run's call before it runs", func() {
		ns := prodNamespace()
		ts, model := newToolServer(), purchaseModel()
		Expect(admin.Create(ctx, labelledSecret(ns))).To(Succeed())
		run := gatedRun(ns, model.URL, ts)
		Expect(admin.Create(ctx, run)).To(Succeed())
		own := openRequest(run)
		Expect(own.Spec.Policy).To(BeNil())

		policy := createPolicy("incident", func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.Approvers = toolnexusv1alpha1.Approvers{Users: []string{"carol"}}
		})
		approve(own)
		gate := waitRequestOfPolicy(run, policy.Name)
		Expect(gate.Spec.Approvers.Users).To(ConsistOf("carol"))
		Consistently(ts.Calls, time.Second).Should(BeEmpty())
		Expect(answerAs(alice, gate, `{"ok":true}`)).NotTo(Succeed(), "alice approves the run's gate, not the policy's")
		Expect(answerAs(carol, gate, `{"ok":true}`)).To(Succeed())
		Eventually(succeeded(run), eventually).Should(Equal("True/" + toolnexusv1alpha1.ReasonCompleted))
		Expect(ts.Calls()).To(HaveLen(1))
	})

	It("with excludeRequester refuses the approval of the person who started the run (through kubectl)", func() {
		ns := prodNamespace()
		createPolicy("four-eyes", func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.Approvers = toolnexusv1alpha1.Approvers{Users: []string{"alice", "carol"}}
			s.ExcludeRequester = true
		})
		testEnv.Bind(GinkgoT(), "alice-edit-"+ns, "toolnexus-agentrun-editor", testenv.Users("alice")...)
		ts, model := newToolServer(), purchaseModel()
		run := ungatedRun(ns, model.URL, ts.URL+"/purchase")
		run.TypeMeta = metav1.TypeMeta{APIVersion: toolnexusv1alpha1.GroupVersion.String(), Kind: "AgentRun"}
		manifest, err := json.Marshal(run)
		Expect(err).NotTo(HaveOccurred())
		// alice's RoleBinding reaches the authorizer a moment after it is created.
		Eventually(func() string {
			kubectl := exec.Command(testEnv.Kubectl(), "--kubeconfig", aliceUser.Kubeconfig, "create", "-f", "-")
			kubectl.Stdin = strings.NewReader(string(manifest))
			out, _ := kubectl.CombinedOutput()
			return string(out)
		}, eventually).Should(ContainSubstring("created"))

		preq := waitRequestOfPolicy(run, "four-eyes")
		Expect(preq.Spec.RequestedBy).To(Equal("alice"))
		err = answerAs(alice, preq, `{"ok":true}`)
		Expect(err).To(MatchError(ContainSubstring("excludes the requester")))
		Expect(answerAs(carol, preq, `{"ok":true}`)).To(Succeed())
		Eventually(succeeded(run), eventually).Should(Equal("True/" + toolnexusv1alpha1.ReasonCompleted))
		Expect(ts.Calls()).To(HaveLen(1))
	})

	It("escalates once after its step's after, across a manager restart: the added approver may decide, the step's sink is told once", func() {
		var escalated atomic.Int32
		sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
			if strings.Contains(string(body), `"dev.toolnexus.pendingrequest.escalated"`) {
				escalated.Add(1)
			}
			w.WriteHeader(http.StatusAccepted)
		}))
		DeferCleanup(sink.Close)
		ns := prodNamespace()
		createPolicy("escalating", func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.Escalation = []toolnexusv1alpha1.EscalationStep{{
				After:     metav1.Duration{Duration: 4 * time.Second},
				Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"bob"}},
				Notify:    []toolnexusv1alpha1.NotifySink{{Name: "pager", URL: sink.URL}},
			}}
		})
		ts, model := newToolServer(), purchaseModel()
		run := ungatedRun(ns, model.URL, ts.URL+"/purchase")
		Expect(admin.Create(ctx, run)).To(Succeed())
		preq := waitRequestOfPolicy(run, "escalating")
		Expect(answerAs(bob, preq, `{"ok":true}`)).To(MatchError(ContainSubstring("may not answer")), "bob is added only after 4s")
		restartManager()
		// The step applies once, by the manager started after the restart; bob may decide from then.
		Eventually(func() []toolnexusv1alpha1.EscalationRecord { return fresh(preq).Status.Escalations }, eventually).Should(HaveLen(1))
		Eventually(func() error { return answerAs(bob, preq, `{"ok":true}`) }, eventually).Should(Succeed())
		Eventually(succeeded(run), eventually).Should(Equal("True/" + toolnexusv1alpha1.ReasonCompleted))
		Expect(ts.Calls()).To(HaveLen(1))
		Expect(fresh(preq).Status.AnsweredBy).To(Equal("bob"))
		Eventually(escalated.Load, eventually).Should(BeEquivalentTo(1))
		Consistently(escalated.Load, 2*time.Second).Should(BeEquivalentTo(1))
	})

	It("with required: 2 runs the call once two distinct approvers approved; a decline declines", func() {
		ns := prodNamespace()
		createPolicy("two-approvers", func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.Approvers = toolnexusv1alpha1.Approvers{Users: []string{"alice", "carol", "bob"}}
			s.Required = 2
		})
		ts, model := newToolServer(), purchaseModel()
		run := ungatedRun(ns, model.URL, ts.URL+"/purchase")
		Expect(admin.Create(ctx, run)).To(Succeed())
		preq := waitRequestOfPolicy(run, "two-approvers")
		Expect(preq.Spec.Required).To(BeEquivalentTo(2))

		Expect(answerAs(alice, preq, `{"ok":true}`)).NotTo(Succeed(), "a request that needs two takes entries, not an answer")
		Eventually(func() error { return addEntry(alice, "alice", preq, true, "") }, eventually).Should(Succeed())
		Expect(addEntry(alice, "alice", preq, true, "")).NotTo(Succeed(), "the same person twice counts once")
		Expect(addEntry(alice, "carol", preq, true, "")).NotTo(Succeed(), "nobody adds another's entry")
		Expect(addEntry(erin, "erin", preq, true, "")).NotTo(Succeed(), "a non-approver's entry is refused")
		Consistently(func() *toolnexusv1alpha1.Answer { return fresh(preq).Status.Answer }, 2*time.Second).Should(BeNil())
		Expect(ts.Calls()).To(BeEmpty())

		Expect(addEntry(carol, "carol", preq, true, "")).To(Succeed())
		Eventually(succeeded(run), eventually).Should(Equal("True/" + toolnexusv1alpha1.ReasonCompleted))
		Expect(ts.Calls()).To(HaveLen(1))
		got := fresh(preq)
		Expect(got.Status.AnsweredBy).To(Equal(toolnexusv1alpha1.QuorumAnswerer))
		Expect(got.Status.Approvals).To(ConsistOf(HaveField("User", "alice"), HaveField("User", "carol")))

		By("another call: bob's decline declines it, and it never runs")
		ts2, model2 := newToolServer(), purchaseModel()
		declined := ungatedRun(ns, model2.URL, ts2.URL+"/purchase")
		declined.Name = "buy-declined"
		Expect(admin.Create(ctx, declined)).To(Succeed())
		preq2 := waitRequestOfPolicy(declined, "two-approvers")
		Eventually(func() error { return addEntry(alice, "alice", preq2, true, "") }, eventually).Should(Succeed())
		Expect(addEntry(bob, "bob", preq2, false, "not this quarter")).To(Succeed())
		Eventually(succeeded(declined), eventually).Should(Equal("True/" + toolnexusv1alpha1.ReasonCompleted))
		Expect(ts2.Calls()).To(BeEmpty())
		Expect(fresh(preq2).Status.Answer).To(HaveField("OK", false))
	})
})

// fresh reads preq again.
func fresh(preq *toolnexusv1alpha1.PendingRequest) *toolnexusv1alpha1.PendingRequest {
	got := &toolnexusv1alpha1.PendingRequest{}
	Expect(admin.Get(ctx, client.ObjectKeyFromObject(preq), got)).To(Succeed())
	return got
}

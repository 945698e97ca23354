package trust_test

import (
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/runstore"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

const purchaseArgs = `{"amount":5000,"item":"gpu"}`

// gatedRun is a run whose purchase tool needs alice's approval, with the tool's key in a Secret.
func gatedRun(ns, modelURL string, ts *toolstest.Server) *toolnexusv1alpha1.AgentRun {
	return &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Name: "buy", Namespace: ns},
		Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "buy a gpu", AgentSpec: toolnexusv1alpha1.AgentSpec{
			Model: toolnexusv1alpha1.ModelSpec{Name: "m", BaseURL: modelURL},
			Tools: []toolnexusv1alpha1.ToolSpec{{
				Name:       "purchase",
				Parameters: &apiextensionsv1.JSON{Raw: []byte(`{"type":"object"}`)},
				HTTP: &toolnexusv1alpha1.HTTPToolSpec{URL: ts.URL + "/purchase", Headers: []toolnexusv1alpha1.HTTPHeader{{
					Name: "Authorization", ValueFrom: &toolnexusv1alpha1.SecretValueSource{
						SecretKeyRef: toolnexusv1alpha1.SecretKeyReference{Name: "purchasing", Key: "token"}},
				}}},
			}},
			Approvals:  []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"purchase"}}},
			Suspension: &toolnexusv1alpha1.SuspensionPolicy{Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice"}}},
		}},
	}
}

func purchaseModel() *looptest.Server {
	return looptest.New(GinkgoT(),
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "purchase", Arguments: purchaseArgs}),
		looptest.OpenAIText("bought"))
}

func labelledSecret(ns string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "purchasing", Namespace: ns,
			Labels: map[string]string{toolnexusv1alpha1.SecretAccessLabel: "true"}},
		StringData: map[string]string{"token": "t0ken"},
	}
}

// parkedGatedRun starts a gated run as admin in a new namespace and waits for its approval request.
func parkedGatedRun() (string, *toolnexusv1alpha1.AgentRun, *toolnexusv1alpha1.PendingRequest, *toolstest.Server, *looptest.Server) {
	GinkgoHelper()
	ns := newNamespace()
	ts, model := newToolServer(), purchaseModel()
	Expect(admin.Create(ctx, labelledSecret(ns))).To(Succeed())
	run := gatedRun(ns, model.URL, ts)
	Expect(admin.Create(ctx, run)).To(Succeed())
	return ns, run, openRequest(run), ts, model
}

func getRun(run *toolnexusv1alpha1.AgentRun) *toolnexusv1alpha1.AgentRun {
	got := &toolnexusv1alpha1.AgentRun{}
	Expect(admin.Get(ctx, client.ObjectKeyFromObject(run), got)).To(Succeed())
	return got
}

func succeeded(run *toolnexusv1alpha1.AgentRun) func() string {
	return func() string {
		for _, c := range getRun(run).Status.Conditions {
			if c.Type == toolnexusv1alpha1.ConditionSucceeded {
				return string(c.Status) + "/" + c.Reason
			}
		}
		return ""
	}
}

// openRequest waits for the run's single PendingRequest.
func openRequest(run *toolnexusv1alpha1.AgentRun) *toolnexusv1alpha1.PendingRequest {
	var list toolnexusv1alpha1.PendingRequestList
	Eventually(func() []toolnexusv1alpha1.PendingRequest {
		Expect(admin.List(ctx, &list, client.InNamespace(run.Namespace))).To(Succeed())
		return list.Items
	}, eventually).Should(HaveLen(1))
	Eventually(func() toolnexusv1alpha1.RunPhase { return getRun(run).Status.Phase }, eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSuspended))
	return &list.Items[0]
}

func forbidden(err error) {
	GinkgoHelper()
	Expect(apierrors.IsForbidden(err)).To(BeTrue(), "want Forbidden, got %v", err)
}

// approve answers preq ok as alice. Her client discovers the API lazily, and discovery may lag
// behind the CRDs on a busy machine: the first answer is retried until it is accepted.
func approve(preq *toolnexusv1alpha1.PendingRequest) {
	GinkgoHelper()
	Eventually(func() error {
		return alice.Status().Patch(ctx, preq.DeepCopy(), mergePatch(`{"status":{"answer":{"ok":true}}}`))
	}, eventually).Should(Succeed())
}

func mergePatch(p string) client.Patch { return client.RawPatch(types.MergePatchType, []byte(p)) }

var _ = Describe("A namespace editor who is no approver", func() {
	It("cannot make a gated call run, nor change the arguments it runs with", func() {
		ns := newNamespace()
		ts, model := newToolServer(), purchaseModel()
		Expect(erin.Create(ctx, labelledSecret(ns))).To(Succeed())
		run := gatedRun(ns, model.URL, ts)
		Expect(erin.Create(ctx, run)).To(Succeed(), "an editor may start runs")
		preq := openRequest(run)
		Expect(preq.Spec.ToolCall.Arguments).To(Equal(purchaseArgs))

		By("rewriting, deleting and re-creating the run's record")
		head := &toolnexusv1alpha1.AgentRunRecord{}
		Expect(erin.Get(ctx, types.NamespacedName{Namespace: ns, Name: "buy"}, head)).To(Succeed(), "editors may read records")
		forged := head.DeepCopy()
		forged.Data = []byte("forged")
		forbidden(erin.Update(ctx, forged))
		forbidden(erin.Patch(ctx, head.DeepCopy(), mergePatch(`{"metadata":{"labels":{"x":"y"}}}`)))
		forbidden(erin.Delete(ctx, head.DeepCopy()))
		forbidden(erin.Create(ctx, &toolnexusv1alpha1.AgentRunRecord{
			ObjectMeta: metav1.ObjectMeta{Name: "buy.seg-1", Namespace: ns}, Run: head.Run,
			Part: toolnexusv1alpha1.RecordPartSegment, Index: 1, Encoding: toolnexusv1alpha1.RecordEncoding, Data: []byte("x")}))
		forbidden(erin.DeleteAllOf(ctx, &toolnexusv1alpha1.AgentRunRecord{}, client.InNamespace(ns)))
		By("the ConfigMaps where the record used to live are hers, and no longer read")
		Expect(erin.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "buy-transcript", Namespace: ns},
			BinaryData: map[string][]byte{"record.json.gz": []byte("forged")}})).To(Succeed())

		By("answering, creating, deleting and rewriting PendingRequests")
		forbidden(erin.Status().Patch(ctx, preq.DeepCopy(), mergePatch(`{"status":{"answer":{"ok":true}}}`)))
		forbidden(erin.Patch(ctx, preq.DeepCopy(), mergePatch(`{"spec":{"toolCall":{"arguments":"{\"amount\":1,\"item\":\"gpu\"}"}}}`)))
		forbidden(erin.Delete(ctx, preq.DeepCopy()))
		fake := &toolnexusv1alpha1.PendingRequest{
			ObjectMeta: metav1.ObjectMeta{Name: "buy-1-call-2", Namespace: ns, OwnerReferences: preq.OwnerReferences},
			Spec:       *preq.Spec.DeepCopy(),
		}
		forbidden(erin.Create(ctx, fake))

		By("writing the run's status and spec")
		forbidden(erin.Status().Patch(ctx, getRun(run), mergePatch(`{"status":{"transcriptRef":{"name":"buy-transcript"}}}`)))
		err := erin.Patch(ctx, getRun(run), mergePatch(`{"spec":{"prompt":"buy ten gpus"}}`))
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "the spec is immutable: %v", err)

		By("waking the run: a Secret and the run annotated, the manager restarted")
		Expect(erin.Patch(ctx, labelledSecret(ns), mergePatch(`{"metadata":{"annotations":{"wake":"1"}}}`))).To(Succeed())
		Expect(erin.Patch(ctx, getRun(run), mergePatch(`{"metadata":{"annotations":{"wake":"1"}}}`))).To(Succeed())
		restartManager()
		Consistently(ts.Calls, "3s").Should(BeEmpty(), "the gated tool never runs without the approver")
		Expect(getRun(run).Status.Phase).To(Equal(toolnexusv1alpha1.RunPhaseSuspended))

		By("alice, the approver, approves")
		approve(preq)
		Eventually(succeeded(run), eventually).Should(Equal("True/Completed"))
		var shown map[string]any
		Expect(json.Unmarshal([]byte(preq.Spec.ToolCall.Arguments), &shown)).To(Succeed())
		Expect(ts.Calls()).To(ConsistOf(HaveField("Args", shown)), "the tool ran once, with exactly the arguments the approver saw")
	})
})

var _ = Describe("A record that disagrees with its request", func() {
	It("fails the run closed and runs nothing", func() {
		ns, run, preq, ts, _ := parkedGatedRun()

		By("the record's arguments for the call changed (as the manager: a bug or a disk fault)")
		head := &toolnexusv1alpha1.AgentRunRecord{}
		Expect(admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: "buy"}, head)).To(Succeed())
		h := &runstore.Head{}
		_, err := runstore.Decode(head.Data, h, 1<<20)
		Expect(err).NotTo(HaveOccurred())
		Expect(h.State.Calls).To(HaveLen(1))
		Expect(h.State.Calls[0].Args).To(Equal(purchaseArgs))
		h.State.Calls[0].Args = `{"amount":1,"item":"gpu"}`
		head.Data, _, err = runstore.Encode(h)
		Expect(err).NotTo(HaveOccurred())
		Expect(admin.Update(ctx, head)).To(Succeed())

		approve(preq)
		Eventually(succeeded(run), eventually).Should(Equal("False/" + toolnexusv1alpha1.ReasonStateMismatch))
		Expect(getRun(run).Status.Conditions).To(ContainElement(HaveField("Message", ContainSubstring("PendingRequest "+preq.Name+" shows other arguments"))))
		Consistently(ts.Calls, "2s").Should(BeEmpty(), "nothing runs")
	})

	It("fails the run closed when its record is deleted", func() {
		ns, run, preq, ts, model := parkedGatedRun()
		Expect(admin.Delete(ctx, &toolnexusv1alpha1.AgentRunRecord{ObjectMeta: metav1.ObjectMeta{Name: "buy", Namespace: ns}})).To(Succeed())
		approve(preq)
		Eventually(succeeded(run), eventually).Should(Equal("False/" + toolnexusv1alpha1.ReasonStateMismatch))
		Expect(ts.Calls()).To(BeEmpty())
		Expect(model.Requests()).To(HaveLen(1), "the run does not start over")
	})
})

var _ = Describe("A PendingRequest the run did not create", func() {
	It("is never adopted: the run fails closed naming it", func() {
		ns := newNamespace()
		ts, model := newToolServer(), purchaseModel()
		Expect(admin.Create(ctx, labelledSecret(ns))).To(Succeed())
		// Squatting on the name the run's request will have, answered in advance.
		squat := &toolnexusv1alpha1.PendingRequest{
			ObjectMeta: metav1.ObjectMeta{Name: "buy-1-call-1", Namespace: ns},
			Spec: toolnexusv1alpha1.PendingRequestSpec{
				RunRef:   toolnexusv1alpha1.RunReference{Name: "buy"},
				ToolCall: toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "purchase", Arguments: purchaseArgs},
				Request:  toolnexusv1alpha1.Request{ID: "toolguard:call_1", Kind: "approval", Prompt: "Approve the call to purchase?"},
			},
		}
		Expect(admin.Create(ctx, squat)).To(Succeed())
		approve(squat)
		run := gatedRun(ns, model.URL, ts)
		Expect(admin.Create(ctx, run)).To(Succeed())
		Eventually(succeeded(run), eventually).Should(Equal("False/" + toolnexusv1alpha1.ReasonStateMismatch))
		Expect(getRun(run).Status.Conditions).To(ContainElement(HaveField("Message", ContainSubstring("PendingRequest buy-1-call-1 exists but is not the request this run would create"))))
		Consistently(ts.Calls, "2s").Should(BeEmpty())
	})
})

var _ = Describe("Secrets without the access label", func() {
	It("make the run wait, naming the Secret, until the Secret is labelled", func() {
		ns := newNamespace()
		ts, model := newToolServer(), purchaseModel()
		secret := labelledSecret(ns)
		secret.Labels = nil
		Expect(admin.Create(ctx, secret)).To(Succeed())
		run := gatedRun(ns, model.URL, ts)
		Expect(admin.Create(ctx, run)).To(Succeed())
		Eventually(succeeded(run), eventually).Should(Equal("Unknown/" + toolnexusv1alpha1.ReasonSecretNotAllowed))
		Expect(getRun(run).Status.Conditions).To(ContainElement(HaveField("Message",
			ContainSubstring(`Secret "purchasing" is not labelled toolnexus.dev/agentrun-access=true`))))
		Expect(model.Requests()).To(BeEmpty(), "no model request before the Secret may be used")
		Expect(admin.Patch(ctx, secret, mergePatch(`{"metadata":{"labels":{"toolnexus.dev/agentrun-access":"true"}}}`))).To(Succeed())
		openRequest(run)
	})
})

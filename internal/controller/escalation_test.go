package controller_test

import (
	"sync/atomic"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/testenv"
)

// policyRequest is a request of policy prod-changes that alice may approve, with steps, created
// as the manager creates it. Its run does not exist: nothing controls it but the notifier, which
// is all escalation needs (the run's controller looks only at the requests its runs own).
func policyRequest(ns, name string, steps ...toolnexusv1alpha1.EscalationStep) *toolnexusv1alpha1.PendingRequest {
	p := &toolnexusv1alpha1.PendingRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: toolnexusv1alpha1.PendingRequestSpec{
			RunRef:     toolnexusv1alpha1.RunReference{Name: "deploy"},
			ToolCall:   toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "delete_db", Arguments: `{"db":"prod"}`},
			Request:    toolnexusv1alpha1.Request{ID: "gate-1", Kind: "approval", Prompt: "Approve delete_db? (policy prod-changes)"},
			Approvers:  &toolnexusv1alpha1.Approvers{Users: []string{"alice"}},
			Policy:     &toolnexusv1alpha1.PolicyReference{Name: "prod-changes", Generation: 1},
			Required:   1,
			Escalation: steps,
		},
	}
	Expect(k8sClient.Create(ctx, p)).To(Succeed())
	return p
}

func after(d time.Duration) metav1.Duration { return metav1.Duration{Duration: d} }

func escalationsOf(p *toolnexusv1alpha1.PendingRequest) func() []toolnexusv1alpha1.EscalationRecord {
	return func() []toolnexusv1alpha1.EscalationRecord {
		got := &toolnexusv1alpha1.PendingRequest{}
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
		return got.Status.Escalations
	}
}

// secretRef is a sink's reference to key of Secret name.
func secretRef(name, key string) *toolnexusv1alpha1.SecretValueSource {
	return &toolnexusv1alpha1.SecretValueSource{SecretKeyRef: toolnexusv1alpha1.SecretKeyReference{Name: name, Key: key}}
}

// ids are the CloudEvent ids a sink got, in order.
func ids(s *looptest.Server) []string {
	var out []string
	for _, e := range cloudEvents(s) {
		out = append(out, e.ID())
	}
	return out
}

// escalationData decodes an escalated event's data, which carries the policy and the step.
func escalationData(e cloudevent.Event) map[string]any {
	var d map[string]any
	Expect(e.DataAs(&d)).To(Succeed())
	return d
}

var _ = Describe("Escalation", func() {
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
	})

	It("tells each step's sinks once, in order, across a manager restart between the steps, reading a policy's Secrets in the manager's namespace", func() {
		oncall := receiver(accept)
		// The first attempt to "slow" hangs until the manager stops: it is owed across the restart.
		release := make(chan struct{})
		var slowCalls atomic.Int64
		slow := looptest.Serve(GinkgoT(), func(looptest.Request) looptest.Reply {
			if slowCalls.Add(1) == 1 {
				<-release
			}
			return accept(0)
		})
		DeferCleanup(func() {
			select {
			case <-release:
			default:
				close(release)
			}
		})
		pager, decoy := receiver(accept), receiver(accept)
		// The same Secret name in the manager's namespace (the platform's pager) and in the
		// request's (a tenant's, pointing elsewhere): only the first may be read.
		secret := "pager-" + ns
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: testenv.ManagerNamespace},
			StringData: map[string]string{"url": pager.URL + "/page", "token": "Bearer platform"}})).To(Succeed())
		DeferCleanup(func() {
			Expect(k8sClient.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: testenv.ManagerNamespace}})).To(Succeed())
		})
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: ns},
			StringData: map[string]string{"url": decoy.URL + "/page", "token": "Bearer tenant"}})).To(Succeed())

		preq := policyRequest(ns, "deploy-1-call-1",
			toolnexusv1alpha1.EscalationStep{After: after(2 * time.Second), Approvers: &toolnexusv1alpha1.Approvers{Groups: []string{"sre"}},
				Notify: []toolnexusv1alpha1.NotifySink{{Name: "oncall", URL: oncall.URL}, {Name: "slow", URL: slow.URL}}},
			toolnexusv1alpha1.EscalationStep{After: after(4 * time.Second), Approvers: &toolnexusv1alpha1.Approvers{Groups: []string{"sre-leads"}},
				Notify: []toolnexusv1alpha1.NotifySink{{Name: "pager", URLFrom: secretRef(secret, "url"),
					Headers: []toolnexusv1alpha1.HTTPHeader{{Name: "Authorization", ValueFrom: secretRef(secret, "token")}}}}},
		)
		opened := preq.CreationTimestamp.Time

		By("nothing before the first step's time")
		Consistently(func() int { return len(oncall.Requests()) + len(slow.Requests()) }, time.Until(opened.Add(1500*time.Millisecond))).Should(BeZero())

		By("the first step applies: recorded, and its sinks told")
		Eventually(oncall.Requests, eventually).Should(HaveLen(1))
		Eventually(slowCalls.Load, eventually).Should(Equal(int64(1)))
		first := escalationsOf(preq)()
		Expect(first).To(ConsistOf(HaveField("Step", int32(0))))
		Expect(first[0].Time.Time).To(BeTemporally(">=", opened.Add(2*time.Second)))
		e := cloudEvents(oncall)[0]
		Expect(e.Type()).To(Equal("dev.toolnexus.pendingrequest.escalated"))
		Expect(e.ID()).To(Equal(string(preq.UID) + "/escalated/0"))
		Expect(e.Time()).To(BeTemporally("~", first[0].Time.Time, time.Second))
		Expect(escalationData(e)).To(And(
			HaveKeyWithValue("name", preq.Name), HaveKeyWithValue("run", "deploy"), HaveKeyWithValue("policy", "prod-changes"),
			HaveKeyWithValue("toolCall", map[string]any{"name": "delete_db", "arguments": `{"db":"prod"}`}),
			HaveKeyWithValue("approvers", map[string]any{"users": []any{"alice"}, "groups": []any{"sre"}}),
			HaveKeyWithValue("escalation", map[string]any{"step": float64(0), "after": "2s", "approvers": map[string]any{"groups": []any{"sre"}}})))
		Eventually(func() []toolnexusv1alpha1.NotificationRecord { return notificationsOf(preq) }, eventually).Should(ConsistOf(
			And(HaveField("Sink", "oncall"), HaveField("Event", toolnexusv1alpha1.NotifyEscalated), HaveField("Outcome", toolnexusv1alpha1.NotificationDelivered))))
		Expect(pager.Requests()).To(BeEmpty(), "the second step waits for its time")

		By("a restart while one sink of the first step is still owed, before the second step")
		restartManager()
		close(release)
		Eventually(func() []toolnexusv1alpha1.NotificationRecord { return notificationsOf(preq) }, eventually).Should(ContainElement(
			And(HaveField("Sink", "slow"), HaveField("Event", toolnexusv1alpha1.NotifyEscalated), HaveField("Outcome", toolnexusv1alpha1.NotificationDelivered))))
		Expect(ids(slow)).To(HaveEach(string(preq.UID)+"/escalated/0"), "the owed sink got the first step again, with the same id")

		By("the second step applies at its time, through the manager's Secret")
		Eventually(pager.Requests, eventually).Should(HaveLen(1))
		r := pager.Requests()[0]
		Expect(r.Path).To(Equal("/page"))
		Expect(r.Header.Get("Authorization")).To(Equal("Bearer platform"))
		last := cloudEvents(pager)[0]
		Expect(last.ID()).To(Equal(string(preq.UID) + "/escalated/1"))
		Expect(escalationData(last)).To(And(
			HaveKeyWithValue("approvers", map[string]any{"users": []any{"alice"}, "groups": []any{"sre", "sre-leads"}}),
			HaveKeyWithValue("escalation", map[string]any{"step": float64(1), "after": "4s", "approvers": map[string]any{"groups": []any{"sre-leads"}}})))
		Eventually(escalationsOf(preq), eventually).Should(HaveLen(2))
		both := escalationsOf(preq)()
		Expect(both[0]).To(Equal(first[0]), "the first step's record is the one written before the restart")
		Expect(both[1].Step).To(Equal(int32(1)))
		Expect(both[1].Time.Time).To(BeTemporally(">=", opened.Add(4*time.Second)))
		Eventually(notifiedOf(preq), eventually).Should(conditionStatus(metav1.ConditionTrue))

		By("no step repeated, no sink told twice, the tenant's Secret never used")
		Consistently(func() [][]string { return [][]string{ids(oncall), ids(pager)} }, 1500*time.Millisecond).Should(Equal([][]string{
			{string(preq.UID) + "/escalated/0"}, {string(preq.UID) + "/escalated/1"}}))
		Expect(decoy.Requests()).To(BeEmpty())
		Expect(escalationsOf(preq)()).To(HaveLen(2))
		var events eventsv1.EventList
		Expect(k8sClient.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
		var notes []string
		for _, ev := range events.Items {
			if ev.Reason == "Escalated" && ev.Regarding.Name == preq.Name {
				notes = append(notes, ev.Note)
			}
		}
		Expect(notes).To(ConsistOf(
			"Undecided after 2s: applied spec.escalation[0] of policy prod-changes; its approvers may approve too; telling sinks oncall, slow",
			"Undecided after 4s: applied spec.escalation[1] of policy prod-changes; its approvers may approve too; telling sinks pager"))
	})

	It("applies no step once the request is answered, and none to a request answered before its first", func() {
		first, second, early := receiver(accept), receiver(accept), receiver(accept)
		preq := policyRequest(ns, "deploy-1-call-1",
			toolnexusv1alpha1.EscalationStep{After: after(time.Second), Notify: []toolnexusv1alpha1.NotifySink{{Name: "first", URL: first.URL}}},
			toolnexusv1alpha1.EscalationStep{After: after(4 * time.Second), Notify: []toolnexusv1alpha1.NotifySink{{Name: "second", URL: second.URL}}})
		answeredEarly := policyRequest(ns, "deploy-2-call-1",
			toolnexusv1alpha1.EscalationStep{After: after(time.Second), Notify: []toolnexusv1alpha1.NotifySink{{Name: "early", URL: early.URL}}})
		patchRequestStatus(answeredEarly, `{"status":{"answer":{"ok":true},"answeredBy":"alice"}}`)

		Eventually(first.Requests, eventually).Should(HaveLen(1))
		patchRequestStatus(preq, `{"status":{"answer":{"ok":false,"reason":"not today"},"answeredBy":"alice"}}`)
		Consistently(func() int { return len(second.Requests()) + len(early.Requests()) },
			time.Until(preq.CreationTimestamp.Add(5*time.Second))).Should(BeZero())
		Expect(escalationsOf(preq)()).To(ConsistOf(HaveField("Step", int32(0))))
		Expect(escalationsOf(answeredEarly)()).To(BeEmpty())
		Expect(first.Requests()).To(HaveLen(1))
	})

	It("applies on start the steps whose time passed while no manager ran, each once", func() {
		sink := receiver(accept)
		stopManager()
		<-managerDone
		preq := policyRequest(ns, "deploy-1-call-1",
			toolnexusv1alpha1.EscalationStep{After: after(time.Second), Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"bob"}}},
			toolnexusv1alpha1.EscalationStep{After: after(1500 * time.Millisecond), Notify: []toolnexusv1alpha1.NotifySink{{Name: "late", URL: sink.URL}}})
		time.Sleep(time.Until(preq.CreationTimestamp.Add(2500 * time.Millisecond)))
		started := time.Now()
		startManager()

		Eventually(sink.Requests, eventually).Should(HaveLen(1))
		e := cloudEvents(sink)[0]
		Expect(e.ID()).To(Equal(string(preq.UID) + "/escalated/1"))
		Expect(escalationData(e)).To(HaveKeyWithValue("approvers", map[string]any{"users": []any{"alice", "bob"}}))
		got := escalationsOf(preq)()
		Expect(got).To(HaveLen(2))
		Expect([]int32{got[0].Step, got[1].Step}).To(Equal([]int32{0, 1}), "in order, the step without sinks recorded too")
		for _, rec := range got {
			Expect(rec.Time.Time).To(BeTemporally(">=", started.Truncate(time.Second)))
		}
		Consistently(sink.Requests, time.Second).Should(HaveLen(1))
		Expect(escalationsOf(preq)()).To(Equal(got))
	})

	It("never reads a policy's Secret from the request's namespace, and says where it looked", func() {
		decoy := receiver(accept)
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pager", Namespace: ns},
			StringData: map[string]string{"url": decoy.URL}})).To(Succeed())
		preq := policyRequest(ns, "deploy-1-call-1",
			toolnexusv1alpha1.EscalationStep{After: after(time.Second), Notify: []toolnexusv1alpha1.NotifySink{{Name: "pager", URLFrom: secretRef("pager", "url")}}})
		Eventually(notifiedOf(preq), eventually).Should(And(conditionStatus(metav1.ConditionFalse),
			HaveField("Reason", toolnexusv1alpha1.ReasonSecretNotFound),
			HaveField("Message", ContainSubstring(`sink pager gave up on Escalated after 4 attempts: spec.escalation[0].notify[pager].urlFrom: `+
				`Secret "pager" has no key "url" (or does not exist) in the manager's namespace `+testenv.ManagerNamespace))))
		Expect(decoy.Requests()).To(BeEmpty())
		Expect(notificationsOf(preq)).To(ConsistOf(And(HaveField("Sink", "pager"), HaveField("Event", toolnexusv1alpha1.NotifyEscalated),
			HaveField("Outcome", toolnexusv1alpha1.NotificationFailed))))
		Expect(escalationsOf(preq)()).To(HaveLen(1), "a step whose sink gave up is applied all the same")
	})
})

package admission_test

import (
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// ownerReady waits, once, until the manager holds the custom verb "manage" and the
// toolnexus-status-owner policy is enforced.
var ownerReady sync.Once

// The suite waits for the grants and policies it knew of; this waits for the status owner's, which
// every spec that has the manager write phase or conditions relies on.
var _ = BeforeEach(func() {
	ownerReady.Do(func() {
		ns := newNamespace()
		Eventually(func() (bool, error) {
			return mayWriteStatus(managerUser, managerGroups, "manage", ns)
		}).WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(BeTrue(),
			"%s may manage pendingrequests/status", managerUser)
		preq := newRequest(ns, "approval", nil, nil)
		Eventually(func() error {
			return patchStatus(bob, preq, `{"status":{"phase":"Cancelled"}}`)
		}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(MatchError(ContainSubstring("written by the operator only")))
	})
})

// createLike creates a request with preq's spec changed by edit, named name (GenerateName when
// empty), as the controller would.
func createLike(preq *toolnexusv1alpha1.PendingRequest, name string, edit func(*toolnexusv1alpha1.PendingRequestSpec)) *toolnexusv1alpha1.PendingRequest {
	GinkgoHelper()
	created := &toolnexusv1alpha1.PendingRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: preq.Namespace},
		Spec:       *preq.Spec.DeepCopy(),
	}
	if name == "" {
		created.GenerateName = "buy-gpu-1-call-"
	}
	if edit != nil {
		edit(&created.Spec)
	}
	Expect(admin.Create(ctx, created)).To(Succeed())
	return created
}

// expiringAt creates an approval request that expires at t.
func expiringAt(ns string, t time.Time, approvers *toolnexusv1alpha1.Approvers) *toolnexusv1alpha1.PendingRequest {
	GinkgoHelper()
	return createLike(newRequest(ns, "approval", nil, approvers), "", func(s *toolnexusv1alpha1.PendingRequestSpec) {
		s.Request.ExpiresAt = t.Format(time.RFC3339)
	})
}

var _ = Describe("An answer bound to the request its answerer saw", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("refuses the uid of a request deleted and re-created under the same name, saying what to do", func() {
		shown := createLike(newRequest(ns, "approval", nil, approvers), "pay-1-call-0-0", nil)
		Expect(admin.Delete(ctx, shown)).To(Succeed())
		replaced := createLike(shown, "pay-1-call-0-0", func(s *toolnexusv1alpha1.PendingRequestSpec) {
			s.ToolCall.Arguments = `{"amount":100000}`
		})
		Expect(replaced.UID).NotTo(Equal(shown.UID))

		err := answer(alice, replaced, `{"ok":true,"requestUID":"`+string(shown.UID)+`"}`)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("status.answer.requestUID " + string(shown.UID) +
			" is not this PendingRequest's uid " + string(replaced.UID) +
			": the request you were shown was deleted and replaced by another of the same name; " +
			"look at it again (kubectl toolnexus show pay-1-call-0-0 -n " + ns + ") before answering"))
		Expect(stored(replaced).Status.Answer).To(BeNil())

		By("a decline carrying the old uid is refused too")
		Expect(answer(alice, replaced, `{"ok":false,"reason":"declined","requestUID":"`+string(shown.UID)+`"}`)).
			To(MatchError(ContainSubstring("was deleted and replaced")))

		By("the uid of the request as it is now is accepted, and kept with the answer")
		Expect(answer(alice, replaced, `{"ok":true,"requestUID":"`+string(replaced.UID)+`"}`)).To(Succeed())
		expectStamped(replaced, "alice")
		Expect(stored(replaced).Status.Answer.RequestUID).To(Equal(string(replaced.UID)))
	})

	It("accepts an answer without requestUID, as before", func() {
		preq := newRequest(ns, "approval", nil, approvers)
		Expect(answer(alice, preq, `{"ok":true}`)).To(Succeed())
		expectStamped(preq, "alice")
	})

	It("does not let even the manager's expiry carry another request's uid", func() {
		preq := newRequest(ns, "approval", nil, nil)
		err := patchStatus(manager, preq,
			`{"status":{"answer":{"ok":false,"reason":"expired","requestUID":"0c5e1a2b-0000-4000-8000-000000000000"},"answeredBy":"system:expired"}}`)
		Expect(err).To(MatchError(ContainSubstring("was deleted and replaced")))
	})
})

var _ = Describe("Status beyond the answer", func() {
	const resolved = `{"status":{"conditions":[{"type":"Resolved","status":"True","reason":"AnswerConsumed","message":"The run has consumed the answer","lastTransitionTime":"2026-12-01T00:00:00Z"}]}}`
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	DescribeTable("is refused to an answerer who is no approver, naming the field",
		func(patch, field string) {
			preq := newRequest(ns, "approval", nil, approvers)
			err := patchStatus(bob, preq, patch)
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring(field + " is written by the operator only: an answer sets status.answer and nothing else"))
			got := stored(preq)
			Expect(got.Status).To(Equal(toolnexusv1alpha1.PendingRequestStatus{}), "nothing was stored")
		},
		Entry("phase Cancelled", `{"status":{"phase":"Cancelled"}}`, "status.phase"),
		Entry("a Resolved condition", resolved, "status.conditions"),
		Entry("observedGeneration", `{"status":{"observedGeneration":7}}`, "status.observedGeneration"),
		Entry("a notification record", `{"status":{"notifications":[{"sink":"ops","event":"Opened","outcome":"Delivered","attempts":1}]}}`,
			"status.notifications"),
		Entry("an escalation record", `{"status":{"escalations":[{"step":0,"time":"2026-12-01T00:00:00Z"}]}}`, "status.escalations"),
		Entry("an audit record", `{"status":{"audited":["requested"]}}`, "status.audited"),
	)

	It("is refused to an approver too, and to an answer that carries it: nothing of the write is stored", func() {
		preq := newRequest(ns, "approval", nil, approvers)
		err := patchStatus(alice, preq, `{"status":{"answer":{"ok":true},"phase":"Answered","observedGeneration":3}}`)
		Expect(err).To(MatchError(ContainSubstring("status.observedGeneration, status.phase are written by the operator only")))
		Expect(stored(preq).Status.Answer).To(BeNil())
	})

	It("is refused when removed or rewritten after the manager wrote it", func() {
		preq := newRequest(ns, "approval", nil, nil)
		Expect(patchStatus(manager, preq, `{"status":{"phase":"Waiting","observedGeneration":1}}`)).To(Succeed())
		for _, patch := range []string{`{"status":{"phase":null}}`, `{"status":{"phase":"Expired"}}`, `{"status":{"observedGeneration":2}}`} {
			Expect(patchStatus(bob, preq, patch)).To(MatchError(ContainSubstring("is written by the operator only")), patch)
		}
		got := stored(preq)
		Expect(got.Status.Phase).To(Equal(toolnexusv1alpha1.RequestPhaseWaiting))
		Expect(got.Status.ObservedGeneration).To(Equal(int64(1)))
	})

	It("may be sent back unchanged with an answer (a read-modify-write PUT)", func() {
		preq := newRequest(ns, "approval", nil, nil)
		Expect(patchStatus(manager, preq, `{"status":{"phase":"Waiting","observedGeneration":1}}`)).To(Succeed())
		Expect(patchStatus(manager, preq, resolved)).To(Succeed())
		read := stored(preq)
		read.Status.Answer = &toolnexusv1alpha1.Answer{OK: true}
		Expect(bob.Status().Update(ctx, read)).To(Succeed())
		expectStamped(preq, "bob")
		Expect(stored(preq).Status.Phase).To(Equal(toolnexusv1alpha1.RequestPhaseWaiting))
	})

	It("is written by the manager: phase, conditions and observedGeneration, before and after the answer", func() {
		preq := newRequest(ns, "approval", nil, approvers)
		Expect(patchStatus(manager, preq, `{"status":{"phase":"Waiting","observedGeneration":1}}`)).To(Succeed())
		Expect(answer(alice, preq, `{"ok":true}`)).To(Succeed())
		Expect(patchStatus(manager, preq, `{"status":{"phase":"Answered","observedGeneration":2}}`)).To(Succeed())
		Expect(patchStatus(manager, preq, resolved)).To(Succeed())
		got := stored(preq)
		Expect(got.Status.Phase).To(Equal(toolnexusv1alpha1.RequestPhaseAnswered))
		Expect(got.Status.ObservedGeneration).To(Equal(int64(2)))
		Expect(got.Status.Conditions).To(ConsistOf(HaveField("Type", toolnexusv1alpha1.ConditionResolved)))
		expectStamped(preq, "alice")
	})
})

var _ = Describe("Expiry is authoritative", func() {
	const expiry = `{"status":{"answer":{"ok":false,"reason":"expired"},"answeredBy":"system:expired"}}`
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("refuses an approval, and a decline, stamped after expiresAt, saying when it expired", func() {
		at := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
		preq := expiringAt(ns, at, approvers)
		err := answer(alice, preq, `{"ok":true}`)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("this request expired at " + at.Format(time.RFC3339) + "; it can no longer be answered"))
		Expect(answer(alice, preq, `{"ok":false,"reason":"declined"}`)).To(MatchError(ContainSubstring("it can no longer be answered")))
		Expect(stored(preq).Status.Answer).To(BeNil())
	})

	It("compares instants, not strings: an expiresAt with an offset", func() {
		zone := time.FixedZone("", -5*3600) // its wall clock is behind UTC: compared as text it would look expired
		past := createLike(newRequest(ns, "approval", nil, nil), "", func(s *toolnexusv1alpha1.PendingRequestSpec) {
			s.Request.ExpiresAt = time.Now().Add(-time.Minute).In(zone).Format(time.RFC3339)
		})
		Expect(answer(bob, past, `{"ok":true}`)).To(MatchError(ContainSubstring("it can no longer be answered")))
		future := createLike(newRequest(ns, "approval", nil, nil), "", func(s *toolnexusv1alpha1.PendingRequestSpec) {
			s.Request.ExpiresAt = time.Now().Add(time.Hour).In(zone).Format(time.RFC3339)
		})
		Expect(answer(bob, future, `{"ok":true}`)).To(Succeed())
	})

	It("accepts an answer before expiresAt", func() {
		preq := expiringAt(ns, time.Now().Add(time.Hour), approvers)
		Expect(answer(alice, preq, `{"ok":true}`)).To(Succeed())
		expectStamped(preq, "alice")
	})

	It("accepts the manager's expiry after expiresAt", func() {
		preq := expiringAt(ns, time.Now().Add(-time.Minute), approvers)
		Expect(patchStatus(manager, preq, expiry)).To(Succeed())
		expectStamped(preq, "system:expired")
		Expect(stored(preq).Status.Answer.Reason).To(Equal("expired"))
	})

	It("exempts nobody else's expiry: bob's is stamped as his and refused as late", func() {
		preq := expiringAt(ns, time.Now().Add(-time.Minute), nil)
		Expect(patchStatus(bob, preq, expiry)).To(MatchError(ContainSubstring("it can no longer be answered")))
		Expect(stored(preq).Status.Answer).To(BeNil())
	})

	It("leaves a request without expiresAt answerable at any time", func() {
		preq := newRequest(ns, "approval", nil, nil)
		Expect(preq.Spec.Request.ExpiresAt).To(BeEmpty())
		Expect(answer(bob, preq, `{"ok":true}`)).To(Succeed())
	})
})

var _ = Describe("The built-in edit role and ServiceAccounts", func() {
	It("can impersonate the namespace's ServiceAccounts, so an answering bot there answers for every editor", func() {
		By("edit aggregates system:aggregate-to-edit, which may impersonate serviceaccounts")
		edit := &rbacv1.ClusterRole{}
		Expect(admin.Get(ctx, client.ObjectKey{Name: "edit"}, edit)).To(Succeed())
		Expect(edit.AggregationRule).NotTo(BeNil())
		Expect(edit.AggregationRule.ClusterRoleSelectors).To(ContainElement(HaveField("MatchLabels",
			HaveKeyWithValue("rbac.authorization.k8s.io/aggregate-to-edit", "true"))))
		aggregated := &rbacv1.ClusterRole{}
		Expect(admin.Get(ctx, client.ObjectKey{Name: "system:aggregate-to-edit"}, aggregated)).To(Succeed())
		Expect(aggregated.Labels).To(HaveKeyWithValue("rbac.authorization.k8s.io/aggregate-to-edit", "true"))
		Expect(aggregated.Rules).To(ContainElement(SatisfyAll(
			HaveField("Verbs", ContainElement("impersonate")),
			HaveField("APIGroups", ContainElement("")),
			HaveField("Resources", ContainElement("serviceaccounts")))))

		By("frank edits the namespace (envtest runs no aggregation: he gets what edit aggregates); its bot may answer")
		ns := newNamespace()
		Expect(admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "answer-bot", Namespace: ns}})).To(Succeed())
		bot := "system:serviceaccount:" + ns + ":answer-bot"
		for _, b := range []*rbacv1.RoleBinding{
			{ObjectMeta: metav1.ObjectMeta{Name: "frank-edits", Namespace: ns},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:aggregate-to-edit"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "frank"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "bot-answers", Namespace: ns},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "toolnexus-answerer"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "answer-bot", Namespace: ns}}},
		} {
			Expect(admin.Create(ctx, b)).To(Succeed())
		}
		frank, err := env.AddUser(envtest.User{Name: "frank"}, cfg)
		Expect(err).NotTo(HaveOccurred())
		asFrank, err := client.New(frank.Config(), client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		impersonating := frank.Config()
		impersonating.Impersonate.UserName = bot
		asBot, err := client.New(impersonating, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())

		preq := newRequest(ns, "approval", nil, nil)
		Expect(answer(asFrank, preq.DeepCopy(), `{"ok":true}`)).To(MatchError(ContainSubstring(
			`User "frank" cannot patch resource "pendingrequests/status"`)), "frank himself may not answer")
		Eventually(func() error { return answer(asBot, preq.DeepCopy(), `{"ok":true}`) }).WithTimeout(time.Minute).
			Should(Succeed(), "frank answers as the bot")
		expectStamped(preq, bot)
	})
})

package admission_test

import (
	"encoding/json"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// newNamespace creates a namespace for one test and returns its name.
func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "admission-"}}
	Expect(admin.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// newRequest creates a PendingRequest of kind, with request data and approvers (both optional),
// as the controller would.
func newRequest(ns, kind string, data map[string]any, approvers *toolnexusv1alpha1.Approvers) *toolnexusv1alpha1.PendingRequest {
	GinkgoHelper()
	return newRequestWith(ns, func(s *toolnexusv1alpha1.PendingRequestSpec) {
		s.Request.Kind, s.Approvers = kind, approvers
		if data != nil {
			raw, err := json.Marshal(data)
			Expect(err).NotTo(HaveOccurred())
			s.Request.Data = &apiextensionsv1.JSON{Raw: raw}
		}
	})
}

// newRequestWith creates an approval PendingRequest as the controller would, after edit (when
// not nil) changed its spec.
func newRequestWith(ns string, edit func(*toolnexusv1alpha1.PendingRequestSpec)) *toolnexusv1alpha1.PendingRequest {
	GinkgoHelper()
	preq := &toolnexusv1alpha1.PendingRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "buy-gpu-1-call-", Namespace: ns},
		Spec: toolnexusv1alpha1.PendingRequestSpec{
			RunRef:   toolnexusv1alpha1.RunReference{Name: "buy-gpu"},
			ToolCall: toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "approve_purchase", Arguments: `{"item":"gpu"}`},
			Request:  toolnexusv1alpha1.Request{ID: "pnd-lx2k1-1", Kind: "approval", Prompt: "Approve purchase of gpu?"},
		},
	}
	if edit != nil {
		edit(&preq.Spec)
	}
	Expect(admin.Create(ctx, preq)).To(Succeed())
	return preq
}

// patchStatus merge-patches the status subresource as c's user, the way
// `kubectl patch preq NAME --subresource=status --type=merge -p PATCH` does; on success preq holds
// what the API server stored.
func patchStatus(c client.Client, preq *toolnexusv1alpha1.PendingRequest, patch string) error {
	return c.Status().Patch(ctx, preq, client.RawPatch(types.MergePatchType, []byte(patch)))
}

// answer sets status.answer to the JSON answer as c's user.
func answer(c client.Client, preq *toolnexusv1alpha1.PendingRequest, answer string) error {
	return patchStatus(c, preq, fmt.Sprintf(`{"status":{"answer":%s}}`, answer))
}

// stored reads preq back as the admin.
func stored(preq *toolnexusv1alpha1.PendingRequest) *toolnexusv1alpha1.PendingRequest {
	got := &toolnexusv1alpha1.PendingRequest{}
	Expect(admin.Get(ctx, client.ObjectKeyFromObject(preq), got)).To(Succeed())
	return got
}

// expectStamped checks that preq was answered by user at about now (answeredAt has seconds).
func expectStamped(preq *toolnexusv1alpha1.PendingRequest, user string) {
	got := stored(preq)
	ExpectWithOffset(1, got.Status.Answer).NotTo(BeNil())
	ExpectWithOffset(1, got.Status.AnsweredBy).To(Equal(user))
	ExpectWithOffset(1, got.Status.AnsweredAt).NotTo(BeNil())
	ExpectWithOffset(1, got.Status.AnsweredAt.Time).To(BeTemporally("~", time.Now(), 10*time.Second))
}

var approvers = &toolnexusv1alpha1.Approvers{Users: []string{"alice"}, Groups: []string{approverGroup}}

const refusedBob = "user bob may not answer this request: spec.approvers allows only users alice and members of groups purchasing-approvers"

var _ = Describe("Who may answer", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("lets a user listed in spec.approvers.users answer", func() {
		preq := newRequest(ns, "approval", nil, approvers)
		Expect(answer(alice, preq, `{"ok":true}`)).To(Succeed())
		expectStamped(preq, "alice")
	})

	It("refuses a user RBAC allows but spec.approvers does not list, saying who may", func() {
		preq := newRequest(ns, "approval", nil, approvers)
		err := answer(bob, preq, `{"ok":true}`)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring(refusedBob))
		Expect(stored(preq).Status.Answer).To(BeNil())
	})

	It("refuses a decline from a user spec.approvers does not list, too", func() {
		preq := newRequest(ns, "approval", nil, approvers)
		err := answer(bob, preq, `{"ok":false,"reason":"declined"}`)
		Expect(err).To(MatchError(ContainSubstring(refusedBob)))
	})

	It("lets a member of a group in spec.approvers.groups answer", func() {
		preq := newRequest(ns, "approval", nil, &toolnexusv1alpha1.Approvers{Groups: []string{approverGroup}})
		Expect(answer(carol, preq, `{"ok":false,"reason":"declined"}`)).To(Succeed())
		expectStamped(preq, "carol")
	})

	It("leaves the decision to RBAC when a request has no approvers", func() {
		for _, none := range []*toolnexusv1alpha1.Approvers{nil, {}} {
			preq := newRequest(ns, "approval", nil, none)
			Expect(answer(bob, preq, `{"ok":true}`)).To(Succeed())
			expectStamped(preq, "bob")
		}
	})

	It("refuses a user without RBAC (403), even one spec.approvers lists", func() {
		for _, listed := range []*toolnexusv1alpha1.Approvers{nil, {Users: []string{"dave"}}} {
			preq := newRequest(ns, "approval", nil, listed)
			err := answer(dave, preq, `{"ok":true}`)
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring(`User "dave" cannot patch resource "pendingrequests/status"`))
		}
	})

	It("does not let an AgentRun editor answer: answering is a role of its own", func() {
		Expect(admin.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "erin-edits-runs", Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "toolnexus-agentrun-editor"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "erin"}},
		})).To(Succeed())
		preq := newRequest(ns, "approval", nil, nil)
		Eventually(func() error { // RBAC takes a moment to see a new binding
			return erin.Get(ctx, client.ObjectKeyFromObject(preq), &toolnexusv1alpha1.PendingRequest{})
		}).Should(Succeed())
		err := answer(erin, preq, `{"ok":true}`)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring(`User "erin" cannot patch resource "pendingrequests/status"`))
	})
})

var _ = Describe("Who answered, and when", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("overwrites a forged answeredBy and answeredAt with the real user and the server's time", func() {
		preq := newRequest(ns, "approval", nil, approvers)
		Expect(patchStatus(alice, preq,
			`{"status":{"answer":{"ok":true},"answeredBy":"carol","answeredAt":"2020-01-01T00:00:00Z"}}`)).To(Succeed())
		expectStamped(preq, "alice")
	})

	It("stamps an answer given with a full status update (PUT), not only with a patch", func() {
		preq := newRequest(ns, "approval", nil, nil)
		preq.Status.Answer = &toolnexusv1alpha1.Answer{OK: true}
		preq.Status.AnsweredBy = "somebody-else"
		Expect(bob.Status().Update(ctx, preq)).To(Succeed())
		expectStamped(preq, "bob")
	})

	It("refuses changing or removing answeredBy and answeredAt afterwards, also to the answerer and an admin", func() {
		preq := newRequest(ns, "approval", nil, nil)
		Expect(answer(bob, preq, `{"ok":true}`)).To(Succeed())
		for _, c := range []client.Client{bob, admin} {
			for _, patch := range []string{
				`{"status":{"answeredBy":"alice"}}`,
				`{"status":{"answeredBy":null}}`,
				`{"status":{"answeredAt":"2020-01-01T00:00:00Z"}}`,
				`{"status":{"answeredAt":null}}`,
			} {
				Expect(patchStatus(c, preq, patch)).To(MatchError(ContainSubstring(
					"status.answeredBy and status.answeredAt record who answered and when")), patch)
			}
		}
		expectStamped(preq, "bob")
	})

	It("refuses answeredBy on a request that has no answer", func() {
		preq := newRequest(ns, "approval", nil, nil)
		Expect(patchStatus(admin, preq, `{"status":{"answeredBy":"alice"}}`)).To(MatchError(ContainSubstring(
			"status.answeredBy and status.answeredAt record who answered and when")))
	})

	It("still refuses changing or removing the answer (CRD validation)", func() {
		preq := newRequest(ns, "approval", nil, nil)
		Expect(answer(bob, preq, `{"ok":true}`)).To(Succeed())
		Expect(answer(bob, preq, `{"ok":false,"reason":"declined"}`)).To(MatchError(ContainSubstring(
			"status.answer cannot be changed or removed once set")))
		Expect(patchStatus(admin, preq, `{"status":{"answer":null}}`)).To(MatchError(ContainSubstring(
			"status.answer cannot be changed or removed once set")))
	})

	It("lets the manager write the rest of the status after the answer", func() {
		preq := newRequest(ns, "approval", nil, approvers)
		Expect(answer(alice, preq, `{"ok":true}`)).To(Succeed())
		Expect(patchStatus(manager, preq, `{"status":{"phase":"Answered"}}`)).To(Succeed())
		Expect(stored(preq).Status.Phase).To(Equal(toolnexusv1alpha1.RequestPhaseAnswered))
		expectStamped(preq, "alice")
	})

	It("ignores an answer sent on create or through the main resource (status subresource)", func() {
		preq := newRequest(ns, "approval", nil, nil)
		Expect(stored(preq).Status.Answer).To(BeNil())
		Expect(admin.Patch(ctx, preq, client.RawPatch(types.MergePatchType,
			[]byte(`{"status":{"answer":{"ok":true},"answeredBy":"alice"}}`)))).To(Succeed())
		got := stored(preq)
		Expect(got.Status.Answer).To(BeNil())
		Expect(got.Status.AnsweredBy).To(BeEmpty())

		created := &toolnexusv1alpha1.PendingRequest{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "with-status-", Namespace: ns},
			Spec:       preq.Spec,
			Status:     toolnexusv1alpha1.PendingRequestStatus{Answer: &toolnexusv1alpha1.Answer{OK: true}, AnsweredBy: "alice"},
		}
		Expect(admin.Create(ctx, created)).To(Succeed())
		got = stored(created)
		Expect(got.Status.Answer).To(BeNil())
		Expect(got.Status.AnsweredBy).To(BeEmpty())
	})
})

var _ = Describe("What an answer must carry", func() {
	schema := map[string]any{"schema": map[string]any{
		"type":       "object",
		"properties": map[string]any{"region": map[string]any{"type": "string"}, "size": map[string]any{"type": "integer"}},
		"required":   []any{"region", "size"},
	}}
	optionalForm := map[string]any{"schema": map[string]any{
		"type": "object", "properties": map[string]any{"note": map[string]any{"type": "string"}},
	}}

	DescribeTable("ok: true, by request kind",
		func(kind string, data map[string]any, answerJSON, wantMessage string) {
			preq := newRequest(newNamespace(), kind, data, nil)
			err := answer(bob, preq, answerJSON)
			if wantMessage == "" {
				Expect(err).NotTo(HaveOccurred())
				expectStamped(preq, "bob")
				return
			}
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring(wantMessage))
			Expect(stored(preq).Status.Answer).To(BeNil())
		},
		Entry("input without data is refused", "input", nil, `{"ok":true}`,
			"an input request needs status.answer.data.output (a string) when ok is true"),
		Entry("input with a non-string output is refused", "input", nil, `{"ok":true,"data":{"output":42}}`,
			"an input request needs status.answer.data.output (a string) when ok is true"),
		Entry("input with data.output", "input", nil, `{"ok":true,"data":{"output":"staging"}}`, ""),
		Entry("input declined without data", "input", nil, `{"ok":false,"reason":"declined"}`, ""),
		Entry("form input missing a required field is refused", "input", schema, `{"ok":true,"data":{"region":"eu"}}`,
			"status.answer.data must be an object holding its required fields (region, size); missing: size"),
		Entry("form input without data is refused", "input", schema, `{"ok":true}`, "missing: region, size"),
		Entry("form input with the required fields", "input", schema, `{"ok":true,"data":{"region":"eu","size":2}}`, ""),
		Entry("form input with no required fields and empty data", "input", optionalForm, `{"ok":true,"data":{}}`, ""),
		Entry("question with empty data is refused", "question", nil, `{"ok":true,"data":{}}`,
			"a question request needs a non-empty status.answer.data object when ok is true"),
		Entry("question without data is refused", "question", nil, `{"ok":true}`,
			"a question request needs a non-empty status.answer.data object when ok is true"),
		Entry("question with answers", "question", nil, `{"ok":true,"data":{"output":"yes"}}`, ""),
		Entry("tool_call without results or output is refused", "tool_call", nil, `{"ok":true,"data":{"x":1}}`,
			"a tool_call request needs status.answer.data.results (an array) or status.answer.data.output"),
		Entry("tool_call with a null output is refused", "tool_call", nil, `{"ok":true,"data":{"output":null}}`,
			"a tool_call request needs status.answer.data.results (an array) or status.answer.data.output"),
		Entry("tool_call with results that are no array is refused", "tool_call", nil, `{"ok":true,"data":{"results":"done"}}`,
			"a tool_call request needs status.answer.data.results (an array) or status.answer.data.output"),
		Entry("tool_call with results", "tool_call", nil, `{"ok":true,"data":{"results":[{"id":"c1","output":"done"}]}}`, ""),
		Entry("tool_call with output", "tool_call", nil, `{"ok":true,"data":{"output":"done"}}`, ""),
		Entry("approval without data", "approval", nil, `{"ok":true}`, ""),
		Entry("authorization without data", "authorization", nil, `{"ok":true}`, ""),
	)
})

var _ = Describe("Expiry", func() {
	const expired = `{"status":{"answer":{"ok":false,"reason":"expired"},"answeredBy":"system:expired"}}`
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("lets the manager record an expiry as system:expired on a request only others may answer", func() {
		preq := newRequest(ns, "input", nil, approvers)
		Expect(patchStatus(manager, preq, expired)).To(Succeed())
		expectStamped(preq, "system:expired")
		Expect(stored(preq).Status.Answer.Reason).To(Equal("expired"))
	})

	It("gives nobody else system:expired: bob's answeredBy is overwritten with bob", func() {
		preq := newRequest(ns, "input", nil, nil)
		Expect(patchStatus(bob, preq, expired)).To(Succeed())
		expectStamped(preq, "bob")
	})

	It("does not let anybody else expire a request only others may answer", func() {
		preq := newRequest(ns, "input", nil, approvers)
		Expect(patchStatus(bob, preq, expired)).To(MatchError(ContainSubstring(refusedBob)))
	})

	It("exempts only the expiry: the manager cannot approve, or expire under its own name, a request only others may answer", func() {
		for _, patch := range []string{
			`{"status":{"answer":{"ok":true}}}`,
			`{"status":{"answer":{"ok":false,"reason":"expired"}}}`,
			`{"status":{"answer":{"ok":false,"reason":"declined"},"answeredBy":"system:expired"}}`,
		} {
			preq := newRequest(ns, "approval", nil, approvers)
			Expect(patchStatus(manager, preq, patch)).To(MatchError(ContainSubstring(
				"user "+managerUser+" may not answer this request")), patch)
		}
	})
})

var _ = Describe("A completed login", func() {
	const signedIn = `{"status":{"answer":{"ok":true},"answeredBy":"system:oauth"}}`
	var ns string
	BeforeEach(func() { ns = newNamespace() })
	login := func(approvers *toolnexusv1alpha1.Approvers) *toolnexusv1alpha1.PendingRequest {
		return newRequestWith(ns, func(s *toolnexusv1alpha1.PendingRequestSpec) {
			s.Request.Kind, s.Request.ID, s.Request.URL, s.Approvers = "authorization", "oauth:3f2a", "https://as.example.com/authorize?state=x", approvers
		})
	}

	It("lets the manager answer the operator's own login as system:oauth, on a request only others may answer", func() {
		preq := login(approvers)
		Expect(patchStatus(manager, preq, signedIn)).To(Succeed())
		expectStamped(preq, "system:oauth")
	})

	It("gives nobody else system:oauth: bob's answeredBy is overwritten with bob", func() {
		preq := login(nil)
		Expect(patchStatus(bob, preq, signedIn)).To(Succeed())
		expectStamped(preq, "bob")
	})

	It("does not let the manager answer as system:oauth a request that is no login of its own, or decline as it", func() {
		for _, edit := range []func(*toolnexusv1alpha1.PendingRequestSpec){
			func(s *toolnexusv1alpha1.PendingRequestSpec) {
				s.Request.Kind = "approval"
				s.Request.ID = "oauth:3f2a"
			},
			func(s *toolnexusv1alpha1.PendingRequestSpec) {
				s.Request.Kind, s.Request.URL = "authorization", "https://tool.example.com/login" // a tool's own login
			},
		} {
			preq := newRequestWith(ns, func(s *toolnexusv1alpha1.PendingRequestSpec) { edit(s); s.Approvers = approvers })
			Expect(patchStatus(manager, preq, signedIn)).To(MatchError(ContainSubstring("user " + managerUser + " may not answer this request")))
		}
		preq := login(approvers)
		Expect(patchStatus(manager, preq, `{"status":{"answer":{"ok":false,"reason":"declined"},"answeredBy":"system:oauth"}}`)).
			To(MatchError(ContainSubstring("user " + managerUser + " may not answer this request")))
	})

	It("refuses the login's answer after the request expired", func() {
		at := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
		preq := newRequestWith(ns, func(s *toolnexusv1alpha1.PendingRequestSpec) {
			s.Request.Kind, s.Request.ID, s.Request.ExpiresAt = "authorization", "oauth:3f2a", at.Format(time.RFC3339)
		})
		Expect(patchStatus(manager, preq, signedIn)).To(MatchError(ContainSubstring("this request expired at " + at.Format(time.RFC3339))))
	})
})

var _ = Describe("Notification records", func() {
	const (
		record   = `{"status":{"notifications":[{"sink":"ops","event":"Opened","outcome":"Delivered","attempts":1}]}}`
		notified = `{"status":{"conditions":[{"type":"Notified","status":"True","reason":"Delivered","message":"Every sink took every event so far","lastTransitionTime":"2026-12-01T00:00:00Z"}]}}`
	)
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("refuses an answerer who marks an event delivered, or forges the Notified condition", func() {
		preq := newRequest(ns, "approval", nil, nil)
		Eventually(func() error { return patchStatus(alice, preq, record) }).WithTimeout(time.Minute).
			Should(MatchError(ContainSubstring("status.notifications is written by the operator only")))
		Expect(patchStatus(alice, preq, notified)).To(MatchError(ContainSubstring("status.conditions is written by the operator only")))
		Expect(stored(preq).Status.Notifications).To(BeEmpty())
		Expect(stored(preq).Status.Conditions).To(BeEmpty())
	})

	It("lets the manager record deliveries, and an answerer answer without touching them", func() {
		preq := newRequest(ns, "approval", nil, nil)
		Expect(patchStatus(manager, preq, record)).To(Succeed())
		Expect(patchStatus(manager, preq, notified)).To(Succeed())
		Expect(answer(alice, preq, `{"ok":true}`)).To(Succeed())
		got := stored(preq)
		Expect(got.Status.Notifications).To(ConsistOf(HaveField("Sink", "ops")))
		Expect(got.Status.Conditions).To(ConsistOf(HaveField("Type", toolnexusv1alpha1.ConditionNotified)))

		By("but not remove or rewrite them")
		Expect(patchStatus(alice, preq, `{"status":{"notifications":null}}`)).To(MatchError(ContainSubstring("status.notifications is written by the operator only")))
		Expect(patchStatus(alice, preq, `{"status":{"conditions":[]}}`)).To(MatchError(ContainSubstring("status.conditions is written by the operator only")))
	})
})

package controller_test

import (
	"encoding/json"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller"
	"github.com/toolnexus/operator/internal/controller/approval"
	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/internal/testenv/operator"
)

// This suite's control plane has no admission policies (config/policies), so nothing stamps an
// entry's at here: the approvers send it, as the API server would stamp it. test/admission runs the
// room behind the policies.
var _ = Describe("The quorum room", Ordered, func() {
	var alice, carol client.Client

	BeforeAll(func() {
		By("running the manager as its ServiceAccount, with the RBAC of config/rbac")
		Expect(testenv.Install(ctx, k8sClient, "rbac")).To(Succeed())
		testEnv.Bind(GinkgoT(), "quorum-answerers", "toolnexus-answerer", testenv.Users("alice", "carol")...)
		testEnv.WaitAllowed(GinkgoT(), testenv.ManagerUser,
			testenv.Access("watch", "pendingrequests"), testenv.Access("patch", "pendingrequests/status"),
			testenv.Access("quorum", "pendingrequests/status"))
		for _, user := range []string{"alice", "carol"} {
			testEnv.WaitAllowed(GinkgoT(), envtest.User{Name: user}, testenv.Access("patch", "pendingrequests/status"))
		}
		alice, carol = testEnv.User(GinkgoT(), "alice").Client, testEnv.User(GinkgoT(), "carol").Client

		stopManager()
		asServiceAccount := operator.New(GinkgoT(), testEnv.Manager(GinkgoT()).Config, func() controller.Options {
			return controller.Options{Registry: prometheus.NewRegistry()}
		})
		asServiceAccount.Start(GinkgoT())
		DeferCleanup(func() {
			Expect(asServiceAccount.Stop()).To(Succeed())
			startManager()
		})
	})

	// quorumRequest is a request two approvers must approve, as an ApprovalPolicy's gate is, that
	// expires at expiresAt ("" never). It belongs to no run (no owner), so the run controller
	// leaves it alone.
	quorumRequest := func(ns, expiresAt string) *toolnexusv1alpha1.PendingRequest {
		preq := &toolnexusv1alpha1.PendingRequest{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "prod-delete-1-call-", Namespace: ns},
			Spec: toolnexusv1alpha1.PendingRequestSpec{
				RunRef:    toolnexusv1alpha1.RunReference{Name: "no-such-run"},
				ToolCall:  toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "delete_db", Arguments: `{"db":"orders"}`},
				Request:   toolnexusv1alpha1.Request{ID: "pnd-quorum-1", Kind: "approval", Prompt: "Delete orders?", ExpiresAt: expiresAt},
				Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice", "carol"}},
				Policy:    &toolnexusv1alpha1.PolicyReference{Name: "prod-changes", Generation: 1},
				Required:  2,
			},
		}
		Expect(k8sClient.Create(ctx, preq)).To(Succeed())
		return preq
	}
	// addEntry adds user's entry as c, stamped now, the way a client does with a merge patch (which
	// replaces the list: it carries the entries there and the new one).
	addEntry := func(c client.Client, preq *toolnexusv1alpha1.PendingRequest, user string, ok bool, reason string) toolnexusv1alpha1.ApprovalEntry {
		e := toolnexusv1alpha1.ApprovalEntry{User: user, OK: ok, Reason: reason, At: &metav1.Time{Time: time.Now().Truncate(time.Second)}}
		read := &toolnexusv1alpha1.PendingRequest{}
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(preq), read)).To(Succeed())
		raw, err := json.Marshal(map[string]any{"status": map[string]any{"approvals": append(read.Status.Approvals, e)}})
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Status().Patch(ctx, read, client.RawPatch(types.MergePatchType, raw))).To(Succeed())
		return e
	}
	stored := func(preq *toolnexusv1alpha1.PendingRequest) *toolnexusv1alpha1.PendingRequest {
		got := &toolnexusv1alpha1.PendingRequest{}
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(preq), got)).To(Succeed())
		return got
	}
	answerOf := func(preq *toolnexusv1alpha1.PendingRequest) func() *toolnexusv1alpha1.Answer {
		return func() *toolnexusv1alpha1.Answer { return stored(preq).Status.Answer }
	}
	approvalsIn := func(a *toolnexusv1alpha1.Answer) []toolnexusv1alpha1.ApprovalEntry {
		var data struct {
			Approvals []toolnexusv1alpha1.ApprovalEntry `json:"approvals"`
		}
		Expect(a.Data).NotTo(BeNil())
		Expect(json.Unmarshal(a.Data.Raw, &data)).To(Succeed())
		return data.Approvals
	}
	eventNotesOf := func(preq *toolnexusv1alpha1.PendingRequest, reason string) func() []string {
		return func() []string {
			var list eventsv1.EventList
			Expect(k8sClient.List(ctx, &list, client.InNamespace(preq.Namespace))).To(Succeed())
			var out []string
			for _, e := range list.Items {
				if e.Regarding.Name == preq.Name && e.Reason == reason {
					out = append(out, e.Note)
				}
			}
			return out
		}
	}

	It("waits for the second approver, then answers ok as system:quorum with both entries", func() {
		preq := quorumRequest(newNamespace(), "")
		first := addEntry(alice, preq, "alice", true, "")
		Consistently(answerOf(preq), 2*time.Second, 200*time.Millisecond).Should(BeNil(), "one of two approvals is no answer")

		second := addEntry(carol, preq, "carol", true, "")
		Eventually(answerOf(preq), eventually).ShouldNot(BeNil())
		got := stored(preq)
		Expect(got.Status.AnsweredBy).To(Equal(toolnexusv1alpha1.QuorumAnswerer))
		Expect(got.Status.Answer.OK).To(BeTrue())
		Expect(got.Status.Answer.ID).To(Equal("pnd-quorum-1"), "the answer echoes spec.request.id")
		Expect(got.Status.Answer.Reason).To(BeEmpty())
		Expect(approvalsIn(got.Status.Answer)).To(BeComparableTo([]toolnexusv1alpha1.ApprovalEntry{first, second}))
		Expect(got.Status.Approvals).To(HaveLen(2), "the entries stay as they were")
		Expect(got.Status.Conditions).To(BeEmpty(), "the room writes the answer and nothing else")
		Eventually(eventNotesOf(preq, approval.EventQuorumApproved), eventually).Should(ConsistOf("Approved by 2 of 2 required: alice, carol"))
	})

	It("declines on a decline, with its reason", func() {
		preq := quorumRequest(newNamespace(), "")
		declined := addEntry(carol, preq, "carol", false, "orders is still in use")
		Eventually(answerOf(preq), eventually).ShouldNot(BeNil())
		got := stored(preq)
		Expect(got.Status.AnsweredBy).To(Equal(toolnexusv1alpha1.QuorumAnswerer))
		Expect(got.Status.Answer.OK).To(BeFalse())
		Expect(got.Status.Answer.Reason).To(Equal("orders is still in use"))
		Expect(approvalsIn(got.Status.Answer)).To(BeComparableTo([]toolnexusv1alpha1.ApprovalEntry{declined}))
		Eventually(eventNotesOf(preq, approval.EventQuorumDeclined), eventually).Should(ConsistOf("Declined by carol: orders is still in use"))
	})

	It("leaves an expired request to the run's controller", func() {
		ns := newNamespace()
		expired := quorumRequest(ns, time.Now().Add(-time.Minute).UTC().Format(time.RFC3339))
		open := quorumRequest(ns, time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
		for _, p := range []*toolnexusv1alpha1.PendingRequest{expired, open} {
			addEntry(alice, p, "alice", true, "")
			addEntry(carol, p, "carol", true, "")
		}
		Eventually(answerOf(open), eventually).ShouldNot(BeNil(), "the request that has not expired is answered")
		Consistently(answerOf(expired), time.Second, 200*time.Millisecond).Should(BeNil())
	})
})

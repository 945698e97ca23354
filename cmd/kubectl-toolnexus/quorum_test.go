package main_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

// letApprove lets users read the requests of ns and add their approval entries there, as the
// answerer role does.
func letApprove(ns string, users ...string) {
	GinkgoHelper()
	Expect(admin.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "approvers", Namespace: ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{toolnexusv1alpha1.GroupVersion.Group}, Resources: []string{"pendingrequests"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{toolnexusv1alpha1.GroupVersion.Group}, Resources: []string{"pendingrequests/status"}, Verbs: []string{"get", "patch"}},
		},
	})).To(Succeed())
	Expect(admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "approvers", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "approvers"},
		Subjects:   testenv.Users(users...),
	})).To(Succeed())
	for _, user := range users {
		var attrs []authorizationv1.ResourceAttributes
		for _, a := range []authorizationv1.ResourceAttributes{testenv.Access("list", "pendingrequests"), testenv.Access("patch", "pendingrequests/status")} {
			a.Namespace = ns
			attrs = append(attrs, a)
		}
		testEnv.WaitAllowed(GinkgoT(), envtest.User{Name: user}, attrs...)
	}
}

// quorumRequest creates the request the ApprovalPolicy prod-changes opens for a call of the run
// buy-gpu: it needs two approvals, of alice and carol, who may add them.
func quorumRequest(ns string) *toolnexusv1alpha1.PendingRequest {
	GinkgoHelper()
	letApprove(ns, "alice", "carol")
	preq := &toolnexusv1alpha1.PendingRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "buy-gpu-1-call-", Namespace: ns,
			Labels: map[string]string{toolnexusv1alpha1.RunLabel: "buy-gpu"}},
		Spec: toolnexusv1alpha1.PendingRequestSpec{
			RunRef:    toolnexusv1alpha1.RunReference{Name: "buy-gpu"},
			ToolCall:  toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "approve_purchase", Arguments: `{"item":"gpu","amount":1200}`},
			Request:   toolnexusv1alpha1.Request{ID: "pnd-lx2k1-1", Kind: "approval", Prompt: "Approve purchase of gpu?"},
			Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice", "carol"}},
			Policy:    &toolnexusv1alpha1.PolicyReference{Name: "prod-changes", Generation: 3},
			Required:  2,
		},
	}
	Expect(admin.Create(ctx, preq)).To(Succeed())
	return preq
}

// entries are the request's approval entries without the time the API server stamps.
func entries(preq *toolnexusv1alpha1.PendingRequest) []toolnexusv1alpha1.ApprovalEntry {
	var out []toolnexusv1alpha1.ApprovalEntry
	for _, e := range stored(preq).Status.Approvals {
		e.At = nil
		out = append(out, e)
	}
	return out
}

// managers are the field managers of the request's status.
func managers(preq *toolnexusv1alpha1.PendingRequest) []string {
	var out []string
	for _, m := range stored(preq).ManagedFields {
		if m.Subresource == "status" {
			out = append(out, m.Manager)
		}
	}
	return out
}

var _ = Describe("A request that needs two approvals", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("takes each approver's own entry, never another's, and shows the progress in approve, show and pending", func() {
		preq := quorumRequest(ns)
		stdout, stderr, err := kubectlToolnexus("alice", "-n", ns, "approve", preq.Name)
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(stdout).To(Equal("pendingrequest.toolnexus.dev/" + preq.Name + " approved: 1 of 2 (alice); waiting for 1 more\n"))
		Expect(entries(preq)).To(Equal([]toolnexusv1alpha1.ApprovalEntry{{User: "alice", RequestUID: string(preq.UID), OK: true}}))
		Expect(stored(preq).Status.Answer).To(BeNil(), "nobody but the manager answers a request that needs several approvals")

		By("alice approving again is told she did, and nothing is written")
		before := stored(preq).ResourceVersion
		stdout, stderr, err = kubectlToolnexus("alice", "-n", ns, "approve", preq.Name)
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(stdout).To(Equal("pendingrequest.toolnexus.dev/" + preq.Name + ": you (alice) already approved it; 1 of 2 (alice); waiting for 1 more\n"))
		_, stderr, err = kubectlToolnexus("alice", "-n", ns, "decline", preq.Name)
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring(`you (alice) already approved pendingrequests.toolnexus.dev "` + preq.Name + `"; an approval entry cannot be changed`))
		Expect(stored(preq).ResourceVersion).To(Equal(before))

		By("carol reviews it: the policy, the progress, and the commands that add her entry")
		uid := string(preq.UID)
		shown, stderr, err := kubectlToolnexus("carol", "-n", ns, "show", preq.Name)
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(shown).To(ContainSubstring("Policy:      prod-changes (generation 3)\n"))
		Expect(shown).To(ContainSubstring("\nApprovals\n  Required:  2\n  Progress:  1 of 2 (alice); waiting for 1 more\n  - alice approved"))
		Expect(shown).To(ContainSubstring("  none yet; the manager records it once 2 approve or one declines.\n" +
			"  Add your entry, approving or declining this request (uid " + uid + "), with:\n" +
			"    kubectl toolnexus approve " + preq.Name + " -n " + ns + " --uid " + uid + "\n" +
			"    kubectl toolnexus decline " + preq.Name + " -n " + ns + " --uid " + uid + " --reason \"...\"\n"))
		listed, stderr, err := kubectlToolnexus("carol", "-n", ns, "pending")
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(listed).To(MatchRegexp(`^NAME\s+RUN\s+KIND\s+APPROVALS\s+POLICY\s+PROMPT\s+URL\s+AGE\n`))
		Expect(listed).To(MatchRegexp(preq.Name + `\s+buy-gpu\s+approval\s+1 of 2 \(alice\)\s+prod-changes\s+Approve purchase of gpu\?`))

		By("carol pastes the approve command: her entry joins alice's and completes the quorum")
		out, err := pasted("carol", answerCommands(shown)[0])
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(Equal("pendingrequest.toolnexus.dev/" + preq.Name +
			" approved: 2 of 2 (alice, carol); the quorum is complete: the manager records the answer\n"))
		Expect(entries(preq)).To(Equal([]toolnexusv1alpha1.ApprovalEntry{{User: "alice", RequestUID: string(preq.UID), OK: true}, {User: "carol", RequestUID: string(preq.UID), OK: true}}))
		Expect(managers(preq)).To(ContainElements("kubectl-toolnexus/alice", "kubectl-toolnexus/carol"), "each entry is applied by its own user's field manager")
		Expect(stored(preq).Status.Answer).To(BeNil())

		shown, _, err = kubectlToolnexus("alice", "-n", ns, "show", preq.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(shown).To(ContainSubstring("  Progress:  2 of 2 (alice, carol); the quorum is complete: the manager records the answer\n"))
	})

	It("is declined by the first decline, which says who and why, and takes no approval after it", func() {
		preq := quorumRequest(ns)
		stdout, stderr, err := kubectlToolnexus("carol", "-n", ns, "decline", preq.Name, "--reason", "over budget")
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(stdout).To(Equal("pendingrequest.toolnexus.dev/" + preq.Name + " declined by carol: over budget; the manager records the decline as the answer\n"))
		Expect(entries(preq)).To(Equal([]toolnexusv1alpha1.ApprovalEntry{{User: "carol", RequestUID: string(preq.UID), OK: false, Reason: "over budget"}}))

		_, stderr, err = kubectlToolnexus("alice", "-n", ns, "approve", preq.Name, "--reason", "fine by me")
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring(`pendingrequests.toolnexus.dev "` + preq.Name + `" is decided already (declined by carol: over budget)`))
		Expect(entries(preq)).To(HaveLen(1))

		listed, _, err := kubectlToolnexus("alice", "-n", ns, "pending")
		Expect(err).NotTo(HaveOccurred())
		Expect(listed).To(MatchRegexp(`approval\s+declined by carol: over budget\s+prod-changes`))
	})

	It("records an approver's reason with the approval", func() {
		preq := quorumRequest(ns)
		_, stderr, err := kubectlToolnexus("alice", "-n", ns, "approve", preq.Name, "--reason", "checked the budget")
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(entries(preq)).To(Equal([]toolnexusv1alpha1.ApprovalEntry{{User: "alice", RequestUID: string(preq.UID), OK: true, Reason: "checked the budget"}}))
	})

	It("takes no direct answer, and names the command that adds the entry", func() {
		preq := quorumRequest(ns)
		_, stderr, err := kubectlToolnexus("alice", "-n", ns, "answer", preq.Name, "--output", "yes")
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring(`pendingrequests.toolnexus.dev "` + preq.Name + `" needs 2 approvals and the manager gives its answer: ` +
			"approve or decline it, e.g. `kubectl toolnexus approve " + preq.Name + " -n " + ns + " --uid " + string(preq.UID) + "`"))
		got := stored(preq)
		Expect(got.Status.Answer).To(BeNil())
		Expect(got.Status.Approvals).To(BeEmpty())

		By("a reason on the approval of a request that needs one is refused before anything is written")
		single := newRequest(ns, "approval", nil)
		_, stderr, err = kubectlToolnexus("alice", "-n", ns, "approve", single.Name, "--reason", "fine")
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring("--reason: an approval carries no reason"))
		Expect(stored(single).Status.Answer).To(BeNil())
	})

	It("takes an entry only for the request its approver reviewed", func() {
		letApprove(ns, "alice", "carol")
		create := func(arguments string) *toolnexusv1alpha1.PendingRequest {
			preq := &toolnexusv1alpha1.PendingRequest{
				ObjectMeta: metav1.ObjectMeta{Name: "pay-1-call-0-0", Namespace: ns},
				Spec: toolnexusv1alpha1.PendingRequestSpec{
					RunRef:   toolnexusv1alpha1.RunReference{Name: "pay"},
					ToolCall: toolnexusv1alpha1.ToolCall{ID: "call-0", Name: "purchase", Arguments: arguments},
					Request:  toolnexusv1alpha1.Request{ID: "policy:prod-changes:call-0", Kind: "approval", Prompt: "Approve purchase?"},
					Required: 2,
				},
			}
			Expect(admin.Create(ctx, preq)).To(Succeed())
			return preq
		}
		old := create(`{"amount":10}`)
		shown, stderr, err := kubectlToolnexus("alice", "-n", ns, "show", old.Name)
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(admin.Delete(ctx, old)).To(Succeed())
		again := create(`{"amount":100000}`)

		for _, c := range answerCommands(shown) {
			out, err := pasted("alice", c)
			Expect(err).To(HaveOccurred(), "%s added an entry to the new request:\n%s", c, out)
			Expect(out).To(ContainSubstring("PendingRequest pay-1-call-0-0 was replaced since you saw it"))
		}
		Expect(stored(again).Status.Approvals).To(BeEmpty())
	})
})

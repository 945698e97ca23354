package admission_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

// delegatedRun is a sub-agent's run as the manager creates it: delegated by run "orders", naming
// requestedBy ("" leaves it out).
func delegatedRun(ns, requestedBy string) *toolnexusv1alpha1.AgentRun {
	run := inlineRun(ns, requestedBy)
	run.Spec.DelegatedBy = &toolnexusv1alpha1.Delegation{Path: []string{"orders"}, ParentUID: "uid-orders", RootUID: "uid-orders", CallID: "call_1"}
	return run
}

// A sub-agent call makes the manager create a run for the parent's requester; the custom verb
// delegate lets it, and nobody else, name someone other than itself and record the delegation.
var _ = Describe("A sub-agent's run", func() {
	var ns string

	BeforeEach(func() {
		ns = newNamespace()
		Expect(admin.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "run-authors", Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "toolnexus-agentrun-editor"},
			Subjects:   testenv.Users("alice"),
		})).To(Succeed())
		for _, grant := range []struct {
			user envtest.User
			verb string
		}{{envtest.User{Name: "alice"}, "create"}, {envtest.User{Name: managerUser, Groups: managerGroups}, "create"},
			{envtest.User{Name: managerUser, Groups: managerGroups}, "delegate"}} {
			attrs := testenv.Access(grant.verb, "agentruns")
			attrs.Namespace = ns
			testEnv.WaitAllowed(GinkgoT(), grant.user, attrs)
		}
		// A policy is enforced a moment after it is created: wait until the manager is refused a
		// requester it did not delegate for.
		Eventually(func() error { return manager.Create(ctx, inlineRun(ns, "alice")) }).
			WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(MatchError(ContainSubstring("spec.requestedBy must be your own user name")))
	})

	It("names the parent's requester when the manager creates it, and none when the parent had none", func() {
		run := delegatedRun(ns, "alice")
		Expect(manager.Create(ctx, run)).To(Succeed())
		Expect(requesterOf(run)).To(Equal("alice"))

		unstamped := delegatedRun(ns, "")
		Expect(manager.Create(ctx, unstamped)).To(Succeed())
		Expect(requesterOf(unstamped)).To(BeEmpty(), "the stamp names whoever created a run, which for a delegated run is the manager")
	})

	It("is refused to a run author, who may not record a delegation", func() {
		for _, requester := range []string{"", "alice", "bob"} {
			err := alice.Create(ctx, delegatedRun(ns, requester))
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "requestedBy %q: %v", requester, err)
			Expect(err.Error()).To(ContainSubstring("spec.delegatedBy is set by the operator when a sub-agent call creates a run; " +
				"alice may not set it (the custom verb delegate on agentruns): leave it out"))
		}
		By("a run alice creates without it is hers, as before")
		run := inlineRun(ns, "")
		Expect(alice.Create(ctx, run)).To(Succeed())
		Expect(requesterOf(run)).To(Equal("alice"))
	})
})

package admission_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

// inlineRun is an AgentRun with an inline agent, naming requestedBy ("" leaves it out).
func inlineRun(ns, requestedBy string) *toolnexusv1alpha1.AgentRun {
	return &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "buy-gpu-", Namespace: ns},
		Spec: toolnexusv1alpha1.AgentRunSpec{
			Prompt:      "buy a gpu",
			AgentSpec:   toolnexusv1alpha1.AgentSpec{Model: toolnexusv1alpha1.ModelSpec{Name: "gpt-4o-mini", BaseURL: "http://127.0.0.1:1/v1"}},
			RequestedBy: requestedBy,
		},
	}
}

// requesterOf reads run back as the admin and returns its spec.requestedBy.
func requesterOf(run *toolnexusv1alpha1.AgentRun) string {
	got := &toolnexusv1alpha1.AgentRun{}
	ExpectWithOffset(1, admin.Get(ctx, client.ObjectKeyFromObject(run), got)).To(Succeed())
	return got.Spec.RequestedBy
}

// patchRun merge-patches run as c's user.
func patchRun(c client.Client, run *toolnexusv1alpha1.AgentRun, patch string) error {
	return c.Patch(ctx, run.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch)))
}

var _ = Describe("Who requested a run", func() {
	var ns string

	BeforeEach(func() {
		ns = newNamespace()
		Expect(admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: ns}})).To(Succeed())
		// alice and bob author runs here, and so does the CronJob's ServiceAccount nightly.
		Expect(admin.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "run-authors", Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "toolnexus-agentrun-editor"},
			Subjects: append(testenv.Users("alice", "bob"),
				rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "nightly", Namespace: ns}),
		})).To(Succeed())
		for _, user := range []envtest.User{{Name: "alice"}, {Name: "bob"}, {Name: "system:serviceaccount:" + ns + ":nightly"}} {
			for _, verb := range []string{"create", "patch"} {
				attrs := testenv.Access(verb, "agentruns")
				attrs.Namespace = ns
				testEnv.WaitAllowed(GinkgoT(), user, attrs)
			}
		}
	})

	It("is stamped by the API server with the user who created the run", func() {
		// A policy is enforced a moment after it is created: a run created before is unstamped.
		var run *toolnexusv1alpha1.AgentRun
		Eventually(func() (string, error) {
			run = inlineRun(ns, "")
			err := alice.Create(ctx, run)
			return run.Spec.RequestedBy, err
		}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Equal("alice"))
		Expect(requesterOf(run)).To(Equal("alice"))
	})

	It("refuses a create that names somebody else, and accepts one that names its creator", func() {
		var err error
		Eventually(func() error {
			err = bob.Create(ctx, inlineRun(ns, "alice"))
			return err
		}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(HaveOccurred())
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("spec.requestedBy must be your own user name (bob), not alice: " +
			"it records who created the run and is stamped by the API server " +
			"(MutatingAdmissionPolicy toolnexus-requester-stamp); leave it out"))

		run := inlineRun(ns, "bob")
		Expect(bob.Create(ctx, run)).To(Succeed())
		Expect(requesterOf(run)).To(Equal("bob"))
	})

	It("cannot be changed or removed afterwards, by the creator or an administrator; cancel still can", func() {
		var run *toolnexusv1alpha1.AgentRun
		Eventually(func() (string, error) {
			run = inlineRun(ns, "")
			err := alice.Create(ctx, run)
			return run.Spec.RequestedBy, err
		}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Equal("alice"))

		for _, c := range []client.Client{alice, admin} {
			err := patchRun(c, run, `{"spec":{"requestedBy":"bob"}}`)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("spec.requestedBy is immutable: it records who created the run"))
			err = patchRun(c, run, `{"spec":{"requestedBy":null}}`)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring("spec.requestedBy cannot be added or removed after creation"))
		}

		By("a whole-object update that keeps it, as kubectl edit sends, is accepted")
		got := &toolnexusv1alpha1.AgentRun{}
		Expect(alice.Get(ctx, client.ObjectKeyFromObject(run), got)).To(Succeed())
		got.Labels = map[string]string{"team": "purchasing"}
		Expect(alice.Update(ctx, got)).To(Succeed())
		Expect(patchRun(alice, run, `{"spec":{"cancel":true}}`)).To(Succeed())
		Expect(requesterOf(run)).To(Equal("alice"))
	})

	It("names a CronJob's ServiceAccount when the run is created with its token", func() {
		nightly := testEnv.ServiceAccount(GinkgoT(), ns, "nightly").Client
		var run *toolnexusv1alpha1.AgentRun
		Eventually(func() (string, error) {
			run = inlineRun(ns, "")
			err := nightly.Create(ctx, run)
			return run.Spec.RequestedBy, err
		}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Equal("system:serviceaccount:" + ns + ":nightly"))
		Expect(requesterOf(run)).To(Equal("system:serviceaccount:" + ns + ":nightly"))
	})
})

package admission_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
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

// labelNamespace sets (or, for "", removes) the namespace's shard label, as an administrator does.
func labelNamespace(ns, shard string) error {
	value := `null`
	if shard != "" {
		value = `"` + shard + `"`
	}
	return admin.Patch(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"`+toolnexusv1alpha1.ShardLabel+`":`+value+`}}}`)))
}

// shardOfRun reads run back as the admin and returns its shard label, "(none)" without one.
func shardOfRun(run *toolnexusv1alpha1.AgentRun) string {
	got := &toolnexusv1alpha1.AgentRun{}
	ExpectWithOffset(1, admin.Get(ctx, client.ObjectKeyFromObject(run), got)).To(Succeed())
	if shard, ok := got.Labels[toolnexusv1alpha1.ShardLabel]; ok {
		return shard
	}
	return "(none)"
}

// createdShard creates run as alice and returns its shard label as stored.
func createdShard(run *toolnexusv1alpha1.AgentRun) (string, error) {
	if err := alice.Create(ctx, run); err != nil {
		return "", err
	}
	return shardOfRun(run), nil
}

// labelledRun is inlineRun with labels.
func labelledRun(ns string, labels map[string]string) *toolnexusv1alpha1.AgentRun {
	run := inlineRun(ns, "")
	run.Labels = labels
	return run
}

var _ = Describe("Which shard runs a run", func() {
	var ns string

	BeforeEach(func() {
		ns = newNamespace()
		Expect(admin.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "run-authors", Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "toolnexus-agentrun-editor"},
			Subjects:   testenv.Users("alice"),
		})).To(Succeed())
		for _, verb := range []string{"create", "patch", "update"} {
			attrs := testenv.Access(verb, "agentruns")
			attrs.Namespace = ns
			testEnv.WaitAllowed(GinkgoT(), envtest.User{Name: "alice"}, attrs)
		}
		Expect(labelNamespace(ns, "a")).To(Succeed())
	})

	It("is the namespace's, stamped on create whatever the author sent", func() {
		// A policy is enforced a moment after it is created: a run created before is unstamped.
		Eventually(func() (string, error) { return createdShard(inlineRun(ns, "")) }).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Equal("a"))

		run := labelledRun(ns, map[string]string{toolnexusv1alpha1.ShardLabel: "b", "team": "purchasing"})
		Expect(alice.Create(ctx, run)).To(Succeed())
		Expect(shardOfRun(run)).To(Equal("a"), "the author's shard is replaced by the namespace's")
		Expect(run.Labels).To(HaveKeyWithValue("team", "purchasing"))

		By("a namespace without the label: the run's label is removed")
		Expect(labelNamespace(ns, "")).To(Succeed())
		run = labelledRun(ns, map[string]string{toolnexusv1alpha1.ShardLabel: "a"})
		Expect(alice.Create(ctx, run)).To(Succeed())
		Expect(shardOfRun(run)).To(Equal("(none)"), "a run of a namespace of no shard belongs to the manager started without --shard")
	})

	It("cannot be changed or removed by the run's author, and follows the namespace when it moves", func() {
		var run *toolnexusv1alpha1.AgentRun
		Eventually(func() (string, error) {
			run = inlineRun(ns, "")
			return createdShard(run)
		}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Equal("a"))

		Expect(patchRun(alice, run, `{"metadata":{"labels":{"toolnexus.dev/shard":"b"}}}`)).To(Succeed())
		Expect(shardOfRun(run)).To(Equal("a"))
		Expect(patchRun(alice, run, `{"metadata":{"labels":{"toolnexus.dev/shard":null}}}`)).To(Succeed())
		Expect(shardOfRun(run)).To(Equal("a"))
		got := &toolnexusv1alpha1.AgentRun{}
		Expect(alice.Get(ctx, client.ObjectKeyFromObject(run), got)).To(Succeed())
		got.Labels = map[string]string{"team": "purchasing"}
		Expect(alice.Update(ctx, got)).To(Succeed(), "a whole-object update without the label, as kubectl edit may send")
		Expect(shardOfRun(run)).To(Equal("a"))

		By("the namespace moves to shard b: relabelling its runs takes them there")
		Expect(labelNamespace(ns, "b")).To(Succeed())
		Expect(shardOfRun(run)).To(Equal("a"), "a run moves when it is written, not when its namespace is")
		Expect(patchRun(admin, run, `{"metadata":{"labels":{"toolnexus.dev/shard":"b"}}}`)).To(Succeed())
		Expect(shardOfRun(run)).To(Equal("b"))
		By("an administrator's label that is not the namespace's is the namespace's all the same")
		Expect(patchRun(admin, run, `{"metadata":{"labels":{"toolnexus.dev/shard":"c"}}}`)).To(Succeed())
		Expect(shardOfRun(run)).To(Equal("b"))
		Expect(patchRun(alice, run, `{"spec":{"cancel":true}}`)).To(Succeed())
		Expect(shardOfRun(run)).To(Equal("b"))
	})

	It("refuses a namespace label that names no shard a manager can run", func() {
		err := labelNamespace(ns, "Team_A")
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("label toolnexus.dev/shard Team_A names no shard a manager can run: " +
			"a shard is a DNS label (lowercase letters, digits and -, starting and ending with a letter or digit, at most 63)"))
		Expect(labelNamespace(ns, "team-a")).To(Succeed())
	})

	It("refuses a run labelled for another shard when the stamp is not there", func() {
		binding := &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
		Expect(admin.Get(ctx, client.ObjectKey{Name: "toolnexus-shard-stamp"}, binding)).To(Succeed())
		Expect(admin.Delete(ctx, binding)).To(Succeed())
		DeferCleanup(func() {
			Expect(admin.Create(ctx, &admissionregistrationv1.MutatingAdmissionPolicyBinding{
				ObjectMeta: metav1.ObjectMeta{Name: binding.Name}, Spec: binding.Spec})).To(Succeed())
			// Later specs expect the stamp: wait until it is enforced again.
			Eventually(func() (string, error) {
				return createdShard(labelledRun(ns, map[string]string{toolnexusv1alpha1.ShardLabel: "b"}))
			}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Equal("a"))
		})
		var err error
		Eventually(func() error {
			err = alice.Create(ctx, labelledRun(ns, map[string]string{toolnexusv1alpha1.ShardLabel: "b"}))
			return err
		}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(HaveOccurred())
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("label toolnexus.dev/shard must be the shard of namespace " + ns + " (a), not b: " +
			"the API server stamps it from the namespace (MutatingAdmissionPolicy toolnexus-shard-stamp); leave it out"))
		Expect(alice.Create(ctx, labelledRun(ns, map[string]string{toolnexusv1alpha1.ShardLabel: "a"}))).To(Succeed())
		err = alice.Create(ctx, inlineRun(ns, ""))
		Expect(err).To(MatchError(ContainSubstring("(a), not none")))
	})
})

package controller_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller/policy"
	"github.com/toolnexus/operator/internal/testenv"
)

// newApprovalPolicy is a cluster-scoped policy that selects only namespaces labelled for it, so
// it gates no other spec's runs.
func newApprovalPolicy(when string) *toolnexusv1alpha1.ApprovalPolicy {
	return &toolnexusv1alpha1.ApprovalPolicy{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "policy-test-"},
		Spec: toolnexusv1alpha1.ApprovalPolicySpec{
			NamespaceSelector: &toolnexusv1alpha1.LabelSelector{MatchLabels: map[string]toolnexusv1alpha1.LabelValue{
				"toolnexus.dev/policy-test": toolnexusv1alpha1.LabelValue(rand.String(8))}},
			Tools:     []string{"delete_*"},
			When:      when,
			Approvers: toolnexusv1alpha1.Approvers{Groups: []string{"sre"}},
		},
	}
}

// createApprovalPolicy creates p as the cluster's administrator, deleted when the spec ends.
func createApprovalPolicy(p *toolnexusv1alpha1.ApprovalPolicy) {
	ExpectWithOffset(1, k8sClient.Create(ctx, p)).To(Succeed())
	DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, p))).To(Succeed()) })
}

// policyReady is the policy's Ready condition.
func policyReady(p *toolnexusv1alpha1.ApprovalPolicy) func(Gomega) *metav1.Condition {
	return func(g Gomega) *metav1.Condition {
		got := &toolnexusv1alpha1.ApprovalPolicy{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
		return meta.FindStatusCondition(got.Status.Conditions, toolnexusv1alpha1.ConditionReady)
	}
}

var _ = Describe("ApprovalPolicy", func() {
	It("is not Ready, with the field at fault, while its when does not compile, and Ready once fixed", func() {
		p := newApprovalPolicy("args.amount >")
		createApprovalPolicy(p)
		Eventually(policyReady(p), eventually).Should(SatisfyAll(
			HaveField("Status", metav1.ConditionFalse),
			HaveField("Reason", toolnexusv1alpha1.ReasonInvalidPolicy),
			HaveField("Message", ContainSubstring(`spec.when: when "args.amount >": ERROR: <input>:1:14: Syntax error`)),
			HaveField("ObservedGeneration", int64(1))))
		Expect(getPolicy(p).Status.ObservedGeneration).To(Equal(int64(1)))
		Expect(meta.IsStatusConditionTrue(getPolicy(p).Status.Conditions, toolnexusv1alpha1.ConditionStalled)).To(BeTrue())

		editPolicy(p, func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.When = `namespace == "prod" && args.amount > 1000.0` })
		Eventually(policyReady(p), eventually).Should(SatisfyAll(
			HaveField("Status", metav1.ConditionTrue),
			HaveField("Reason", toolnexusv1alpha1.ReasonValid),
			HaveField("ObservedGeneration", int64(2))))
		Expect(getPolicy(p).Status.ObservedGeneration).To(Equal(int64(2)))
		Expect(meta.FindStatusCondition(getPolicy(p).Status.Conditions, toolnexusv1alpha1.ConditionStalled)).To(BeNil())
	})

	It("reaches the call path through a manager's informers: created, changed, relabelled out of, deleted", func() {
		mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
		Expect(err).NotTo(HaveOccurred())
		policies := policy.NewRegistry()
		Expect(policies.SetupWithManager(mgr)).To(Succeed())
		check := func(tool string) ([]policy.Gate, error) {
			checkCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			return policies.Check(checkCtx, policy.Call{Tool: tool, ID: "call_1"})
		}
		// Not started, nothing read: a call waits, and never passes.
		_, err = check("delete_user")
		Expect(err).To(MatchError(context.DeadlineExceeded))

		p := newApprovalPolicy("")
		ns := newNamespace()
		selected := func(g Gomega, yes bool) {
			namespace := &corev1.Namespace{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: ns}, namespace)).To(Succeed())
			for k, v := range p.Spec.NamespaceSelector.MatchLabels {
				if yes {
					namespace.Labels[k] = string(v)
				} else {
					delete(namespace.Labels, k)
				}
			}
			g.Expect(k8sClient.Update(ctx, namespace)).To(Succeed())
		}
		Eventually(func(g Gomega) { selected(g, true) }, eventually).Should(Succeed())
		p.Spec.When = fmt.Sprintf("namespace == %q", ns)
		createApprovalPolicy(p)
		mgrCtx, stop := context.WithCancel(ctx)
		done := make(chan error)
		go func() { done <- mgr.Start(mgrCtx) }()
		DeferCleanup(func() {
			stop()
			Expect(<-done).To(Succeed())
		})

		gates := func(tool string) func(Gomega) []string {
			return func(g Gomega) []string {
				checkCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				got, err := policies.Check(checkCtx, policy.Call{Namespace: ns, Labels: map[string]string{"app": "x"}, Tool: tool, Args: map[string]any{"user": "bob"}, ID: "call_1"})
				g.Expect(err).NotTo(HaveOccurred())
				var out []string
				for _, gate := range got {
					g.Expect(gate.Refused).To(BeEmpty())
					out = append(out, fmt.Sprintf("%s/%d %s", gate.Policy, gate.Generation, gate.Request.ID))
				}
				return out
			}
		}
		gated := func(generation int) []string {
			return []string{fmt.Sprintf("%s/%d policy:%s:call_1", p.Name, generation, p.Name)}
		}
		Eventually(gates("delete_user"), eventually).Should(Equal(gated(1)))
		Expect(gates("get_user")(Default)).To(BeEmpty())

		editPolicy(p, func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.Tools = []string{"drop_*"} })
		Eventually(gates("drop_table"), eventually).Should(Equal(gated(2)))
		Expect(gates("delete_user")(Default)).To(BeEmpty())

		Eventually(func(g Gomega) { selected(g, false) }, eventually).Should(Succeed())
		Eventually(gates("drop_table"), eventually).Should(BeEmpty())
		Eventually(func(g Gomega) { selected(g, true) }, eventually).Should(Succeed())
		Eventually(gates("drop_table"), eventually).Should(Equal(gated(2)))

		Expect(k8sClient.Delete(ctx, p)).To(Succeed())
		Eventually(gates("drop_table"), eventually).Should(BeEmpty())
	})

	It("is a valid sample (config/samples/approval-policy.yaml)", func() {
		raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "samples", "approval-policy.yaml"))
		Expect(err).NotTo(HaveOccurred())
		objs, err := testenv.Decode(raw)
		Expect(err).NotTo(HaveOccurred())
		Expect(objs).To(HaveLen(1))
		Expect(k8sClient.Create(ctx, objs[0], client.DryRunAll)).To(Succeed())
	})

	// The suite installs no RBAC of config/: this spec creates the people's roles it needs, and
	// binds by hand what the built-in roles would aggregate (envtest runs no controller-manager,
	// so no ClusterRole aggregation happens).
	It("is written by cluster admins only; a namespace editor reads it once bound to a viewer role cluster-wide", func() {
		createPeopleRoles()
		ns := newNamespace()
		name := "policy-editor-" + rand.String(6)
		editor := testEnv.User(GinkgoT(), name)
		for _, role := range []string{"edit", "system:aggregate-to-edit", "toolnexus-agentrun-editor", "toolnexus-agentrun-viewer"} {
			bindInNamespace(ns, role, name)
		}
		// The bindings hold: the editor edits in the namespace, as "edit" lets them.
		testEnv.WaitAllowed(GinkgoT(), editor.User,
			inNamespace(ns, authorizationv1.ResourceAttributes{Verb: "create", Resource: "configmaps"}),
			inNamespace(ns, testenv.Access("create", "agentruns")),
			inNamespace(ns, testenv.Access("get", "pendingrequests")))
		Expect(editor.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: ns}})).To(Succeed())

		existing := newApprovalPolicy("")
		createApprovalPolicy(existing)
		expectCannotWritePolicies(editor.Client, existing)
		// A RoleBinding grants nothing cluster-scoped: not even reading policies.
		Expect(apierrors.IsForbidden(editor.Client.Get(ctx, client.ObjectKeyFromObject(existing), &toolnexusv1alpha1.ApprovalPolicy{}))).To(BeTrue())
		Expect(apierrors.IsForbidden(editor.Client.List(ctx, &toolnexusv1alpha1.ApprovalPolicyList{}))).To(BeTrue())

		// Bound cluster-wide to the viewer role, they read policies, and still write none.
		bindCluster("toolnexus-agentrun-viewer", name)
		testEnv.WaitAllowed(GinkgoT(), editor.User, testenv.Access("get", "approvalpolicies"), testenv.Access("list", "approvalpolicies"))
		read := &toolnexusv1alpha1.ApprovalPolicy{}
		Expect(editor.Client.Get(ctx, client.ObjectKeyFromObject(existing), read)).To(Succeed())
		Expect(read.Spec.Approvers.Groups).To(Equal([]string{"sre"}))
		list := &toolnexusv1alpha1.ApprovalPolicyList{}
		Expect(editor.Client.List(ctx, list)).To(Succeed())
		Expect(list.Items).To(ContainElement(HaveField("Name", existing.Name)))
		expectCannotWritePolicies(editor.Client, existing)

		// The policies' own viewer role reads policies and nothing of any namespace.
		tenantName := "policy-tenant-" + rand.String(6)
		tenant := testEnv.User(GinkgoT(), tenantName)
		bindCluster("toolnexus-approvalpolicy-viewer", tenantName)
		testEnv.WaitAllowed(GinkgoT(), tenant.User, testenv.Access("list", "approvalpolicies"))
		Expect(tenant.Client.Get(ctx, client.ObjectKeyFromObject(existing), &toolnexusv1alpha1.ApprovalPolicy{})).To(Succeed())
		Expect(apierrors.IsForbidden(tenant.Client.List(ctx, &toolnexusv1alpha1.AgentRunList{}, client.InNamespace(ns)))).To(BeTrue())
		expectCannotWritePolicies(tenant.Client, existing)
	})
})

func getPolicy(p *toolnexusv1alpha1.ApprovalPolicy) *toolnexusv1alpha1.ApprovalPolicy {
	got := &toolnexusv1alpha1.ApprovalPolicy{}
	ExpectWithOffset(1, k8sClient.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
	return got
}

// editPolicy changes p's spec as its administrator (a patch: the manager writes its status
// meanwhile).
func editPolicy(p *toolnexusv1alpha1.ApprovalPolicy, edit func(*toolnexusv1alpha1.ApprovalPolicySpec)) {
	before := getPolicy(p)
	changed := before.DeepCopy()
	edit(&changed.Spec)
	ExpectWithOffset(1, k8sClient.Patch(ctx, changed, client.MergeFrom(before))).To(Succeed())
}

// expectCannotWritePolicies checks that c is refused, by RBAC, creating a policy and changing or
// deleting existing.
func expectCannotWritePolicies(c client.Client, existing *toolnexusv1alpha1.ApprovalPolicy) {
	forbidden := func(err error) bool { return apierrors.IsForbidden(err) }
	ExpectWithOffset(1, c.Create(ctx, newApprovalPolicy(""))).To(Satisfy(forbidden), "create")
	changed := getPolicy(existing)
	changed.Spec.Tools = []string{"nothing"}
	ExpectWithOffset(1, c.Update(ctx, changed)).To(Satisfy(forbidden), "update")
	ExpectWithOffset(1, c.Patch(ctx, changed, client.MergeFrom(getPolicy(existing)))).To(Satisfy(forbidden), "patch")
	ExpectWithOffset(1, c.Status().Update(ctx, changed)).To(Satisfy(forbidden), "update status")
	ExpectWithOffset(1, c.Delete(ctx, getPolicy(existing))).To(Satisfy(forbidden), "delete")
	ExpectWithOffset(1, c.DeleteAllOf(ctx, &toolnexusv1alpha1.ApprovalPolicy{})).To(Satisfy(forbidden), "deletecollection")
	ExpectWithOffset(1, getPolicy(existing).Spec.Tools).To(Equal([]string{"delete_*"}))
}

// createPeopleRoles creates the ClusterRoles of config/rbac that people are bound to, unless a
// spec before did.
func createPeopleRoles() {
	objs, err := testenv.Kustomize(filepath.Join(testenv.RepoRoot(), "config", "rbac"))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	people := map[string]bool{"toolnexus-agentrun-editor": true, "toolnexus-agentrun-viewer": true, "toolnexus-approvalpolicy-viewer": true}
	created := 0
	for _, obj := range objs {
		if obj.GetKind() != "ClusterRole" || !people[obj.GetName()] {
			continue
		}
		if err := k8sClient.Create(ctx, obj); !apierrors.IsAlreadyExists(err) {
			ExpectWithOffset(1, err).NotTo(HaveOccurred(), obj.GetName())
		}
		created++
	}
	ExpectWithOffset(1, created).To(Equal(len(people)), "config/rbac has the people's ClusterRoles")
}

// bindInNamespace binds the ClusterRole role to user in namespace ns, as a namespace admin would.
func bindInNamespace(ns, role, user string) {
	ExpectWithOffset(1, k8sClient.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "policy-test-", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   testenv.Users(user),
	})).To(Succeed())
}

// bindCluster binds the ClusterRole role to user in every namespace until the spec ends.
func bindCluster(role, user string) {
	binding := "policy-test-" + user
	testEnv.Bind(GinkgoT(), binding, role, testenv.Users(user)...)
	DeferCleanup(func() {
		Expect(k8sClient.Delete(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: binding}})).To(Succeed())
	})
}

func inNamespace(ns string, a authorizationv1.ResourceAttributes) authorizationv1.ResourceAttributes {
	a.Namespace = ns
	return a
}

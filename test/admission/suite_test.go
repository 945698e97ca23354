// Package admission_test checks the admission policies of config/policies (who may answer a
// PendingRequest, what an answer must carry, who answered and when) against a real API server, with
// the RBAC of config/rbac, acting as distinct authenticated users.
package admission_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

// The manager's identity once config/rbac is built: namespace and namePrefix of its
// kustomization.yaml.
const (
	managerNamespace = "toolnexus-system"
	managerUser      = "system:serviceaccount:" + managerNamespace + ":toolnexus-controller-manager"
	approverGroup    = "purchasing-approvers"
)

// managerGroups are the groups of the manager's ServiceAccount.
var managerGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + managerNamespace}

var (
	env    *envtest.Environment
	cfg    *rest.Config
	scheme *runtime.Scheme
	ctx    context.Context

	// admin is system:masters; it creates the PendingRequests, as the controller would.
	admin client.Client
	// alice and bob may answer by RBAC (the toolnexus-answerer ClusterRole); carol through her
	// group; dave has no RBAC at all; erin gets toolnexus-agentrun-editor where a test binds it;
	// manager is the operator's ServiceAccount.
	alice, bob, carol, dave, erin, manager client.Client
)

func TestAdmissionPolicies(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Admission policies (envtest)")
}

var _ = BeforeSuite(func() {
	ctx = context.Background()
	var err error
	env, err = testenv.New()
	Expect(err).NotTo(HaveOccurred())
	cfg, err = env.Start()
	Expect(err).NotTo(HaveOccurred())

	scheme, err = testenv.Scheme()
	Expect(err).NotTo(HaveOccurred())
	admin = clientAs(envtest.User{Name: "admin", Groups: []string{"system:masters"}})

	// What `make install` applies, built the way it builds it (kubectl's embedded kustomize).
	Expect(admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: managerNamespace}})).To(Succeed())
	for _, dir := range []string{"rbac", "policies"} {
		for _, obj := range kustomize(filepath.Join(testenv.RepoRoot(), "config", dir)) {
			Expect(admin.Create(ctx, obj)).To(Succeed(), "creating %s %s from config/%s", obj.GetKind(), obj.GetName(), dir)
		}
	}

	// The people: answering is granted by the answerer ClusterRole, as an administrator would.
	Expect(admin.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test-answerers"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "toolnexus-answerer"},
		Subjects: []rbacv1.Subject{
			{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"},
			{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "bob"},
			{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: approverGroup},
		},
	})).To(Succeed())
	alice = clientAs(envtest.User{Name: "alice"})
	bob = clientAs(envtest.User{Name: "bob"})
	carol = clientAs(envtest.User{Name: "carol", Groups: []string{approverGroup}})
	dave = clientAs(envtest.User{Name: "dave"})
	erin = clientAs(envtest.User{Name: "erin"})
	manager = clientAs(envtest.User{Name: managerUser, Groups: managerGroups})

	// The authorizer sees new RBAC objects a moment after they are created, and objects of
	// different kinds in no fixed order: wait until it grants every permission the specs use.
	ns := newNamespace()
	By("waiting for RBAC to grant the answerers and the manager what config/rbac gives them")
	for _, grant := range []struct {
		user   string
		groups []string
		verb   string
	}{
		{"alice", nil, "patch"},
		{"bob", nil, "patch"},
		{"bob", nil, "update"},
		{"carol", []string{approverGroup}, "patch"},
		{managerUser, managerGroups, "patch"},
		{managerUser, managerGroups, "expire"},
		{managerUser, managerGroups, "manage"},
	} {
		Eventually(func() (bool, error) {
			return mayWriteStatus(grant.user, grant.groups, grant.verb, ns)
		}).WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(BeTrue(),
			"%s may %s pendingrequests/status", grant.user, grant.verb)
	}

	// A policy is enforced a moment after it is created: wait until both are.
	By("waiting for the ValidatingAdmissionPolicy to refuse bob")
	Eventually(func() error {
		preq := newRequest(ns, "approval", nil, &toolnexusv1alpha1.Approvers{Users: []string{"alice"}})
		return answer(bob, preq, `{"ok":true}`)
	}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(MatchError(ContainSubstring("user bob may not answer this request")))
	By("waiting for the MutatingAdmissionPolicy to stamp answeredBy")
	Eventually(func() (string, error) {
		preq := newRequest(ns, "approval", nil, nil)
		err := patchStatus(alice, preq, `{"status":{"answer":{"ok":true},"answeredBy":"alice-forged"}}`)
		return preq.Status.AnsweredBy, err
	}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Equal("alice"))
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

// clientAs provisions an authenticated user (a client certificate) and returns a client for it.
func clientAs(user envtest.User) client.Client {
	authenticated, err := env.AddUser(user, cfg)
	Expect(err).NotTo(HaveOccurred())
	c, err := client.New(authenticated.Config(), client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// mayWriteStatus asks the authorizer whether user, in groups, may verb pendingrequests/status in
// namespace ns.
func mayWriteStatus(user string, groups []string, verb, ns string) (bool, error) {
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user, Groups: groups,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb,
			Group: toolnexusv1alpha1.GroupVersion.Group, Resource: "pendingrequests", Subresource: "status"},
	}}
	if err := admin.Create(ctx, review); err != nil {
		return false, err
	}
	return review.Status.Allowed, nil
}

func kustomize(dir string) []*unstructured.Unstructured {
	objs, err := testenv.Kustomize(dir)
	Expect(err).NotTo(HaveOccurred())
	return objs
}

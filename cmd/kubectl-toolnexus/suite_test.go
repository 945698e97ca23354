package main_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

var (
	env *envtest.Environment
	ctx context.Context
	// admin creates the objects the controller would create; no controller runs here.
	admin client.Client
	// plugin is the built kubectl-toolnexus binary.
	plugin string
	// kubeconfigs of the people: alice is an approver of the requests that list approvers, bob
	// may answer by RBAC but is no approver, carol has no RBAC at all, erin runs agents (the
	// editor role), admin is system:masters.
	kubeconfigs = map[string]string{}
)

func TestPlugin(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "kubectl-toolnexus (envtest)")
}

var _ = BeforeSuite(func() {
	ctx = context.Background()
	dir := GinkgoT().TempDir()

	By("building kubectl-toolnexus")
	_, err := testenv.Build(dir, "./cmd/kubectl-toolnexus")
	Expect(err).NotTo(HaveOccurred())
	plugin = filepath.Join(dir, "kubectl-toolnexus")

	env, err = testenv.New()
	Expect(err).NotTo(HaveOccurred())
	cfg, err := env.Start()
	Expect(err).NotTo(HaveOccurred())
	scheme, err := testenv.Scheme()
	Expect(err).NotTo(HaveOccurred())
	admin, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	By("installing config/rbac and config/policies")
	Expect(testenv.Install(ctx, admin, "rbac", "policies")).To(Succeed())
	Expect(admin.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test-answerers"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "toolnexus-answerer"},
		Subjects: []rbacv1.Subject{
			{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"},
			{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "bob"},
		},
	})).To(Succeed())
	// vic only views: config/rbac's viewer role, which the built-in view role aggregates.
	Expect(admin.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test-viewers"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "toolnexus-agentrun-viewer"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "vic"}},
	})).To(Succeed())
	// erin runs agents: config/rbac's editor role, which the built-in edit role aggregates.
	Expect(admin.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test-editors"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "toolnexus-agentrun-editor"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "erin"}},
	})).To(Succeed())
	for name, groups := range map[string][]string{"alice": nil, "bob": nil, "carol": nil, "vic": nil, "erin": nil, "admin": {"system:masters"}} {
		user, err := env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
		Expect(err).NotTo(HaveOccurred())
		kubeconfig, err := user.KubeConfig()
		Expect(err).NotTo(HaveOccurred())
		kubeconfigs[name] = filepath.Join(dir, name+".kubeconfig")
		Expect(os.WriteFile(kubeconfigs[name], kubeconfig, 0o600)).To(Succeed())
	}

	// The authorizer sees new bindings a moment after they are created: wait until it grants
	// what the specs use.
	By("waiting for RBAC to grant the answerers and the viewer their roles")
	for _, grant := range []authorizationv1.SubjectAccessReviewSpec{
		{User: "alice", ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "patch", Resource: "pendingrequests", Subresource: "status"}},
		{User: "bob", ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "patch", Resource: "pendingrequests", Subresource: "status"}},
		{User: "vic", ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: "agentrunrecords"}},
		{User: "vic", ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: "agents"}},
		{User: "erin", ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "create", Resource: "agentruns"}},
		{User: "erin", ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "patch", Resource: "agents"}},
	} {
		grant.ResourceAttributes.Group = toolnexusv1alpha1.GroupVersion.Group
		Eventually(func() (bool, error) {
			review := &authorizationv1.SubjectAccessReview{Spec: grant}
			err := admin.Create(ctx, review)
			return review.Status.Allowed, err
		}).WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(BeTrue(),
			"%s may %s %s", grant.User, grant.ResourceAttributes.Verb, grant.ResourceAttributes.Resource)
	}

	// A policy is enforced a moment after it is created: wait until both are.
	By("waiting until the approver rules are enforced")
	ns := newNamespace()
	Eventually(func() string {
		preq := newRequest(ns, "approval", approvers)
		_, stderr, _ := kubectlToolnexus("bob", "-n", ns, "approve", preq.Name)
		return stderr
	}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(ContainSubstring("user bob may not answer this request"))
	By("waiting until answers are stamped with who gave them")
	Eventually(func() (string, error) {
		preq := newRequest(ns, "approval", nil)
		if _, stderr, err := kubectlToolnexus("alice", "-n", ns, "approve", preq.Name); err != nil {
			return "", fmt.Errorf("%w: %s", err, stderr)
		}
		got := &toolnexusv1alpha1.PendingRequest{}
		err := admin.Get(ctx, client.ObjectKeyFromObject(preq), got)
		return got.Status.AnsweredBy, err
	}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Equal("alice"))
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

// kubectlToolnexus runs the plugin as user and returns its stdout, its stderr and its error.
func kubectlToolnexus(user string, args ...string) (string, string, error) {
	cmd := exec.Command(plugin, append([]string{"--kubeconfig", kubeconfigs[user]}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

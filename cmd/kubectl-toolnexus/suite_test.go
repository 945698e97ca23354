package main_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

var (
	testEnv *testenv.Env
	env     *envtest.Environment
	ctx     context.Context
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

	By("installing config/rbac and config/policies")
	testEnv = testenv.Start(GinkgoT(), testenv.Options{Install: []string{"rbac", "policies"}})
	env, admin = testEnv.Environment, testEnv.Client
	testEnv.Bind(GinkgoT(), "test-answerers", "toolnexus-answerer", testenv.Users("alice", "bob")...)
	// vic only views: config/rbac's viewer role, which the built-in view role aggregates.
	testEnv.Bind(GinkgoT(), "test-viewers", "toolnexus-agentrun-viewer", testenv.Users("vic")...)
	// erin runs agents: config/rbac's editor role, which the built-in edit role aggregates.
	testEnv.Bind(GinkgoT(), "test-editors", "toolnexus-agentrun-editor", testenv.Users("erin")...)
	users := map[string]*testenv.User{}
	for name, groups := range map[string][]string{"alice": nil, "bob": nil, "carol": nil, "vic": nil, "erin": nil, "admin": {"system:masters"}} {
		users[name] = testEnv.User(GinkgoT(), name, groups...)
		kubeconfigs[name] = users[name].Kubeconfig
	}

	// The authorizer sees new bindings a moment after they are created: wait until it grants
	// what the specs use.
	By("waiting for RBAC to grant the answerers and the viewer their roles")
	testEnv.WaitAllowed(GinkgoT(), users["alice"].User, testenv.Access("patch", "pendingrequests/status"))
	testEnv.WaitAllowed(GinkgoT(), users["bob"].User, testenv.Access("patch", "pendingrequests/status"))
	testEnv.WaitAllowed(GinkgoT(), users["vic"].User, testenv.Access("get", "agentrunrecords"), testenv.Access("get", "agents"))
	testEnv.WaitAllowed(GinkgoT(), users["erin"].User, testenv.Access("create", "agentruns"), testenv.Access("patch", "agents"))

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

// kubectlToolnexus runs the plugin as user and returns its stdout, its stderr and its error.
func kubectlToolnexus(user string, args ...string) (string, string, error) {
	cmd := exec.Command(plugin, append([]string{"--kubeconfig", kubeconfigs[user]}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

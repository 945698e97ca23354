// Package admission_test checks the admission policies of config/policies (who may answer or
// approve a PendingRequest, what an answer must carry, who answered and when, who requested a run)
// against a real API server, with the RBAC of config/rbac, acting as distinct authenticated users;
// and the operator's quorum room, run as the manager's ServiceAccount, behind those policies.
package admission_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

const (
	approverGroup = "purchasing-approvers"
	// escalationGroup approves only where a request's escalation step names it.
	escalationGroup = "purchasing-leads"
)

// managerUser and managerGroups are the manager's ServiceAccount, the subject config/rbac binds.
var managerUser, managerGroups = testenv.ManagerUser.Name, testenv.ManagerUser.Groups

var (
	testEnv *testenv.Env
	env     *envtest.Environment
	cfg     *rest.Config
	scheme  *runtime.Scheme
	ctx     context.Context

	// admin is system:masters; it creates the PendingRequests, as the controller would.
	admin client.Client
	// alice and bob may answer by RBAC (the toolnexus-answerer ClusterRole); carol through her
	// group, and lena through hers (escalationGroup); dave has no RBAC at all; erin gets
	// toolnexus-agentrun-editor where a test binds it; manager is the operator's ServiceAccount,
	// authenticated by a token the API server issued.
	alice, bob, carol, lena, dave, erin, manager client.Client
)

func TestAdmissionPolicies(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Admission policies (envtest)")
}

var _ = BeforeSuite(func() {
	ctx = context.Background()
	ctrl.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	// What `make install` applies, built the way it builds it (kubectl's embedded kustomize).
	testEnv = testenv.Start(GinkgoT(), testenv.Options{Install: []string{"rbac", "policies"}})
	env, cfg, scheme = testEnv.Environment, testEnv.Config, testEnv.Scheme
	admin = clientAs(envtest.User{Name: "admin", Groups: []string{"system:masters"}})

	// The people: answering is granted by the answerer ClusterRole, as an administrator would.
	testEnv.Bind(GinkgoT(), "test-answerers", "toolnexus-answerer",
		append(testenv.Users("alice", "bob"), testenv.Group(approverGroup), testenv.Group(escalationGroup))...)
	alice = clientAs(envtest.User{Name: "alice"})
	bob = clientAs(envtest.User{Name: "bob"})
	carol = clientAs(envtest.User{Name: "carol", Groups: []string{approverGroup}})
	lena = clientAs(envtest.User{Name: "lena", Groups: []string{escalationGroup}})
	dave = clientAs(envtest.User{Name: "dave"})
	erin = clientAs(envtest.User{Name: "erin"})
	manager = testEnv.Manager(GinkgoT()).Client

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
		{"lena", []string{escalationGroup}, "patch"},
		{managerUser, managerGroups, "patch"},
		{managerUser, managerGroups, "expire"},
		{managerUser, managerGroups, "quorum"},
		{managerUser, managerGroups, "oauth"},
		{managerUser, managerGroups, "manage"},
	} {
		Eventually(func() (bool, error) {
			return mayWriteStatus(grant.user, grant.groups, grant.verb, ns)
		}).WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(BeTrue(),
			"%s may %s pendingrequests/status", grant.user, grant.verb)
	}

	// A policy is enforced a moment after it is created: wait until the answer rules and both
	// stamps are.
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
	By("waiting for the MutatingAdmissionPolicy to stamp approval entries")
	Eventually(func() (time.Time, error) {
		preq := newRequestWith(ns, func(s *toolnexusv1alpha1.PendingRequestSpec) { s.Required = 2 })
		err := patchStatus(alice, preq, `{"status":{"approvals":[{"user":"alice","ok":true,"at":"2020-01-01T00:00:00Z"}]}}`)
		if err != nil || len(preq.Status.Approvals) != 1 || preq.Status.Approvals[0].At == nil {
			return time.Time{}, err
		}
		return preq.Status.Approvals[0].At.Time, nil
	}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(BeTemporally("~", time.Now(), 10*time.Second))
})

// clientAs provisions an authenticated user (a client certificate) and returns a client for it.
func clientAs(user envtest.User) client.Client {
	return testEnv.User(GinkgoT(), user.Name, user.Groups...).Client
}

// mayWriteStatus asks the authorizer whether user, in groups, may verb pendingrequests/status in
// namespace ns.
func mayWriteStatus(user string, groups []string, verb, ns string) (bool, error) {
	attrs := testenv.Access(verb, "pendingrequests/status")
	attrs.Namespace = ns
	return testEnv.Allowed(ctx, envtest.User{Name: user, Groups: groups}, attrs)
}

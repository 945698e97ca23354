// Package a2a_test shows A2A 1.0 in and out against a real API server: the gateway
// (internal/a2a/gateway, as cmd/a2a-gateway runs it) serves the Agents as the ServiceAccount and
// RBAC of config/a2a-gateway, people call it with their own Kubernetes bearer tokens (static
// token users of the API server, reviewed by TokenReview), the admission policies of
// config/policies decide who may answer, and the manager, as its own ServiceAccount, runs both the
// runs the gateway creates and runs whose tool is an agent served by the gateway.
package a2a_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/toolnexus/operator/internal/a2a"
	"github.com/toolnexus/operator/internal/a2a/gateway"
	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/internal/testenv/operator"
)

// tokenUser is a person the API server knows by a static bearer token.
type tokenUser struct {
	name, token string
	groups      []string
}

var (
	// alice is in the group purchasing, which approves the agents' purchases; bob is an answerer
	// but approves nothing; relay is the identity a manager's A2A tool calls the gateway with;
	// mallory claims system:masters, which the gateway never passes on.
	alice   = tokenUser{name: "alice", token: "alice-token-0123456789", groups: []string{"purchasing"}}
	bob     = tokenUser{name: "bob", token: "bob-token-0123456789"}
	relay   = tokenUser{name: "relay-a", token: "relay-token-0123456789"}
	mallory = tokenUser{name: "mallory", token: "mallory-token-0123456789", groups: []string{"system:masters"}}

	testEnv *testenv.Env
	ctx     = context.Background()
	// admin is system:masters, for setting up what a cluster admin would.
	admin client.Client
	// aliceKube is alice's own Kubernetes client (as kubectl would be).
	aliceKube client.Client
	// gw serves A2A at gwURL as the gateway's ServiceAccount.
	gw        *gateway.Gateway
	gwURL     string
	gwAccount *testenv.User
	toolnexus *operator.Manager
)

const eventually = 30 * time.Second

func TestA2A(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "A2A gateway and A2A tools (envtest, real users)")
}

var _ = BeforeSuite(func() {
	ctrl.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	tokens := filepath.Join(GinkgoT().TempDir(), "tokens.csv")
	var lines []string
	for _, u := range []tokenUser{alice, bob, relay, mallory} {
		lines = append(lines, fmt.Sprintf("%s,%s,%s,%q", u.token, u.name, u.name, strings.Join(u.groups, ",")))
	}
	Expect(os.WriteFile(tokens, []byte(strings.Join(lines, "\n")+"\n"), 0o600)).To(Succeed())
	testEnv = testenv.Start(GinkgoT(), testenv.Options{
		Install: []string{"rbac", "policies", "a2a-gateway"},
		Configure: func(env *envtest.Environment) {
			env.ControlPlane.GetAPIServer().Configure().Set("token-auth-file", tokens)
		},
	})
	admin = testEnv.Client
	// People: alice, bob and relay run agents and answer requests; mallory holds no role at all.
	for _, u := range []tokenUser{alice, bob, relay} {
		testEnv.Bind(GinkgoT(), u.name+"-editor", "toolnexus-agentrun-editor", testenv.Users(u.name)...)
		testEnv.Bind(GinkgoT(), u.name+"-answerer", "toolnexus-answerer", testenv.Users(u.name)...)
	}
	aliceKube = clientOf(alice)

	gwAccount = testEnv.ServiceAccount(GinkgoT(), testenv.ManagerNamespace, "toolnexus-a2a-gateway")
	testEnv.WaitAllowed(GinkgoT(), gwAccount.User,
		authorizationv1.ResourceAttributes{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews"},
		authorizationv1.ResourceAttributes{Verb: "impersonate", Resource: "users", Name: "alice"},
		authorizationv1.ResourceAttributes{Verb: "impersonate", Resource: "groups", Name: "purchasing"})
	for _, u := range []tokenUser{alice, bob, relay} {
		testEnv.WaitAllowed(GinkgoT(), envtest.User{Name: u.name, Groups: u.groups},
			testenv.Access("create", "agentruns"), testenv.Access("watch", "agentruns"), testenv.Access("patch", "pendingrequests/status"))
	}
	startGateway()

	toolnexus = operator.New(GinkgoT(), testEnv.Manager(GinkgoT()).Config, nil)
	toolnexus.Start(GinkgoT())
})

// startGateway serves the gateway on a loopback port, as cmd/a2a-gateway would, acting as its
// ServiceAccount.
func startGateway() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	gwURL = "http://" + l.Addr().String()
	gw, err = gateway.New(gateway.Options{Config: gwAccount.Config, Scheme: testEnv.Scheme, PublicURL: gwURL,
		BlockingTimeout: 20 * time.Second, Log: ctrl.Log.WithName("a2a-gateway")})
	Expect(err).NotTo(HaveOccurred())
	srv := &http.Server{Handler: gw.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	DeferCleanup(func() { _ = srv.Close() })
}

// clientOf is u's Kubernetes client: their bearer token and nothing else.
func clientOf(u tokenUser) client.Client {
	cfg := *testEnv.Config
	cfg.CertData, cfg.KeyData, cfg.BearerToken = nil, nil, u.token
	c, err := client.New(&cfg, client.Options{Scheme: testEnv.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// a2aClient is an A2A client of the agent namespace/name acting as u.
func a2aClient(u tokenUser, namespace, name string) *a2a.Client {
	return &a2a.Client{URL: gw.Endpoint(namespace, name), Header: http.Header{"Authorization": {"Bearer " + u.token}}}
}

func newNamespace() string {
	return testEnv.Namespace(GinkgoT(), "a2a-")
}

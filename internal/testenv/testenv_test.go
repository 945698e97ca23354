package testenv_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/toolnexus/operator/internal/testenv"
)

// whoami asks the API server, through kubectl and the user's kubeconfig, who the user is.
func whoami(t *testing.T, env *testenv.Env, u *testenv.User) string {
	t.Helper()
	out, err := exec.Command(env.Kubectl(), "--kubeconfig", u.Kubeconfig, "auth", "whoami").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl auth whoami as %s: %v\n%s", u.Name, err, out)
	}
	return string(out)
}

func TestUsersAreWhoTheyAreMade(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Install: []string{"rbac"}})

	carol := env.User(t, "carol", "approvers")
	if got := whoami(t, env, carol); !strings.Contains(got, "carol") || !strings.Contains(got, "approvers") {
		t.Errorf("carol's kubeconfig authenticates as:\n%s", got)
	}
	manager := env.Manager(t)
	if manager.Config.BearerToken == "" || manager.Config.CertData != nil {
		t.Errorf("the manager authenticates with a certificate, want its ServiceAccount's token")
	}
	if got := whoami(t, env, manager); !strings.Contains(got, testenv.ManagerUser.Name) || !strings.Contains(got, "system:serviceaccounts:"+testenv.ManagerNamespace) {
		t.Errorf("the manager's kubeconfig authenticates as:\n%s", got)
	}

	// config/rbac lets the manager write PendingRequest status, and gives carol nothing.
	patchStatus := testenv.Access("patch", "pendingrequests/status")
	env.WaitAllowed(t, manager.User, patchStatus)
	allowed, err := env.Allowed(context.Background(), carol.User, patchStatus)
	if err != nil || allowed {
		t.Errorf("carol may patch pendingrequests/status: %t, %v; want refused", allowed, err)
	}
	env.Bind(t, "carol-answers", "toolnexus-answerer", testenv.Group("approvers"))
	env.WaitAllowed(t, carol.User, patchStatus)

	ns := env.Namespace(t, "harness-")
	if !strings.HasPrefix(ns, "harness-") || len(ns) == len("harness-") {
		t.Errorf("namespace %q, want harness- and a suffix", ns)
	}
}

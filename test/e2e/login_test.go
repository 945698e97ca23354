//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolnexus/operator/internal/testenv/oauthtest"
)

// TestLogins is a login the operator completes, as a user meets it: the built manager runs as
// its ServiceAccount (config/rbac: the login store in its namespace, the verb oauth) behind the
// admission policies, a run applied with kubectl parks on an authorization request, a browser
// follows its url through a real authorization server to the manager's callback, and the run
// finishes with nobody patching anything; a second run of the same requester needs no login.
func TestLogins(t *testing.T) {
	st := newStack(t)
	bin, logs, clusterDir := st.bin, st.logs, st.cluster
	k := st.kubectl("logins")
	waitPolicies(t, k)

	callbackAddr := freeAddr(t)
	redirect := "http://" + callbackAddr + "/oauth/callback"
	as := oauthtest.StartAuthServer(t, oauthtest.AuthServerOptions{RedirectURIs: []string{redirect}, Iss: oauthtest.IssSent})
	calendar := oauthtest.StartHTTPResource(t, as, oauthtest.ResourceOptions{})
	modelAddr := freeAddr(t)
	model := startProcess(t, logs, "standin-model", nil, filepath.Join(bin, "standin-model"), "--addr", modelAddr)
	waitHTTP(t, model, "http://"+modelAddr+"/v1/models", 30*time.Second)
	manager := runManager(t, bin, logs, freeAddr(t),
		[]string{"KUBECONFIG=" + filepath.Join(clusterDir, "kubeconfig-manager"), "POD_NAMESPACE=toolnexus-system"},
		"--oauth-callback-bind-address="+callbackAddr, "--oauth-redirect-url="+redirect)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("manager log (tail):\n%s", manager.tail(60))
		}
	})

	k.must(t, "create", "namespace", "logins")
	k.must(t, "create", "secret", "generic", "llm", "--from-literal=apiKey=e2e-not-a-real-key")
	// The stand-in model calls the run's only tool with its prompt, then says what it returned.
	run := func(name string) string {
		return fmt.Sprintf(`apiVersion: toolnexus.dev/v1alpha1
kind: AgentRun
metadata: {name: %s}
spec:
  prompt: "who am I?"
  model: {name: standin, baseURL: http://%s/v1, apiKeySecretRef: {name: llm, key: apiKey}}
  tools:
  - name: whoami
    description: Tells who the calendar sees.
    parameters: {type: object, properties: {}}
    http:
      url: %s
      auth: {oauth: {clientID: %s}}
`, name, modelAddr, calendar.URL, as.ClientID)
	}
	if out, err := k.as("admin", run("first"), "apply", "-f", "-"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := k.as("admin", "", "wait", "--for=condition=Suspended", "--timeout=90s", "ar/first"); err != nil {
		t.Fatalf("%v\n%s", err, k.must(t, "get", "ar,preq", "-o", "wide"))
	}
	preq := k.must(t, "get", "ar", "first", "-o", "jsonpath={.status.pending[0].name}")
	k.must(t, "wait", "--for=create", "--timeout=30s", "preq/"+preq)
	if kind := k.must(t, "get", "preq", preq, "-o", "jsonpath={.spec.request.kind}"); kind != "authorization" {
		t.Fatalf("request kind = %q, want authorization", kind)
	}
	link := k.must(t, "get", "preq", preq, "-o", "jsonpath={.spec.request.url}")
	if !strings.HasPrefix(link, as.AuthorizationEndpoint()) {
		t.Fatalf("request url = %q, want the authorization server's authorize URL", link)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	final, page, err := oauthtest.Login(ctx, t, link, "alice", as.Password(t, "alice"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(final, redirect) || !strings.Contains(page, "You are signed in") {
		t.Fatalf("the browser ended at %s with %q, want the manager's callback saying it is signed in", final, page)
	}
	if _, err := k.as("admin", "", "wait", "--for=condition=Succeeded", "--timeout=90s", "ar/first"); err != nil {
		t.Fatalf("%v\n%s", err, k.must(t, "get", "ar,preq", "-o", "wide"))
	}
	if by := k.must(t, "get", "preq", preq, "-o", "jsonpath={.status.answeredBy}"); by != "system:oauth" {
		t.Errorf("answeredBy = %q, want system:oauth", by)
	}
	if text := k.must(t, "get", "ar", "first", "-o", "jsonpath={.status.text}"); !strings.Contains(text, "alice") {
		t.Errorf("the run's text = %q, want what the calendar said: alice", text)
	}

	if out, err := k.as("admin", run("second"), "apply", "-f", "-"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := k.as("admin", "", "wait", "--for=condition=Succeeded", "--timeout=90s", "ar/second"); err != nil {
		t.Fatalf("%v\n%s", err, k.must(t, "get", "ar,preq", "-o", "wide"))
	}
	if pending := k.must(t, "get", "preq", "-l", "toolnexus.dev/run=second", "-o", "name"); pending != "" {
		t.Errorf("the requester's second run asked again: %s", pending)
	}
	for _, tok := range calendar.Tokens() {
		if tok.Subject != "alice" || tok.Issuer != as.Issuer {
			t.Errorf("the calendar saw a token of %s from %s, want alice's from %s", tok.Subject, tok.Issuer, as.Issuer)
		}
	}
}

//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// subAgentStack is what the sub-agent test runs on: the local cluster with the policies, the
// stand-in model, the sample tools and the manager as its ServiceAccount.
type subAgentStack struct {
	k                    kubectl
	bin                  string
	modelAddr, toolsAddr string
	// manager is the running manager; startManager starts another.
	manager      *process
	startManager func()
}

func startSubAgentStack(t *testing.T) *subAgentStack {
	t.Helper()
	st := newStack(t)
	bin, logs, clusterDir := st.bin, st.logs, st.cluster
	s := &subAgentStack{k: st.kubectl("e2e-sub"), bin: bin,
		modelAddr: freeAddr(t), toolsAddr: freeAddr(t)}
	waitPolicies(t, s.k)
	model := startProcess(t, logs, "standin-model", nil, filepath.Join(bin, "standin-model"), "--addr", s.modelAddr)
	tools := startProcess(t, logs, "sample-tools", nil, filepath.Join(bin, "sample-tools"), "--addr", s.toolsAddr)
	waitHTTP(t, model, "http://"+s.modelAddr+"/v1/models", 30*time.Second)
	waitHTTP(t, tools, "http://"+s.toolsAddr+"/oauth/authorize", 30*time.Second)
	// The manager runs as its ServiceAccount: it creates the children with what config/rbac grants
	// it (the custom verb delegate among it), behind the admission policies.
	probeAddr := freeAddr(t)
	s.startManager = func() {
		s.manager = runManager(t, bin, logs, probeAddr, []string{"KUBECONFIG=" + filepath.Join(clusterDir, "kubeconfig-manager")})
	}
	s.startManager()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("manager log (tail):\n%s", s.manager.tail(60))
		}
	})
	s.k.must(t, "create", "namespace", s.k.namespace)
	s.k.must(t, "create", "secret", "generic", "llm", "--from-literal=apiKey=e2e-not-a-real-key")
	return s
}

// apply applies manifest, with the samples' addresses rewritten to the stack's, as admin.
func (s *subAgentStack) apply(t *testing.T, manifest string) {
	t.Helper()
	manifest = strings.NewReplacer(sampleModelURL, "http://"+s.modelAddr, sampleToolsURL, "http://"+s.toolsAddr).Replace(manifest)
	if out, err := s.k.as("admin", manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// sample reads config/samples/file; with agentsOnly, only its Agents.
func sample(t *testing.T, file string, agentsOnly bool) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(), "config", "samples", file))
	if err != nil {
		t.Fatal(err)
	}
	if !agentsOnly {
		return string(raw)
	}
	var agents []string
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		if strings.Contains(doc, "\nkind: Agent\n") {
			agents = append(agents, doc)
		}
	}
	return strings.Join(agents, "\n---\n")
}

// toolnexus runs the plugin as user (kubectl finds it on PATH), in the test namespace.
func (s *subAgentStack) toolnexus(t *testing.T, user string, args ...string) string {
	t.Helper()
	cmd := exec.Command(s.k.bin, append([]string{"toolnexus", "--kubeconfig", filepath.Join(s.k.dir, "kubeconfig-"+user), "-n", s.k.namespace}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+s.bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl toolnexus %s (as %s): %v\n%s", strings.Join(args, " "), user, err, out)
	}
	return string(out)
}

// childOf waits for the one run parent's sub-agent call created and returns its name.
func (s *subAgentStack) childOf(t *testing.T, parent string) string {
	t.Helper()
	var child string
	eventually(t, time.Minute, "the sub-agent call of "+parent+" creates one run", func() error {
		names := strings.Fields(s.k.must(t, "get", "ar", "-l", "toolnexus.dev/parent-run="+parent, "-o", "jsonpath={.items[*].metadata.name}"))
		if len(names) != 1 {
			return fmt.Errorf("children %v, want one", names)
		}
		child = names[0]
		return nil
	})
	return child
}

// waitReason waits until run's Succeeded condition has reason.
func (s *subAgentStack) waitReason(t *testing.T, run, reason string) {
	t.Helper()
	if _, err := s.k.as("admin", "", "wait", `--for=jsonpath={.status.conditions[?(@.type=="Succeeded")].reason}=`+reason,
		"--timeout=60s", "ar/"+run); err != nil {
		t.Fatalf("%v\n%s", err, s.k.must(t, "get", "ar", "-o", "wide"))
	}
}

// TestSubAgents walks a delegation with the built binaries: a run of an Agent whose tool is another
// Agent parks on the child's approval, which alice finds with kubectl toolnexus pending in the
// namespace, path and all, and approves with the command kubectl toolnexus show prints; the
// manager is killed while the child is parked; the parent finishes with the child's text.
// Cancelling or deleting a parent cancels its child, and an agent that calls itself stops at the
// depth bound.
func TestSubAgents(t *testing.T) {
	s := startSubAgentStack(t)
	k := s.k
	s.apply(t, sample(t, "approval-tool.yaml", true))
	s.apply(t, sample(t, "sub-agent.yaml", false))

	t.Run("the child's request surfaces at the root; alice approves it from kubectl toolnexus pending after a restart", func(t *testing.T) {
		if _, err := k.as("admin", "", "wait", "--for=condition=Suspended", "--timeout=90s", "ar/lab-order"); err != nil {
			t.Fatalf("%v\n%s", err, k.must(t, "get", "ar,preq", "-o", "wide"))
		}
		child := s.childOf(t, "lab-order")
		if got, want := k.must(t, "get", "ar", child, "-o", "jsonpath={.spec.requestedBy}"), k.must(t, "get", "ar", "lab-order", "-o", "jsonpath={.spec.requestedBy}"); got != want || got == "" {
			t.Errorf("the child's requester is %q, want the parent's, %q", got, want)
		}
		if got := k.must(t, "get", "ar", child, "-o", "jsonpath={.spec.delegatedBy.path}"); got != `["lab-order"]` {
			t.Errorf("spec.delegatedBy.path = %s", got)
		}
		var preq string
		eventually(t, time.Minute, "the root lists its child's request", func() error {
			preq = k.must(t, "get", "ar", "lab-order", "-o", `jsonpath={.status.pending[?(@.run=="`+child+`")].name}`)
			if preq == "" {
				return fmt.Errorf("status.pending: %s", k.must(t, "get", "ar", "lab-order", "-o", "jsonpath={.status.pending}"))
			}
			return nil
		})

		// The manager is killed while the child is parked: nothing is lost, no second child appears.
		s.manager.stop(syscall.SIGKILL)
		s.startManager()

		pending := s.toolnexus(t, "alice", "pending")
		if !strings.Contains(pending, preq) || !strings.Contains(pending, "lab-order → "+child) {
			t.Fatalf("kubectl toolnexus pending does not show %s with its path lab-order → %s:\n%s", preq, child, pending)
		}
		show := s.toolnexus(t, "alice", "show", preq)
		var approve string
		for _, line := range strings.Split(show, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "kubectl toolnexus approve ") {
				approve = strings.TrimSpace(line)
			}
		}
		if approve == "" || !strings.Contains(approve, "--uid ") || !strings.Contains(show, "Delegated:   lab-order → "+child) {
			t.Fatalf("kubectl toolnexus show prints no approve command bound to the uid, or no path:\n%s", show)
		}
		s.toolnexus(t, "alice", strings.Fields(strings.TrimPrefix(approve, "kubectl toolnexus "))...)

		waitSucceeded(t, k, "lab-order")
		wantText(t, k, "lab-order", "Stand-in model: buyer returned: Stand-in model: approve_purchase returned: purchase of gpu approved")
		if names := strings.Fields(k.must(t, "get", "ar", "-l", "toolnexus.dev/root-run=lab-order", "-o", "name")); len(names) != 1 {
			t.Errorf("runs under lab-order: %v, want its one child", names)
		}
		if by := k.must(t, "get", "preq", preq, "-o", "jsonpath={.status.answeredBy}"); by != "alice" {
			t.Errorf("answeredBy = %q, want alice", by)
		}
	})

	t.Run("cancelling or deleting the parent cancels the child", func(t *testing.T) {
		for _, parent := range []string{"lab-order-cancelled", "lab-order-deleted"} {
			s.apply(t, strings.Replace(sample(t, "sub-agent.yaml", false), "name: lab-order\n", "name: "+parent+"\n", 1))
			child := s.childOf(t, parent)
			if _, err := k.as("admin", "", "wait", "--for=condition=Suspended", "--timeout=60s", "ar/"+child); err != nil {
				t.Fatal(err)
			}
			if parent == "lab-order-cancelled" {
				k.must(t, "patch", "ar", parent, "--type=merge", "-p", `{"spec":{"cancel":true}}`)
				s.waitReason(t, parent, "Cancelled")
			} else {
				// This control plane runs no garbage collector: the child stays, cancelled.
				k.must(t, "delete", "ar", parent)
			}
			s.waitReason(t, child, "Cancelled")
			if _, err := k.as("admin", "", "wait", "--for=jsonpath={.status.phase}=Cancelled", "--timeout=30s", "preq", "-l", "toolnexus.dev/run="+child); err != nil {
				t.Errorf("%s: the child's request was not cancelled: %v", parent, err)
			}
		}
	})

	t.Run("an agent whose tool is itself stops at the depth bound", func(t *testing.T) {
		s.apply(t, `apiVersion: toolnexus.dev/v1alpha1
kind: Agent
metadata: {name: recursive}
spec:
  model: {name: toolnexus-standin, baseURL: `+sampleModelURL+`/v1, apiKeySecretRef: {name: llm, key: apiKey}}
  tools:
  - {name: again, description: Asks the same agent again, agentRef: {name: recursive}}
---
apiVersion: toolnexus.dev/v1alpha1
kind: AgentRun
metadata: {name: deep}
spec: {agentRef: {name: recursive}, prompt: look deeper}
`)
		waitSucceeded(t, k, "deep")
		wantText(t, k, "deep", "sub-agent calls go at most 4 deep, and this run is 4 deep (deep → ")
		if names := strings.Fields(k.must(t, "get", "ar", "-l", "toolnexus.dev/root-run=deep", "-o", "name")); len(names) != 4 {
			t.Errorf("runs under deep: %v, want 4 (the depth bound)", names)
		}
	})
}

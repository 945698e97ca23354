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

// The sample manifests name these fixed addresses (what `make dev` serves); the test rewrites
// them to its own free ports, so it runs beside a `make dev` and exercises the real samples.
const (
	sampleModelURL = "http://127.0.0.1:18080"
	sampleToolsURL = "http://127.0.0.1:18081"
)

// samples are the runs of config/samples (each file an Agent and a run of it) and what each one
// parks on.
var samples = []struct {
	file, run, kind string
}{
	{"approval-tool.yaml", "buy-gpu", "approval"},
	{"authorization.yaml", "read-calendar", "authorization"},
	{"input.yaml", "deploy-checkout", "input"},
	{"question.yaml", "tshirt-colour", "question"},
	{"approval-gate.yaml", "remove-user", "approval"},
	{"mcp-elicitation.yaml", "book-meeting", "input"},
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// TestFirstFiveMinutes walks the user's path through the whole product: the samples are
// applied, every run parks on a PendingRequest, approvers are enforced by the API server, the
// manager is SIGKILLed while runs are parked (and one is answered while it is down), and after a
// restart every run finishes with the text its answer implies.
func TestFirstFiveMinutes(t *testing.T) {
	start := time.Now()
	st := newStack(t)
	bin, logs, assetsDir, clusterDir := st.bin, st.logs, st.assets, st.cluster
	policies := exists(filepath.Join(repoRoot(), "config", "policies"))
	rbac := exists(filepath.Join(repoRoot(), "config", "rbac"))
	k := kubectl{bin: filepath.Join(assetsDir, "kubectl"), dir: clusterDir, namespace: "e2e"}
	if policies {
		waitPolicies(t, k)
		t.Logf("admission policies enforced after %s", time.Since(start).Round(time.Second))
	}

	modelAddr, toolsAddr := freeAddr(t), freeAddr(t)
	model := startProcess(t, logs, "standin-model", nil, filepath.Join(bin, "standin-model"), "--addr", modelAddr)
	tools := startProcess(t, logs, "sample-tools", nil, filepath.Join(bin, "sample-tools"), "--addr", toolsAddr)
	waitHTTP(t, model, "http://"+modelAddr+"/v1/models", 30*time.Second)
	waitHTTP(t, tools, "http://"+toolsAddr+"/oauth/authorize", 30*time.Second)

	// The manager runs as its ServiceAccount, a token-file user with the ServiceAccount's name and
	// groups, so the permissions config/rbac grants are the ones it has.
	managerKubeconfig := filepath.Join(clusterDir, "kubeconfig-manager")
	if !rbac {
		t.Log("config/rbac is absent: the manager runs as admin")
		managerKubeconfig = filepath.Join(clusterDir, "kubeconfig")
	}
	probeAddr := freeAddr(t)
	startManager := func() *process {
		return runManager(t, bin, logs, probeAddr, []string{"KUBECONFIG=" + managerKubeconfig})
	}
	manager := startManager()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("manager log (tail):\n%s", manager.tail(40))
			t.Logf("sample-tools log (tail):\n%s", tools.tail(20))
		}
	})

	k.must(t, "create", "namespace", "e2e")
	k.must(t, "create", "secret", "generic", "llm", "--from-literal=apiKey=e2e-not-a-real-key")

	t.Run("every sample parks on a PendingRequest of its kind", func(t *testing.T) {
		runs := []string{"wait", "--for=condition=Suspended", "--timeout=90s"}
		for _, s := range samples {
			raw, err := os.ReadFile(filepath.Join(repoRoot(), "config", "samples", s.file))
			if err != nil {
				t.Fatal(err)
			}
			manifest := strings.NewReplacer(sampleModelURL, "http://"+modelAddr, sampleToolsURL, "http://"+toolsAddr).Replace(string(raw))
			if out, err := k.as("admin", manifest, "apply", "-f", "-"); err != nil {
				t.Fatalf("applying %s: %v\n%s", s.file, err, out)
			}
			runs = append(runs, "ar/"+s.run)
		}
		if _, err := k.as("admin", "", runs...); err != nil {
			t.Fatalf("%v\n%s", err, k.must(t, "get", "ar,preq", "-o", "wide"))
		}
		// A run's status and its PendingRequest are separate writes of the manager: wait for both.
		for _, s := range samples {
			if _, err := k.as("admin", "", "wait", "--for=create", "--timeout=30s", "preq/"+preqName(s.run)); err != nil {
				t.Fatalf("%v\n%s", err, k.must(t, "get", "ar,preq", "-o", "wide"))
			}
		}
		for _, s := range samples {
			if got := k.must(t, "get", "preq", preqName(s.run), "-o", "jsonpath={.spec.request.kind}"); got != s.kind {
				t.Errorf("%s: request kind = %q, want %q", s.run, got, s.kind)
			}
		}
		if url := k.must(t, "get", "preq", preqName("read-calendar"), "-o", "jsonpath={.spec.request.url}"); !strings.Contains(url, "/oauth/authorize?auth_id=calendar-friday") {
			t.Errorf("read-calendar: request url = %q, want the tool's auth_url", url)
		}
		if id := k.must(t, "get", "preq", preqName("remove-user"), "-o", "jsonpath={.spec.request.id}"); !strings.HasPrefix(id, "toolguard:") {
			t.Errorf("remove-user: request id = %q, want an approval gate's toolguard:<call id>", id)
		}
		if schema := k.must(t, "get", "preq", preqName("book-meeting"), "-o", "jsonpath={.spec.request.data.schema.required}"); !strings.Contains(schema, "time") {
			t.Errorf("book-meeting: data.schema.required = %q, want the form's required field time", schema)
		}
		out := k.must(t, "get", "preq")
		for _, col := range []string{"RUN", "KIND", "PHASE", "PROMPT"} {
			if !strings.Contains(out, col) {
				t.Errorf("kubectl get preq has no %s column:\n%s", col, out)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("only approvers may answer, and an answer must carry a result", func(t *testing.T) {
		if !policies {
			t.Skip("config/policies is absent")
		}
		approve := `{"status":{"answer":{"ok":true}}}`
		for _, run := range []string{"buy-gpu", "remove-user"} {
			_, err := k.as("bob", "", "patch", "preq", preqName(run), "--subresource=status", "--type=merge", "-p", approve)
			if err == nil || !strings.Contains(err.Error(), "may not answer") {
				t.Errorf("%s: bob's answer: err = %v, want a refusal naming the approvers", run, err)
			}
		}
		_, err := k.as("admin", "", "patch", "preq", preqName("deploy-checkout"), "--subresource=status", "--type=merge", "-p", approve)
		if err == nil {
			t.Error("deploy-checkout: an input answer without data.output was accepted")
		}
	})

	t.Run("an approver's answer resumes the run", func(t *testing.T) {
		answer(t, k, "alice", "buy-gpu", `{"ok":true}`)
		waitSucceeded(t, k, "buy-gpu")
		wantText(t, k, "buy-gpu", "Stand-in model: approve_purchase returned: purchase of gpu approved")
		if by := k.must(t, "get", "preq", preqName("buy-gpu"), "-o", "jsonpath={.status.answeredBy}"); by != "alice" {
			t.Errorf("answeredBy = %q, want alice (stamped by the API server)", by)
		}
	})

	t.Run("parked runs survive SIGKILL of the manager", func(t *testing.T) {
		manager.stop(syscall.SIGKILL)
		// Answered while no manager runs: the answer waits in the API server.
		answer(t, k, "admin", "deploy-checkout", `{"ok":true,"data":{"output":"staging"}}`)
		answer(t, k, "admin", "read-calendar", `{"ok":true}`)
		manager = startManager()
		answer(t, k, "admin", "tshirt-colour", `{"ok":true,"data":{"colour":"teal"}}`)
		answer(t, k, "alice", "remove-user", `{"ok":false,"reason":"declined"}`)
		answer(t, k, "admin", "book-meeting", `{"ok":true,"data":{"time":"2026-12-01 10:00"}}`)
		for _, s := range samples[1:] {
			waitSucceeded(t, k, s.run)
		}
		wantText(t, k, "deploy-checkout", "Stand-in model: deploy returned: deployed checkout to staging")
		wantText(t, k, "read-calendar", "Stand-in model: calendar returned: events on friday: ")
		wantText(t, k, "tshirt-colour", `Stand-in model: question returned: {"colour":"teal"}`)
		wantText(t, k, "remove-user", "Stand-in model: delete_user returned: declined/expired: ")
		wantText(t, k, "remove-user", "\nreason: declined")
		wantText(t, k, "book-meeting", "Stand-in model: sample_book_meeting returned: meeting about budget booked for 2026-12-01 10:00")
		// One PendingRequest per suspended call, restart or not.
		if names := strings.Fields(k.must(t, "get", "preq", "-o", "name")); len(names) != len(samples) {
			t.Errorf("PendingRequests = %v, want one per sample (%d)", names, len(samples))
		}
		if _, err := k.as("admin", "", "wait", "--for=condition=Resolved", "preq", "--all", "--timeout=30s"); err != nil {
			t.Errorf("not every answer was consumed: %v", err)
		}
		// A declined gate means the tool never ran.
		raw, _ := os.ReadFile(tools.log)
		if strings.Contains(string(raw), "path=/delete_user") {
			t.Error("delete_user was called although its approval was declined")
		}
	})

	t.Run("an unanswered request expires as system:expired with the policies installed", func(t *testing.T) {
		raw, err := os.ReadFile(filepath.Join(repoRoot(), "config", "samples", "approval-tool.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		manifest := strings.NewReplacer(sampleModelURL, "http://"+modelAddr, sampleToolsURL, "http://"+toolsAddr,
			"name: buy-gpu", "name: buy-gpu-unattended", "name: purchasing", "name: purchasing-unattended",
			"timeout: 24h", "timeout: 3s").Replace(string(raw))
		if out, err := k.as("admin", manifest, "apply", "-f", "-"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		waitSucceeded(t, k, "buy-gpu-unattended")
		wantText(t, k, "buy-gpu-unattended", "declined/expired: ")
		wantText(t, k, "buy-gpu-unattended", "\nreason: expired")
		if by := k.must(t, "get", "preq", preqName("buy-gpu-unattended"), "-o", "jsonpath={.status.answeredBy}"); by != "system:expired" {
			t.Errorf("answeredBy = %q, want system:expired", by)
		}
		// The manager writes the request's phase after the expiry answer the run consumed.
		if _, err := k.as("admin", "", "wait", "--for=jsonpath={.status.phase}=Expired", "--timeout=30s",
			"preq/"+preqName("buy-gpu-unattended")); err != nil {
			t.Errorf("phase: %v", err)
		}
	})

	t.Run("a gate's approval, then the tool's own login, then data", func(t *testing.T) {
		raw, err := os.ReadFile(filepath.Join(repoRoot(), "config", "samples", "authorization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		// The calendar tool answers auth_required on its first run; here its Agent also gates it.
		manifest := strings.NewReplacer(sampleModelURL, "http://"+modelAddr, sampleToolsURL, "http://"+toolsAddr,
			"name: read-calendar", "name: gated-calendar", "name: calendar-assistant", "name: gated-calendar-assistant",
			"\n---\n", "\n  approvals: [{tools: [calendar]}]\n  suspension: {approvers: {users: [alice]}}\n---\n").Replace(string(raw))
		if out, err := k.as("admin", manifest, "apply", "-f", "-"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if _, err := k.as("admin", "", "wait", "--for=create", "--timeout=60s", "preq/"+preqName("gated-calendar")); err != nil {
			t.Fatal(err)
		}
		if kind := k.must(t, "get", "preq", preqName("gated-calendar"), "-o", "jsonpath={.spec.request.kind}"); kind != "approval" {
			t.Fatalf("first request kind = %q, want approval", kind)
		}
		answer(t, k, "alice", "gated-calendar", `{"ok":true}`)
		// The approved tool runs for the first time and asks for a login: a second request.
		var login string
		deadline := time.Now().Add(60 * time.Second)
		for login == "" && time.Now().Before(deadline) {
			out := k.must(t, "get", "preq", "-l", "toolnexus.dev/run=gated-calendar",
				"-o", `jsonpath={range .items[?(@.spec.request.kind=="authorization")]}{.metadata.name}{end}`)
			login = strings.TrimSpace(out)
			time.Sleep(200 * time.Millisecond)
		}
		if login == "" {
			t.Fatalf("no authorization request after the approval:\n%s", k.must(t, "get", "ar,preq", "-o", "wide"))
		}
		if _, err := k.as("alice", "", "patch", "preq", login, "--subresource=status", "--type=merge",
			"-p", `{"status":{"answer":{"ok":true}}}`); err != nil {
			t.Fatal(err)
		}
		waitSucceeded(t, k, "gated-calendar")
		wantText(t, k, "gated-calendar", "Stand-in model: calendar returned: events on friday: ")
	})

	t.Run("a run author runs an Agent with kubectl toolnexus run --wait; an approver answers", func(t *testing.T) {
		// bob authors runs in the namespace: config/rbac's editor role, bound there.
		k.must(t, "create", "rolebinding", "bob-runs-agents", "--clusterrole=toolnexus-agentrun-editor", "--user=bob")
		eventually(t, time.Minute, "RBAC lets bob create runs", func() error {
			out, err := k.as("admin", "", "auth", "can-i", "create", "agentruns.toolnexus.dev", "--as=bob")
			if err != nil || strings.TrimSpace(out) != "yes" {
				return fmt.Errorf("can-i: %q, %v", out, err)
			}
			return nil
		})
		var stdout, stderr strings.Builder
		cmd := exec.Command(k.bin, "toolnexus", "--kubeconfig", filepath.Join(k.dir, "kubeconfig-bob"), "-n", k.namespace,
			"run", "purchasing", "buy a gpu", "--wait", "--timeout", "2m")
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		t.Cleanup(func() { _ = cmd.Process.Kill() })

		var run string
		eventually(t, time.Minute, "the run of purchasing parks on its approval", func() error {
			out := k.must(t, "get", "ar", "-o", `jsonpath={range .items[?(@.spec.agentRef.name=="purchasing")]}{.metadata.name}{"\n"}{end}`)
			for _, name := range strings.Fields(out) {
				if strings.HasPrefix(name, "purchasing-") {
					run = name
				}
			}
			if run == "" {
				return fmt.Errorf("no run of purchasing yet; plugin stderr: %s", stderr.String())
			}
			_, err := k.as("admin", "", "get", "preq", preqName(run))
			return err
		})
		select {
		case err := <-exited:
			t.Fatalf("kubectl toolnexus run --wait returned while the run was suspended: %v\n%s%s", err, stdout.String(), stderr.String())
		default:
		}
		if agent := k.must(t, "get", "ar", run, "-o", "jsonpath={.status.agent.name}/{.status.agent.generation}"); !strings.HasPrefix(agent, "purchasing/") {
			t.Errorf("status.agent = %q, want purchasing/<generation>", agent)
		}
		answer(t, k, "alice", run, `{"ok":true}`)
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("kubectl toolnexus run --wait: %v\n%s%s", err, stdout.String(), stderr.String())
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("kubectl toolnexus run --wait did not return after the run finished:\n%s", k.must(t, "get", "ar", run, "-o", "yaml"))
		}
		for _, want := range []string{"agentrun.toolnexus.dev/" + run + " created\n", "agentrun.toolnexus.dev/" + run + " Succeeded\n"} {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("stdout = %q, want it to contain %q", stdout.String(), want)
			}
		}
		wantText(t, k, run, "Stand-in model: approve_purchase returned: purchase of gpu approved")
	})
	t.Logf("e2e took %s", time.Since(start).Round(time.Second))
}

// preqName is the deterministic name of a run's first-turn request: run, turn, call id. The
// stand-in model numbers its calls call_<turn>.
func preqName(run string) string { return run + "-1-call-1" }

func answer(t *testing.T, k kubectl, user, run, answerJSON string) {
	t.Helper()
	if _, err := k.as(user, "", "patch", "preq", preqName(run), "--subresource=status", "--type=merge",
		"-p", `{"status":{"answer":`+answerJSON+`}}`); err != nil {
		t.Fatal(err)
	}
}

func waitSucceeded(t *testing.T, k kubectl, run string) {
	t.Helper()
	if _, err := k.as("admin", "", "wait", "--for=condition=Succeeded", "--timeout=60s", "ar/"+run); err != nil {
		t.Fatalf("%v\n%s", err, k.must(t, "get", "ar", run, "-o", "yaml"))
	}
}

func wantText(t *testing.T, k kubectl, run, want string) {
	t.Helper()
	if got := k.must(t, "get", "ar", run, "-o", "jsonpath={.status.text}"); !strings.Contains(got, want) {
		t.Errorf("%s: status.text = %q, want it to contain %q", run, got, want)
	}
}

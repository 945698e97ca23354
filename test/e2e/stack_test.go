//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolnexus/operator/internal/testenv"
)

// repoRoot is the repository's root directory.
var repoRoot = testenv.RepoRoot

// assets is the directory holding etcd, kube-apiserver and kubectl.
func assets(t *testing.T) string {
	t.Helper()
	dir, err := testenv.Assets()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// buildBinaries builds what a user runs into dir, with the go command the test runs under.
func buildBinaries(t *testing.T, dir string) {
	t.Helper()
	if _, err := testenv.Build(dir, "./cmd/manager", "./cmd/standin-model", "./cmd/sample-tools", "./cmd/kubectl-toolnexus", "./hack/localcluster"); err != nil {
		t.Fatal(err)
	}
}

// stack is what most e2e tests start with: the binaries built, a local cluster up, and the
// directories they live in.
type stack struct {
	bin, logs, assets, cluster string
}

// newStack builds the binaries and starts a local cluster for t, logging how long each took.
func newStack(t *testing.T) stack {
	t.Helper()
	start := time.Now()
	tmp := t.TempDir()
	s := stack{bin: filepath.Join(tmp, "bin"), logs: filepath.Join(tmp, "logs")}
	for _, d := range []string{s.bin, s.logs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s.assets = assets(t)
	buildBinaries(t, s.bin)
	t.Logf("built the binaries in %s", time.Since(start).Round(time.Second))
	s.cluster = startCluster(t, s.bin, filepath.Join(tmp, "cluster"), s.logs, s.assets)
	t.Logf("local cluster ready after %s", time.Since(start).Round(time.Second))
	return s
}

// kubectl is the real kubectl against the stack's cluster, in namespace.
func (s stack) kubectl(namespace string) kubectl {
	return kubectl{bin: filepath.Join(s.assets, "kubectl"), dir: s.cluster, namespace: namespace}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := testenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// process is a binary the test started; its output goes to logs/<name>.log.
type process struct {
	name, log string
	cmd       *exec.Cmd
	done      chan struct{}
}

func startProcess(t *testing.T, logDir, name string, env []string, bin string, args ...string) *process {
	t.Helper()
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	// Nothing outlives the test binary, even when it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &process{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = f.Close(); close(p.done) }()
	t.Cleanup(func() { p.stop(syscall.SIGTERM) })
	return p
}

// stop sends sig and waits for the process to exit (SIGKILL after 15s).
func (p *process) stop(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// tail returns the last lines of the process's log, for failure messages.
func (p *process) tail(lines int) string {
	raw, _ := os.ReadFile(p.log)
	all := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// runManager starts the manager binary of bin as the test runs it (probes on probeAddr, no
// metrics, no leader election), with env and extra args, and waits until it is ready.
func runManager(t *testing.T, bin, logDir, probeAddr string, env []string, args ...string) *process {
	t.Helper()
	m := startProcess(t, logDir, "manager", env, filepath.Join(bin, "manager"), append([]string{
		"--health-probe-bind-address=" + probeAddr, "--metrics-bind-address=0", "--leader-elect=false"}, args...)...)
	waitHTTP(t, m, "http://"+probeAddr+"/readyz", 60*time.Second)
	return m
}

// waitHTTP waits until url answers 200, failing early when p exits.
func waitHTTP(t *testing.T, p *process, url string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if p.exited() {
			t.Fatalf("%s exited before %s answered:\n%s", p.name, url, p.tail(30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s did not answer %s within %s:\n%s", p.name, url, timeout, p.tail(30))
}

// startCluster runs hack/localcluster (etcd, kube-apiserver, users, the installed manifests) and
// returns its directory once it has printed "ready".
func startCluster(t *testing.T, bin, dir, logDir, assetsDir string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, "localcluster"), "--dir", dir, "--assets", assetsDir,
		"--repo", repoRoot(), "--apiserver-port", "0", "--etcd-port", "0")
	logFile, err := os.Create(filepath.Join(logDir, "localcluster.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(ready)
			}
		}
		done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
		_ = logFile.Close()
	})
	select {
	case <-ready:
		return dir
	case err := <-done:
		raw, _ := os.ReadFile(filepath.Join(logDir, "localcluster.log"))
		t.Fatalf("the local cluster exited (%v):\n%s", err, raw)
	case <-time.After(3 * time.Minute):
		t.Fatal("the local cluster was not ready within 3 minutes")
	}
	return ""
}

// kubectl runs the real kubectl as one of the cluster's users.
type kubectl struct {
	bin, dir, namespace string
}

// as runs kubectl with user's kubeconfig ("admin", "alice", "bob") in the test namespace.
func (k kubectl) as(user string, stdin string, args ...string) (string, error) {
	kc := filepath.Join(k.dir, "kubeconfig")
	if user != "admin" {
		kc += "-" + user
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// A discovery cache of the cluster's own: one another run left for the same address would not
	// know this cluster's CRDs.
	cache := filepath.Join(k.dir, "kubectl-cache")
	cmd := exec.CommandContext(ctx, k.bin, append([]string{"--kubeconfig", kc, "--cache-dir", cache, "-n", k.namespace}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			err = fmt.Errorf("kubectl %s (as %s): exit %d: %s", strings.Join(args, " "), user, exit.ExitCode(), strings.TrimSpace(string(out)))
		}
	}
	return string(out), err
}

// must runs kubectl as admin and fails the test on error.
func (k kubectl) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := k.as("admin", "", args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// eventually calls f until it returns nil, and fails the test with f's last error when that takes
// longer than timeout: for what the API server or the manager publishes a moment after the write
// that causes it.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitPolicies waits until the API server enforces config/policies, which it does a moment after
// they are installed: bob, whom RBAC lets answer, is refused a request only alice may answer, and
// alice's answer is stamped with her name. The probes run in a namespace of their own.
func waitPolicies(t *testing.T, k kubectl) {
	t.Helper()
	probe := kubectl{bin: k.bin, dir: k.dir, namespace: "e2e-policy-probe"}
	probe.must(t, "create", "namespace", probe.namespace)
	newRequest := func(approvers string) (string, error) {
		manifest := `apiVersion: toolnexus.dev/v1alpha1
kind: PendingRequest
metadata: {generateName: probe-}
spec:
  runRef: {name: probe}
  toolCall: {id: call_1, name: probe, arguments: "{}"}
  request: {id: probe-1, kind: approval, prompt: "May the probe run?"}
` + approvers
		out, err := probe.as("admin", manifest, "create", "-f", "-", "-o", "name")
		return strings.TrimSpace(out), err
	}
	approve := `{"status":{"answer":{"ok":true},"answeredBy":"forged"}}`
	eventually(t, time.Minute, "the policies refuse bob", func() error {
		preq, err := newRequest("  approvers: {users: [alice]}\n")
		if err != nil {
			return err
		}
		_, err = probe.as("bob", "", "patch", preq, "--subresource=status", "--type=merge", "-p", approve)
		if err == nil || !strings.Contains(err.Error(), "may not answer") {
			return fmt.Errorf("bob's answer: err = %v, want a refusal naming the approvers", err)
		}
		return nil
	})
	eventually(t, time.Minute, "the policies stamp who answered", func() error {
		preq, err := newRequest("")
		if err != nil {
			return err
		}
		if _, err := probe.as("alice", "", "patch", preq, "--subresource=status", "--type=merge", "-p", approve); err != nil {
			return err
		}
		by, err := probe.as("admin", "", "get", preq, "-o", "jsonpath={.status.answeredBy}")
		if err == nil && by != "alice" {
			err = fmt.Errorf("answeredBy = %q, want alice", by)
		}
		return err
	})
}

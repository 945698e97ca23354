//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPrintedCommands pastes what `make dev` and `make demo` print for a person into a shell, as
// printed: hack/dev.sh runs a stack of its own (its own directory and free ports, beside any
// `make dev`), the commands its message lists run in a fresh bash in another directory, and
// then hack/demo.sh runs its story against that stack and the commands it printed are pasted
// again afterwards.
func TestPrintedCommands(t *testing.T) {
	start := time.Now()
	tmp := t.TempDir()
	logs := filepath.Join(tmp, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	dev := filepath.Join(tmp, "dev")
	env := append(personEnv(),
		"TOOLNEXUS_DEV_DIR="+dev,
		"TOOLNEXUS_MODEL_ADDR="+freeAddr(t), "TOOLNEXUS_TOOLS_ADDR="+freeAddr(t),
		"TOOLNEXUS_PROBE_ADDR="+freeAddr(t), "TOOLNEXUS_METRICS_ADDR="+freeAddr(t), "TOOLNEXUS_OAUTH_ADDR="+freeAddr(t),
		"TOOLNEXUS_APISERVER_PORT=0", "TOOLNEXUS_ETCD_PORT=0")

	message := runDev(t, env, logs)
	t.Logf("make dev's stack ready after %s", time.Since(start).Round(time.Second))
	script, err := pastedBlock(message)
	if err != nil {
		t.Fatalf("%v:\n%s", err, message)
	}
	admin := kubectl{bin: filepath.Join(dev, "path", "kubectl"), dir: dev, namespace: "default"}

	t.Run("the commands make dev prints work pasted as printed", func(t *testing.T) {
		if !strings.Contains(script, "toolnexus approve") || !strings.Contains(script, "--uid") {
			t.Fatalf("make dev prints no approval bound to a uid:\n%s", script)
		}
		out := paste(t, t.TempDir(), script)
		for _, want := range []string{"agentrun.toolnexus.dev/buy-gpu condition met", " approved\n",
			"Stand-in model: approve_purchase returned: purchase of gpu approved"} {
			if !strings.Contains(out, want) {
				t.Errorf("the pasted commands printed no %q:\n%s", want, out)
			}
		}
		got := admin.must(t, "get", "preq", "-l", "toolnexus.dev/run=buy-gpu",
			"-o", "jsonpath={.items[0].metadata.uid} {.items[0].status.answer.requestUID} {.items[0].status.answeredBy}")
		f := strings.Fields(got)
		if len(f) != 3 || f[0] != f[1] || f[2] != "alice" {
			t.Errorf("uid, answer.requestUID, answeredBy = %q: want alice's answer bound to the request's uid", got)
		}
	})

	t.Run("the commands make demo prints work pasted as printed", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(repoRoot(), "hack", "demo.sh"))
		cmd.Env = env
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("hack/demo.sh: %v\n%s\n%s", err, stdout.String(), stderr.String())
		}
		if !strings.Contains(stderr.String(), "Using the stack 'make dev' is running") {
			t.Fatalf("the demo did not use the running stack:\n%s", stderr.String())
		}
		envLine, commands, err := demoCommands(stdout.String())
		if err != nil {
			t.Fatalf("%v:\n%s", err, stdout.String())
		}
		printed := strings.Join(commands, "\n")
		for _, want := range []*regexp.Regexp{
			regexp.MustCompile(`(?m)^kubectl toolnexus approve \S+ -n \S+ --uid [0-9a-f-]{36} --kubeconfig `),
			regexp.MustCompile(`(?m)^kubectl --kubeconfig \S+ -n \S+ patch preq \S+ .*"requestUID":"[0-9a-f-]{36}"`),
		} {
			if !want.MatchString(printed) {
				t.Errorf("the demo printed no command matching %s:\n%s", want.String(), printed)
			}
		}
		// The demo ran every command from the text it printed; what reads the cluster is pasted
		// again now, in a shell of its own, from the repository as the demo says.
		script := envLine
		for _, c := range commands {
			if readOnly(c) {
				script += "\n" + c
			}
		}
		if strings.Count(script, "\n") < 6 {
			t.Fatalf("too few commands to paste again:\n%s", script)
		}
		out := paste(t, repoRoot(), script)
		for _, want := range []string{"Succeeded", "answeredBy=alice requestUID=", "  For UID:   "} {
			if !strings.Contains(out, want) {
				t.Errorf("the pasted demo commands printed no %q:\n%s", want, out)
			}
		}
	})
}

// personEnv is the environment of a person's shell on this machine: nothing that points at
// another cluster or a real model.
func personEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "KUBECONFIG" || strings.HasPrefix(name, "OPENAI_") || strings.HasPrefix(name, "ANTHROPIC_") ||
			strings.HasPrefix(name, "TOOLNEXUS_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// runDev starts hack/dev.sh and returns what it printed once its message is complete; the stack
// is stopped as `make dev` is, by a signal its trap handles, when the test ends.
func runDev(t *testing.T, env []string, logs string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(repoRoot(), "hack", "dev.sh"))
	cmd.Env = env
	stderr, err := os.Create(filepath.Join(logs, "dev.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Its own process group, so that what it started can be found if it does not stop; and a
	// TERM, which it traps to stop the stack, should the test binary die first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(90 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		_ = stderr.Close()
		if t.Failed() {
			raw, _ := os.ReadFile(filepath.Join(logs, "dev.log"))
			t.Logf("hack/dev.sh stderr:\n%s", raw)
		}
	})
	var out strings.Builder
	// The first build of the binaries and the control plane's start take minutes on 2 cores.
	timeout := time.After(15 * time.Minute)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				raw, _ := os.ReadFile(filepath.Join(logs, "dev.log"))
				t.Fatalf("hack/dev.sh exited before its message:\n%s\n%s", out.String(), raw)
			}
			out.WriteString(line + "\n")
			if strings.HasPrefix(line, "Users: ") {
				return out.String()
			}
		case <-timeout:
			t.Fatalf("hack/dev.sh printed no message within 15 minutes:\n%s", out.String())
		}
	}
}

// pastedBlock is what make dev's message tells a person to paste: the indented lines between
// "In another terminal" and "Users:", as one script.
func pastedBlock(message string) (string, error) {
	_, after, ok := strings.Cut(message, "\nIn another terminal")
	if !ok {
		return "", fmt.Errorf("the message has no \"In another terminal\"")
	}
	block, _, ok := strings.Cut(after, "\nUsers: ")
	if !ok {
		return "", fmt.Errorf("the message has no \"Users:\" after the commands")
	}
	var script []string
	for _, line := range strings.Split(block, "\n")[1:] {
		if cmd, ok := strings.CutPrefix(line, "  "); ok && strings.TrimSpace(cmd) != "" {
			script = append(script, cmd)
		}
	}
	if len(script) < 5 {
		return "", fmt.Errorf("the message lists %d commands", len(script))
	}
	return strings.Join(script, "\n"), nil
}

// demoCommand is a command line the demo printed: dim, after "$ ".
var demoCommand = regexp.MustCompile(`(?m)^\x1b\[2m\$ (.*)\x1b\[0m$`)

// demoCommands are the export line the demo says to run first, and the commands it printed.
func demoCommands(out string) (string, []string, error) {
	_, after, ok := strings.Cut(out, "in a shell that ran:\n")
	if !ok {
		return "", nil, fmt.Errorf("the demo says nothing of the shell its commands need")
	}
	envLine, _, _ := strings.Cut(after, "\n")
	var commands []string
	for _, m := range demoCommand.FindAllStringSubmatch(out, -1) {
		commands = append(commands, m[1])
	}
	if len(commands) < 8 {
		return "", nil, fmt.Errorf("the demo printed %d commands", len(commands))
	}
	return strings.TrimSpace(envLine), commands, nil
}

// readOnly reports whether a printed command only reads the cluster (get, wait, describe, show),
// so that pasting it again after the demo gives what it gave then; a wait for the suspension the
// run has left since is not.
func readOnly(command string) bool {
	words := strings.Fields(command)
	if strings.Contains(command, "--for=condition=Suspended") {
		return false
	}
	for i := 1; i < len(words); i++ {
		switch w := words[i]; {
		case w == "-n" || w == "--kubeconfig":
			i++
		case strings.HasPrefix(w, "-"):
		case w == "toolnexus":
			return i+1 < len(words) && words[i+1] == "show"
		default:
			return w == "get" || w == "wait" || w == "describe"
		}
	}
	return false
}

// paste runs script in a fresh bash in dir, stopping at the first command that fails, as a
// person's terminal would show it.
func paste(t *testing.T, dir, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir, cmd.Env = dir, personEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pasting:\n%s\nfailed: %v\n%s", script, err, out)
	}
	return string(out)
}

//go:build chaos

package chaos

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/toolnexus/operator/internal/testenv"
)

// buildManager builds ./cmd/manager into dir with the go command the test runs under.
func buildManager(dir string) (string, error) {
	if _, err := testenv.Build(dir, "./cmd/manager"); err != nil {
		return "", err
	}
	return filepath.Join(dir, "manager"), nil
}

func freePort(t *testing.T) string {
	t.Helper()
	addr, err := testenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// supervised is one manager replica run the way a kubelet runs a container: whenever the process
// exits (killed, or failing to start while the API server is away) it is started again, after a
// short backoff. Its output is appended to one log file across restarts.
type supervised struct {
	name, bin, log, probe string
	args                  []string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped bool
	starts  int
	kills   int
	// crashes counts exits the test did not cause.
	crashes int
	done    chan struct{}
}

func supervise(t *testing.T, name, bin, logDir string, args ...string) *supervised {
	t.Helper()
	s := &supervised{name: name, bin: bin, log: filepath.Join(logDir, name+".log"), probe: freePort(t), done: make(chan struct{})}
	s.args = append([]string{"--health-probe-bind-address=" + s.probe, "--metrics-bind-address=0"}, args...)
	go s.loop(t)
	t.Cleanup(s.stop)
	return s
}

func (s *supervised) loop(t *testing.T) {
	defer close(s.done)
	for {
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			return
		}
		f, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			s.mu.Unlock()
			t.Errorf("%s: %v", s.name, err)
			return
		}
		s.starts++
		fmt.Fprintf(f, "=== chaos: start #%d at %s\n", s.starts, time.Now().Format(time.RFC3339Nano))
		cmd := exec.Command(s.bin, s.args...)
		cmd.Stdout, cmd.Stderr = f, f
		if err := cmd.Start(); err != nil {
			s.mu.Unlock()
			_ = f.Close()
			t.Errorf("%s: starting: %v", s.name, err)
			return
		}
		exited := make(chan struct{})
		s.cmd, s.exited = cmd, exited
		kills := s.kills
		s.mu.Unlock()

		_ = cmd.Wait()
		close(exited)
		_ = f.Close()
		s.mu.Lock()
		killed := s.kills != kills || s.stopped
		if !killed {
			s.crashes++
		}
		s.mu.Unlock()
		if !killed {
			time.Sleep(time.Second) // crash-loop backoff, as a kubelet would
		}
	}
}

// waitReady waits until the current process answers its readiness probe.
func (s *supervised) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + s.probe + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready within %s", s.name, timeout)
}

// kill SIGKILLs the current process and waits until it is gone; the loop starts the next one.
func (s *supervised) kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.kills++
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// stop kills the process for good.
func (s *supervised) stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
	<-s.done
}

func (s *supervised) stats() (starts, kills, crashes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts, s.kills, s.crashes
}

func (s *supervised) logText(t *testing.T) string {
	raw, err := os.ReadFile(s.log)
	if err != nil {
		t.Fatalf("%s log: %v", s.name, err)
	}
	return string(raw)
}

// count is how often substr occurs in the log.
func (s *supervised) count(t *testing.T, substr string) int {
	return strings.Count(s.logText(t), substr)
}

func (s *supervised) tail(t *testing.T, n int) string {
	lines := bytes.Split([]byte(s.logText(t)), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

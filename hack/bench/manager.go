package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/toolnexus/operator/internal/testenv"
)

// manager is the operator's manager, built from ./cmd/manager and run as a subprocess.
type manager struct {
	cmd                  *exec.Cmd
	pid                  int
	probe, metrics, prof string
	log                  string
	done                 chan struct{} // closed when the process has exited; exitErr is then set
	exitErr              error
}

func buildManager(dir string) (string, error) {
	if _, err := testenv.Build(dir, "./cmd/manager"); err != nil {
		return "", err
	}
	return filepath.Join(dir, "manager"), nil
}

// startManager runs the manager with goMemLimit as its GOMEMLIMIT (none when empty).
func startManager(ctx context.Context, bin, kubeconfig, dir string, workers int, goMemLimit string, extra []string) (*manager, error) {
	m := &manager{log: filepath.Join(dir, "manager.log"), done: make(chan struct{})}
	var err error
	if m.probe, err = testenv.FreeAddr(); err != nil {
		return nil, err
	}
	if m.metrics, err = testenv.FreeAddr(); err != nil {
		return nil, err
	}
	if m.prof, err = testenv.FreeAddr(); err != nil {
		return nil, err
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--metrics-bind-address=" + m.metrics, "--metrics-secure=false",
		"--health-probe-bind-address=" + m.probe,
		"--pprof-bind-address=" + m.prof,
		"--max-concurrent-reconciles=" + strconv.Itoa(workers),
	}
	args = append(args, extra...)
	logf, err := os.Create(m.log)
	if err != nil {
		return nil, err
	}
	m.cmd = exec.Command(bin, args...)
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	m.cmd.Env = os.Environ()
	if goMemLimit != "" {
		m.cmd.Env = append(m.cmd.Env, "GOMEMLIMIT="+goMemLimit)
	}
	if err := m.cmd.Start(); err != nil {
		return nil, err
	}
	m.pid = m.cmd.Process.Pid
	go func() { m.exitErr = m.cmd.Wait(); logf.Close(); close(m.done) }()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-m.done:
			return nil, fmt.Errorf("the manager exited: %v (log: %s)", m.exitErr, m.log)
		default:
		}
		resp, err := http.Get("http://" + m.probe + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return m, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, fmt.Errorf("the manager did not become ready (log: %s)", m.log)
}

func (m *manager) stop() {
	if m == nil || m.cmd.Process == nil {
		return
	}
	_ = m.cmd.Process.Signal(os.Interrupt)
	select {
	case <-m.done:
	case <-time.After(10 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.done
	}
}

// rss is the manager's resident memory (VmRSS) and its peak (VmHWM), in bytes.
func (m *manager) rss() (rss, hwm int64) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", m.pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = v << 10
		case "VmHWM:":
			hwm = v << 10
		}
	}
	return rss, hwm
}

// resetPeak resets the manager's VmHWM to its current RSS, so that the next rss() reports the
// peak from now on.
func (m *manager) resetPeak() error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", m.pid), []byte("5"), 0)
}

// logged returns the value of key in the first manager log line holding msg ("" when none).
func (m *manager) logged(msg, key string) string {
	raw, err := os.ReadFile(m.log)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		var fields map[string]any
		if json.Unmarshal([]byte(line), &fields) == nil {
			if v, ok := fields[key]; ok {
				return fmt.Sprint(v)
			}
		}
	}
	return ""
}

// clockTick is USER_HZ, 100 on Linux.
const clockTick = 10 * time.Millisecond

// cpu is the manager's user+system CPU time so far.
func (m *manager) cpu() time.Duration {
	return procCPU(m.pid)
}

func procCPU(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// After the command: state(0) ... utime is field 14 of the whole line, index 11 here.
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * clockTick
}

// profile fetches a pprof profile from the manager into path.
func (m *manager) profile(ctx context.Context, kind string, seconds int, path string) error {
	url := fmt.Sprintf("http://%s/debug/pprof/%s", m.prof, kind)
	if seconds > 0 {
		url += "?seconds=" + strconv.Itoa(seconds)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof %s: %s", kind, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// errorLines counts the manager's log lines at level error.
func (m *manager) errorLines() int {
	raw, err := os.ReadFile(m.log)
	if err != nil {
		return 0
	}
	return bytes.Count(raw, []byte(`"level":"error"`))
}

// requestCounts is apiserver_request_total summed by "VERB resource[/subresource]".
type requestCounts map[string]float64

// scrapeAPIServer reads the API server's request counters.
func scrapeAPIServer(ctx context.Context, cfg *rest.Config) (requestCounts, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(cfg.Host, "/")+"/metrics", nil)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("apiserver /metrics: %s", resp.Status)
	}
	out := requestCounts{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		labels := parseLabels(line[len("apiserver_request_total{"):end])
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			continue
		}
		key := labels["verb"] + " " + labels["resource"]
		if sub := labels["subresource"]; sub != "" {
			key += "/" + sub
		}
		out[key] += v
	}
	return out, sc.Err()
}

func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			break
		}
		name := s[:eq]
		rest := s[eq+2:]
		end := strings.IndexByte(rest, '"')
		if end < 0 {
			break
		}
		out[name] = rest[:end]
		s = strings.TrimPrefix(rest[end+1:], ",")
	}
	return out
}

// managerResources are the resources the manager reads and writes; the harness's own requests
// (creating runs and namespaces, answering requests) are subtracted by the caller.
var managerResources = map[string]bool{
	"agentrunrecords": true, "agentruns": true, "agentruns/status": true, "pendingrequests": true,
	"pendingrequests/status": true, "events": true, "secrets": true,
}

func isWrite(verb string) bool {
	switch verb {
	case "POST", "PUT", "PATCH", "DELETE", "APPLY":
		return true
	}
	return false
}

// delta is after minus before, restricted to the manager's resources.
func delta(before, after requestCounts) requestCounts {
	out := requestCounts{}
	for k, v := range after {
		_, res, _ := strings.Cut(k, " ")
		if !managerResources[res] {
			continue
		}
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func (c requestCounts) writes() (n float64) {
	for k, v := range c {
		verb, _, _ := strings.Cut(k, " ")
		if isWrite(verb) {
			n += v
		}
	}
	return n
}

func (c requestCounts) reads() (n float64) {
	for k, v := range c {
		verb, _, _ := strings.Cut(k, " ")
		if !isWrite(verb) && verb != "WATCH" {
			n += v
		}
	}
	return n
}

// controlPlanePIDs finds the kube-apiserver and etcd that envtest started as this process's
// children.
func controlPlanePIDs() map[string]int {
	out := map[string]int{}
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(raw)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		comm := s[open+1 : closing]
		f := strings.Fields(s[closing+2:])
		if len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == self && (comm == "kube-apiserver" || comm == "etcd") {
			out[comm] = pid
		}
	}
	return out
}

// cpuOf sums the CPU time of pids.
func cpuOf(pids map[string]int) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, pid := range pids {
		out[name] = procCPU(pid)
	}
	return out
}

// apiserverProfile fetches a CPU profile of the kube-apiserver (its --profiling is on by default)
// into path.
func apiserverProfile(ctx context.Context, cfg *rest.Config, seconds int, path string) error {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", strings.TrimRight(cfg.Host, "/"), seconds)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("apiserver pprof: %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

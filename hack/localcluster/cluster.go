package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// user is one identity of the token file.
type user struct {
	name   string // also the kubeconfig suffix
	login  string
	groups []string
}

// managerUser is the manager's ServiceAccount identity (config/rbac binds its roles to it).
const managerUser = "system:serviceaccount:toolnexus-system:toolnexus-controller-manager"

var users = []user{
	{name: "admin", login: "admin", groups: []string{"system:masters"}},
	{name: "alice", login: "alice", groups: []string{"toolnexus-approvers"}},
	{name: "bob", login: "bob", groups: []string{"toolnexus-developers"}},
	{name: "manager", login: managerUser, groups: []string{"system:serviceaccounts", "system:serviceaccounts:toolnexus-system"}},
}

type cluster struct {
	dir, assets, repo       string
	apiserverPort, etcdPort int
	log                     *slog.Logger

	tokens map[string]string // user name -> token
	procs  []proc
	exited chan error
}

// proc is a started control-plane process; done closes when it has exited.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (c *cluster) path(parts ...string) string {
	return filepath.Join(append([]string{c.dir}, parts...)...)
}

func (c *cluster) kubeconfig(name string) string {
	if name == "admin" {
		return c.path("kubeconfig")
	}
	return c.path("kubeconfig-" + name)
}

// prepare creates the directory layout, the tokens and the service account key, reusing what a
// previous run left.
func (c *cluster) prepare() error {
	abs, err := filepath.Abs(c.dir)
	if err != nil {
		return err
	}
	c.dir = abs
	for _, d := range []string{"etcd", "certs", "pki", "logs"} {
		if err := os.MkdirAll(c.path(d), 0o700); err != nil {
			return err
		}
	}
	if err := c.ensureTokens(); err != nil {
		return err
	}
	if err := ensureRSAKey(c.path("pki", "sa.key"), c.path("pki", "sa.pub")); err != nil {
		return fmt.Errorf("service account key: %w", err)
	}
	if c.apiserverPort == 0 {
		if c.apiserverPort, err = freePort(); err != nil {
			return err
		}
	}
	if c.etcdPort == 0 {
		if c.etcdPort, err = freePort(); err != nil {
			return err
		}
	}
	for _, p := range []int{c.apiserverPort, c.etcdPort, c.etcdPort + 1} {
		if !portFree(p) {
			return fmt.Errorf("port 127.0.0.1:%d is in use: is another local cluster running? (stop it, or pass other --apiserver-port/--etcd-port)", p)
		}
	}
	c.exited = make(chan error, 4)
	return nil
}

func (c *cluster) ensureTokens() error {
	file := c.path("tokens.csv")
	c.tokens = map[string]string{}
	if raw, err := os.ReadFile(file); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			f := strings.SplitN(line, ",", 4)
			if len(f) < 3 {
				continue
			}
			for _, u := range users {
				if u.login == f[1] {
					c.tokens[u.name] = f[0]
				}
			}
		}
	}
	var b strings.Builder
	for _, u := range users {
		if c.tokens[u.name] == "" {
			buf := make([]byte, 24)
			if _, err := rand.Read(buf); err != nil {
				return err
			}
			c.tokens[u.name] = hex.EncodeToString(buf)
		}
		fmt.Fprintf(&b, "%s,%s,%s,\"%s\"\n", c.tokens[u.name], u.login, u.login, strings.Join(u.groups, ","))
	}
	return os.WriteFile(file, []byte(b.String()), 0o600)
}

func ensureRSAKey(keyFile, pubFile string) error {
	if _, err := os.Stat(keyFile); err == nil {
		if _, err := os.Stat(pubFile); err == nil {
			return nil
		}
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}

func freePort() (int, error) {
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		// etcd also takes the next port, for peers.
		if portFree(p + 1) {
			return p, nil
		}
	}
	return 0, errors.New("no free port pair on 127.0.0.1")
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// start runs a binary from the assets directory with its output in logs/<name>.log.
func (c *cluster) start(name string, args ...string) error {
	logFile, err := os.OpenFile(c.path("logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(c.assets, name), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// The child dies with us even when we are SIGKILLed, so no control plane is left behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	p := proc{cmd: cmd, done: make(chan struct{})}
	c.procs = append(c.procs, p)
	go func() {
		err := cmd.Wait()
		_ = logFile.Close()
		close(p.done)
		select {
		case c.exited <- fmt.Errorf("%s exited (%v); see %s", name, err, c.path("logs", name+".log")):
		default:
		}
	}()
	return nil
}

func (c *cluster) startEtcd(ctx context.Context) error {
	client := fmt.Sprintf("http://127.0.0.1:%d", c.etcdPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", c.etcdPort+1)
	if err := c.start("etcd",
		"--name=toolnexus-dev", "--data-dir="+c.path("etcd"),
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=toolnexus-dev="+peer, "--unsafe-no-fsync",
	); err != nil {
		return err
	}
	return c.waitFor(ctx, "etcd", http.DefaultClient, client+"/health", "")
}

func (c *cluster) startAPIServer(ctx context.Context) error {
	if err := c.start("kube-apiserver",
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", c.etcdPort),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(c.apiserverPort),
		"--cert-dir="+c.path("certs"),
		"--token-auth-file="+c.path("tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+c.path("pki", "sa.pub"),
		"--service-account-signing-key-file="+c.path("pki", "sa.key"),
		"--endpoint-reconciler-type=none",
		"--allow-privileged=false",
	); err != nil {
		return err
	}
	// The serving certificate is generated at startup; its CA is checked when kubectl connects.
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // only a readiness probe of our own loopback server
	return c.waitFor(ctx, "kube-apiserver", insecure, fmt.Sprintf("https://127.0.0.1:%d/readyz", c.apiserverPort), c.tokens["admin"])
}

func (c *cluster) waitFor(ctx context.Context, name string, client *http.Client, url, token string) error {
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				c.log.Info("Started", "component", name, "url", url)
				return nil
			}
		}
		select {
		case err := <-c.exited:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not ready within 90s; see %s", name, c.path("logs", name+".log"))
}

func (c *cluster) writeKubeconfigs() error {
	ca := c.path("certs", "apiserver.crt")
	for _, u := range users {
		kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: toolnexus-dev
  cluster:
    server: https://127.0.0.1:%d
    certificate-authority: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: %s@toolnexus-dev
  context: {cluster: toolnexus-dev, user: %s, namespace: default}
current-context: %s@toolnexus-dev
`, c.apiserverPort, ca, u.name, c.tokens[u.name], u.name, u.name, u.name)
		if err := os.WriteFile(c.kubeconfig(u.name), []byte(kc), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// wait blocks until a signal or until a control-plane process exits on its own.
func (c *cluster) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-c.exited:
		return err
	}
}

// stop terminates the processes in reverse start order: the API server before etcd.
func (c *cluster) stop() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	_ = os.Remove(c.path("ready"))
}

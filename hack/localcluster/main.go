// Command localcluster runs a local control plane — a real etcd and kube-apiserver, built from
// Go modules by hack/controlplane.sh — for `make dev`, `make demo` and the e2e tests, and installs
// what a user installs (the CRDs, config/policies, config/rbac).
//
// It keeps everything under --dir (default .dev/): etcd data, serving certificates, the service
// account signing key, a token file of real users and one kubeconfig per user:
//
//	kubeconfig          admin, in system:masters
//	kubeconfig-alice    alice, in group toolnexus-approvers
//	kubeconfig-bob      bob, in group toolnexus-developers
//	kubeconfig-manager  system:serviceaccount:toolnexus-system:toolnexus-controller-manager, the
//	                    identity the manager runs as, so config/rbac is exercised for real
//
// alice and bob are bound cluster-wide to the ClusterRoles toolnexus-answerer and
// toolnexus-agentrun-viewer (when config/rbac provides them): RBAC lets both answer, and a
// request's approvers (config/policies) decide which of them may.
//
// A second run reuses the directory (same data, same tokens). When the control plane is up and
// the manifests are installed it writes <dir>/ready and prints "ready"; it then runs until
// SIGINT or SIGTERM and stops etcd and kube-apiserver on the way out (they also die with it if it
// is killed, via the parent-death signal).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	var c cluster
	flag.StringVar(&c.dir, "dir", ".dev", "Directory for the cluster's data, certificates, tokens, kubeconfigs and logs.")
	flag.StringVar(&c.assets, "assets", os.Getenv("KUBEBUILDER_ASSETS"), "Directory holding etcd, kube-apiserver and kubectl (what hack/controlplane.sh prints).")
	flag.StringVar(&c.repo, "repo", ".", "Repository root, where config/ is read from.")
	flag.IntVar(&c.apiserverPort, "apiserver-port", 16443, "kube-apiserver's secure port on 127.0.0.1; 0 picks a free one.")
	flag.IntVar(&c.etcdPort, "etcd-port", 12379, "etcd's client port on 127.0.0.1 (the peer port is the next one); 0 picks free ones.")
	install := flag.Bool("install", true, "Install the CRDs, config/policies and config/rbac once the API server is ready.")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "localcluster")
	if c.assets == "" {
		log.Error("No control-plane binaries: pass --assets \"$(hack/controlplane.sh)\" or set KUBEBUILDER_ASSETS")
		os.Exit(2)
	}
	c.log = log

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := c.run(ctx, *install)
	c.stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Error("Local cluster failed", "error", err, "logs", filepath.Join(c.dir, "logs"))
		os.Exit(1)
	}
}

func (c *cluster) run(ctx context.Context, install bool) error {
	if err := c.prepare(); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(c.dir, "ready"))
	if err := c.startEtcd(ctx); err != nil {
		return err
	}
	if err := c.startAPIServer(ctx); err != nil {
		return err
	}
	if err := c.writeKubeconfigs(); err != nil {
		return err
	}
	if install {
		ictx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		err := c.install(ictx)
		cancel()
		if err != nil {
			return err
		}
	}
	ready := fmt.Sprintf("server=https://127.0.0.1:%d\nkubeconfig=%s\n", c.apiserverPort, c.kubeconfig("admin"))
	if err := os.WriteFile(filepath.Join(c.dir, "ready"), []byte(ready), 0o600); err != nil {
		return err
	}
	c.log.Info("Local cluster ready", "server", fmt.Sprintf("https://127.0.0.1:%d", c.apiserverPort), "kubeconfig", c.kubeconfig("admin"))
	fmt.Println("ready")
	return c.wait(ctx)
}

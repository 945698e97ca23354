package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// devRoles are ClusterRoles from config/rbac that alice and bob are bound to, when they exist, so
// they can look at runs and answer requests; who may answer a given request is then decided by
// its approvers (config/policies), which is what the demos show.
var devRoles = []string{"toolnexus-answerer", "toolnexus-agentrun-viewer"}

// install applies what a user installs, in dependency order, with the admin identity.
func (c *cluster) install(ctx context.Context) error {
	crds := filepath.Join(c.repo, "config", "crd", "bases")
	if err := c.apply(ctx, "-f", crds); err != nil {
		return err
	}
	if _, err := c.kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/agents.toolnexus.dev", "crd/agentruns.toolnexus.dev", "crd/pendingrequests.toolnexus.dev"); err != nil {
		return err
	}
	if _, err := c.kubectlStdin(ctx, "apiVersion: v1\nkind: Namespace\nmetadata: {name: toolnexus-system}\n",
		"apply", "--server-side", "--field-manager=localcluster", "-f", "-"); err != nil {
		return err
	}
	for _, dir := range []string{"policies", "rbac"} {
		path := filepath.Join(c.repo, "config", dir)
		if _, err := os.Stat(path); err != nil {
			c.log.Info("Not installing: absent", "path", path)
			continue
		}
		args := []string{"-f", path}
		if _, err := os.Stat(filepath.Join(path, "kustomization.yaml")); err == nil {
			args = []string{"-k", path}
		}
		if err := c.apply(ctx, args...); err != nil {
			return err
		}
	}
	for _, role := range devRoles {
		if _, err := c.kubectl(ctx, "get", "clusterrole", role); err != nil {
			continue
		}
		binding := fmt.Sprintf(`apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: dev-%s}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: %s}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}
`, role, role)
		if _, err := c.kubectlStdin(ctx, binding, "apply", "--server-side", "--field-manager=localcluster", "-f", "-"); err != nil {
			return err
		}
	}
	if err := c.waitServed(ctx); err != nil {
		return err
	}
	c.log.Info("Installed the CRDs and whatever of config/policies and config/rbac exists")
	return nil
}

// probeRun is what waitServed asks the API server to create, dry run only.
const probeRun = `apiVersion: toolnexus.dev/v1alpha1
kind: AgentRun
metadata: {name: install-probe, namespace: default}
spec: {prompt: probe, model: {name: probe}}
`

// waitServed waits until an AgentRun can be created. An admission policy over a kind of a CRD just
// established refuses its creates (ServiceUnavailable, "Resource kind ... not found") until the API
// server publishes the kind's schema, a few seconds later: whoever pastes the first command after
// the stack says it is ready must not meet that.
func (c *cluster) waitServed(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := c.kubectlStdin(ctx, probeRun, "create", "--dry-run=server", "-f", "-")
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// apply applies server-side, retrying briefly: a policy binding may name a policy or a kind the
// API server has not served yet.
func (c *cluster) apply(ctx context.Context, args ...string) error {
	var err error
	for attempt := range 5 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(2 * time.Second):
			}
		}
		if _, err = c.kubectl(ctx, append([]string{"apply", "--server-side", "--force-conflicts", "--field-manager=localcluster"}, args...)...); err == nil {
			return nil
		}
	}
	return err
}

func (c *cluster) kubectl(ctx context.Context, args ...string) (string, error) {
	return c.kubectlStdin(ctx, "", args...)
}

func (c *cluster) kubectlStdin(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.assets, "kubectl"), append([]string{"--kubeconfig", c.kubeconfig("admin")}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

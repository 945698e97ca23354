package chart

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/toolnexus/operator/internal/testenv"
)

// helmAt runs the pinned helm against the test API server as its administrator, with Helm's
// cache, config and data in the test's own directories.
func helmAt(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	cmd := exec.Command(tool(t, "HELM", "helm", "helm"), append(args, "--kubeconfig", kubeconfig)...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return string(out)
}

// get reads o's live copy from the API server; nil when it does not exist.
func get(t *testing.T, c client.Client, o *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(o.GroupVersionKind())
	err := c.Get(context.Background(), client.ObjectKeyFromObject(o), live)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("reading %s: %v", key(o), err)
	}
	return live
}

// TestInstallUpgradeUninstall installs the chart into a real API server (envtest: no kubelet, so
// the manager's pod never starts; the objects are what is tested), upgrades it with changed values
// and uninstalls it.
func TestInstallUpgradeUninstall(t *testing.T) {
	env := testenv.Start(t, testenv.Options{WithoutCRDs: true})
	kubeconfig := env.User(t, testenv.Admin.Name, testenv.Admin.Groups...).Kubeconfig
	c := env.Client

	out := helmAt(t, kubeconfig, "install", releaseName, chartDir, "--namespace", namespace, "--create-namespace")
	if !strings.Contains(out, "kubectl get pendingrequests -A") {
		t.Errorf("helm install printed no NOTES on answering a request:\n%s", out)
	}
	rendered := helmTemplate(t)
	for _, o := range rendered {
		if get(t, c, o) == nil {
			t.Errorf("after helm install, %s does not exist", key(o))
		}
	}

	deployment := &unstructured.Unstructured{}
	deployment.SetAPIVersion("apps/v1")
	deployment.SetKind("Deployment")
	deployment.SetNamespace(namespace)
	deployment.SetName("toolnexus-controller-manager")

	helmAt(t, kubeconfig, "upgrade", releaseName, chartDir, "--namespace", namespace,
		"--set", "replicaCount=2,manager.requireSecretLabel=true,manager.maxInflight=32")
	live := get(t, c, deployment)
	if live == nil {
		t.Fatal("after helm upgrade, the manager's Deployment does not exist")
	}
	if replicas, _, _ := unstructured.NestedInt64(live.Object, "spec", "replicas"); replicas != 2 {
		t.Errorf("after helm upgrade, replicas = %d, want 2", replicas)
	}
	containers, _, _ := unstructured.NestedSlice(live.Object, "spec", "template", "spec", "containers")
	var args []string
	for _, a := range containers[0].(map[string]any)["args"].([]any) {
		args = append(args, a.(string))
	}
	for _, want := range []string{"--require-secret-label", "--max-inflight=32", "--leader-elect"} {
		if !slices.Contains(args, want) {
			t.Errorf("after helm upgrade, the manager's args %q lack %s", args, want)
		}
	}

	helmAt(t, kubeconfig, "uninstall", releaseName, "--namespace", namespace, "--wait", "--timeout", (time.Minute).String())
	for _, o := range rendered {
		live := get(t, c, o)
		// Helm never deletes what crds/ installed, so AgentRuns and PendingRequests outlive a
		// release; everything else goes.
		if o.GetKind() == "CustomResourceDefinition" {
			if live == nil {
				t.Errorf("helm uninstall deleted %s", key(o))
			}
			continue
		}
		if live != nil && live.GetDeletionTimestamp() == nil {
			t.Errorf("after helm uninstall, %s still exists", key(o))
		}
	}
}

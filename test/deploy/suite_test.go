// Package deploy_test builds the kustomize configurations of config/ (config/default, what `make
// deploy` and `make build-installer` ship, and config/namespaced) and applies them to a real API
// server, as an administrator would: server-side dry-run of the whole, and a real apply of the
// namespaced variant to check what its ServiceAccount may do.
package deploy_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/toolnexus/operator/internal/testenv"
)

var (
	testEnv    *testenv.Env
	kubectl    string
	kubeconfig string
	// cacheDir is kubectl's discovery cache, this suite's own: a cache another run left for the
	// same address would not know the CRDs this one installs.
	cacheDir string
)

func TestDeploy(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Deploy configurations (envtest)")
}

var _ = BeforeSuite(func() {
	// No CRDs up front: the configurations install them.
	testEnv = testenv.Start(GinkgoT(), testenv.Options{WithoutCRDs: true})
	kubectl = testEnv.Kubectl()
	kubeconfig = testEnv.User(GinkgoT(), testenv.Admin.Name, testenv.Admin.Groups...).Kubeconfig
	cacheDir = filepath.Join(GinkgoT().TempDir(), "cache")
})

// kustomizeBuild builds config/<dir> with bin/kustomize, the pinned kustomize `make deploy` uses
// (KUSTOMIZE overrides it). Without it, kubectl's embedded kustomize stands in.
func kustomizeBuild(dir string) []byte {
	path := filepath.Join(testenv.RepoRoot(), "config", dir)
	bin := os.Getenv("KUSTOMIZE")
	if bin == "" {
		bin = filepath.Join(testenv.RepoRoot(), "bin", "kustomize")
	}
	cmd := exec.Command(bin, "build", path)
	if _, err := os.Stat(bin); err != nil {
		GinkgoWriter.Printf("%s not found (make kustomize builds it): using kubectl kustomize\n", bin)
		cmd = exec.Command(kubectl, "kustomize", path)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "%s: %s", cmd, stderr.String())
	return out
}

// run runs kubectl as the admin, with stdin when given, and returns its output.
func run(stdin []byte, args ...string) (string, error) {
	cmd := exec.Command(kubectl, append([]string{"--kubeconfig", kubeconfig, "--cache-dir", cacheDir}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// decode splits a multi-document YAML stream into objects.
func decode(data []byte) []*unstructured.Unstructured {
	objs, err := testenv.Decode(data)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return objs
}

// encode joins objects into a YAML stream kubectl reads.
func encode(objs []*unstructured.Unstructured) []byte {
	var buf bytes.Buffer
	for _, obj := range objs {
		data, err := obj.MarshalJSON()
		ExpectWithOffset(1, err).NotTo(HaveOccurred())
		buf.Write(data)
		buf.WriteString("\n")
	}
	return buf.Bytes()
}

// prerequisites are what a server-side dry-run of the rest needs to exist for real: the
// namespaces and the CRDs.
func prerequisites(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, obj := range objs {
		if obj.GetKind() == "Namespace" || obj.GetKind() == "CustomResourceDefinition" {
			out = append(out, obj)
		}
	}
	return out
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, obj := range objs {
		if obj.GetKind() == kind && obj.GetName() == name {
			return obj
		}
	}
	return nil
}

// Package testenv starts a real kube-apiserver and etcd (envtest) with the project's CRDs, using
// the control-plane binaries that hack/controlplane.sh builds from Go modules.
package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// RepoRoot is the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Assets returns the directory holding kube-apiserver, etcd and kubectl: KUBEBUILDER_ASSETS when
// set, else what hack/controlplane.sh prints (it builds the binaries on first use).
func Assets() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	cmd := exec.Command(filepath.Join(RepoRoot(), "hack", "controlplane.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("building the control plane with hack/controlplane.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// New returns an envtest environment that installs the CRDs under config/crd/bases.
func New() (*envtest.Environment, error) {
	assets, err := Assets()
	if err != nil {
		return nil, err
	}
	return &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}, nil
}

// Scheme holds the built-in Kubernetes types and the toolnexus.dev types.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := toolnexusv1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// Admin is a cluster administrator of the test API server.
var Admin = envtest.User{Name: "admin", Groups: []string{"system:masters"}}

// WriteKubeconfig writes a kubeconfig for user into dir and returns its path, for running kubectl
// or a built binary against the environment as that user.
func WriteKubeconfig(env *envtest.Environment, user envtest.User, dir string) (string, error) {
	authenticated, err := env.AddUser(user, nil)
	if err != nil {
		return "", err
	}
	raw, err := authenticated.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "kubeconfig-"+user.Name)
	return path, os.WriteFile(path, raw, 0o600)
}

// Kustomize builds the kustomization in dir with the kubectl of Assets (its embedded kustomize),
// as `kubectl apply -k` would, and returns the objects.
func Kustomize(dir string) ([]*unstructured.Unstructured, error) {
	assets, err := Assets()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(assets, "kubectl"), "kustomize", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("kubectl kustomize %s: %w: %s", dir, err, stderr.String())
	}
	var objs []*unstructured.Unstructured
	decoder := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		obj := &unstructured.Unstructured{}
		err := decoder.Decode(&obj.Object)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("decoding kubectl kustomize %s: %w", dir, err)
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("kubectl kustomize %s built nothing", dir)
	}
	return objs, nil
}

// ManagerNamespace is the namespace config/ deploys the manager into.
const ManagerNamespace = "toolnexus-system"

// ManagerUser is the manager's ServiceAccount as the API server authenticates it: the subject
// config/rbac binds (namespace and namePrefix of its kustomization).
var ManagerUser = envtest.User{Name: "system:serviceaccount:" + ManagerNamespace + ":toolnexus-controller-manager",
	Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ManagerNamespace}}

// Install creates ManagerNamespace and the objects of config/<dir> for each dir (for example
// "rbac", "policies"), as `kubectl apply -k` of a deployment would.
func Install(ctx context.Context, c client.Client, dirs ...string) error {
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ManagerNamespace}}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", ManagerNamespace, err)
	}
	for _, dir := range dirs {
		objs, err := Kustomize(filepath.Join(RepoRoot(), "config", dir))
		if err != nil {
			return err
		}
		for _, obj := range objs {
			if err := c.Create(ctx, obj); err != nil {
				return fmt.Errorf("creating %s %s from config/%s: %w", obj.GetKind(), obj.GetName(), dir, err)
			}
		}
	}
	return nil
}

// FreeAddr returns a loopback address with a port that was free a moment ago.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Build builds the repository's packages (for example ./cmd/manager) into dir with the go command
// on PATH, as a user would, and returns dir.
func Build(dir string, packages ...string) (string, error) {
	cmd := exec.Command("go", append([]string{"build", "-o", dir + string(filepath.Separator)}, packages...)...)
	cmd.Dir = RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", strings.Join(packages, " "), err, out)
	}
	return dir, nil
}

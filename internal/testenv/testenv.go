// Package testenv is the one envtest harness every suite uses: Start runs a real kube-apiserver and
// etcd with the project's CRDs (the control-plane binaries hack/controlplane.sh builds from Go
// modules) and installs what config/ deploys; an Env makes the users a suite acts as (certificate
// users with groups, ServiceAccounts with their tokens), each with a client and a kubeconfig.
//
// Package testenv/operator runs the manager in-process on an Env. It imports internal/controller,
// and this package must not: the controller's own in-package tests use this one.
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
	"slices"
	"strings"
	"time"

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
	return writeKubeconfig(authenticated.Config(), filepath.Join(dir, "kubeconfig-"+fileSafe.Replace(user.Name)))
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
	objs, err := Decode(out)
	if err != nil {
		return nil, fmt.Errorf("decoding kubectl kustomize %s: %w", dir, err)
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("kubectl kustomize %s built nothing", dir)
	}
	return objs, nil
}

// Decode splits a stream of YAML or JSON documents into objects, leaving out empty ones.
func Decode(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	decoder := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		obj := &unstructured.Unstructured{}
		err := decoder.Decode(&obj.Object)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
}

// ManagerNamespace is the namespace config/ deploys the manager into.
const ManagerNamespace = "toolnexus-system"

// managerServiceAccount is the manager's ServiceAccount in ManagerNamespace, as config/rbac names
// it (namePrefix of its kustomization).
const managerServiceAccount = "toolnexus-controller-manager"

// ManagerUser is the manager's ServiceAccount as the API server authenticates it: the subject
// config/rbac binds.
var ManagerUser = serviceAccountUser(ManagerNamespace, managerServiceAccount)

// serviceAccountUser is the user name and groups the API server gives a ServiceAccount's token.
func serviceAccountUser(namespace, name string) envtest.User {
	return envtest.User{Name: "system:serviceaccount:" + namespace + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace}}
}

// Install creates ManagerNamespace and the objects of config/<dir> for each dir (for example
// "rbac", "policies"), as `kubectl apply -k` of a deployment would; what exists already is left as
// it is, so suites and specs may each install what they need.
func Install(ctx context.Context, c client.Client, dirs ...string) error {
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ManagerNamespace}}); client.IgnoreAlreadyExists(err) != nil {
		return fmt.Errorf("creating namespace %s: %w", ManagerNamespace, err)
	}
	for _, dir := range dirs {
		objs, err := Kustomize(filepath.Join(RepoRoot(), "config", dir))
		if err != nil {
			return err
		}
		for _, obj := range objs {
			if err := c.Create(ctx, obj); client.IgnoreAlreadyExists(err) != nil {
				return fmt.Errorf("creating %s %s from config/%s: %w", obj.GetKind(), obj.GetName(), dir, err)
			}
		}
	}
	return waitServed(ctx, c, slices.Contains(dirs, "policies"))
}

// waitServed waits until an AgentRun can be created: an admission policy over a kind of a CRD just
// established refuses its creates (ServiceUnavailable, "Resource kind ... not found") until the
// API server publishes the kind's schema, a few seconds later. With the policies installed it
// waits, too, until they apply: the requester stamp fills spec.requestedBy in.
func waitServed(ctx context.Context, c client.Client, policies bool) error {
	probe := &toolnexusv1alpha1.AgentRun{ObjectMeta: metav1.ObjectMeta{Name: "install-probe", Namespace: ManagerNamespace},
		Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "probe", AgentSpec: toolnexusv1alpha1.AgentSpec{Model: toolnexusv1alpha1.ModelSpec{Name: "probe"}}}}
	deadline := time.Now().Add(60 * time.Second)
	for {
		created := probe.DeepCopy()
		err := c.Create(ctx, created, client.DryRunAll)
		if err == nil && policies && created.Spec.RequestedBy == "" {
			err = errors.New("the admission policies do not apply yet (spec.requestedBy is not stamped)")
		}
		if err == nil || time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("an AgentRun cannot be created after the install: %w", err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
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

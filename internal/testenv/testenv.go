// Package testenv starts a real kube-apiserver and etcd (envtest) with the project's CRDs, using
// the control-plane binaries that hack/controlplane.sh builds from Go modules.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// RepoRoot is the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
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

package testenv

import (
	"context"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/toolnexus/operator/internal/testenv/fakehttp"
)

// T is what the harness needs of a test, the fake servers' T and a temporary directory:
// *testing.T and Ginkgo's GinkgoT() both have it. What the harness starts is stopped by t's
// cleanup, so a suite starts it with the T of its BeforeSuite (GinkgoT() there cleans up when the
// suite ends) and a plain test with its own.
type T interface {
	fakehttp.T
	TempDir() string
}

// Options say what a suite's control plane holds when Start returns.
type Options struct {
	// WithoutCRDs starts the control plane bare, for a suite whose subject installs the CRDs
	// (config/default does).
	WithoutCRDs bool
	// Install are directories of config/ ("rbac", "policies") created after ManagerNamespace, as
	// Install does.
	Install []string
	// Configure changes the environment before it starts.
	Configure func(*envtest.Environment)
}

// Env is one suite's control plane: a real kube-apiserver and etcd, started by Start and stopped
// when the test (the suite) ends.
type Env struct {
	// Environment is envtest's: BinaryAssetsDirectory holds kubectl, ControlPlane the processes.
	Environment *envtest.Environment
	// Config, Client and Scheme are the control plane's own administrator (system:masters).
	Config *rest.Config
	Client client.Client
	Scheme *runtime.Scheme

	// dir holds the kubeconfigs of the users; it lives as long as the environment.
	dir string
}

// Start starts a control plane with the project's CRDs (unless o.WithoutCRDs), creates what
// o.Install names, and stops the control plane when t ends.
func Start(t T, o Options) *Env {
	t.Helper()
	var env *envtest.Environment
	var err error
	if o.WithoutCRDs {
		var assets string
		assets, err = Assets()
		env = &envtest.Environment{BinaryAssetsDirectory: assets}
	} else {
		env, err = New()
	}
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if o.Configure != nil {
		o.Configure(env)
	}
	e := &Env{Environment: env, dir: t.TempDir()}
	if e.Config, err = env.Start(); err != nil {
		t.Fatalf("testenv: starting the control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("testenv: stopping the control plane: %v", err)
		}
	})
	if e.Scheme, err = Scheme(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if e.Client, err = client.New(e.Config, client.Options{Scheme: e.Scheme}); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if len(o.Install) > 0 {
		if err := Install(context.Background(), e.Client, o.Install...); err != nil {
			t.Fatalf("testenv: installing config/ %v: %v", o.Install, err)
		}
	}
	return e
}

// Kubectl is the path of the kubectl that matches the control plane.
func (e *Env) Kubectl() string {
	return filepath.Join(e.Environment.BinaryAssetsDirectory, "kubectl")
}

// Namespace creates a namespace named generateName and a random suffix, for one test.
func (e *Env) Namespace(t T, generateName string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: generateName}}
	if err := e.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("testenv: creating a namespace %s...: %v", generateName, err)
	}
	return ns.Name
}

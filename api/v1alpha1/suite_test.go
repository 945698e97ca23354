package v1alpha1_test

import (
	"context"
	"os"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

var (
	env       *envtest.Environment
	cfg       *rest.Config
	k8sClient client.Client
	ctx       context.Context
)

func TestAPIValidation(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "API validation (envtest)")
}

var _ = BeforeSuite(func() {
	ctx = context.Background()
	var err error
	env, err = testenv.New()
	Expect(err).NotTo(HaveOccurred())
	cfg, err = env.Start()
	Expect(err).NotTo(HaveOccurred())

	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(toolnexusv1alpha1.AddToScheme(scheme)).To(Succeed())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

func envtestAdmin() envtest.User {
	return envtest.User{Name: "admin", Groups: []string{"system:masters"}}
}

func writeFile(path string, data []byte) error {
	return os.WriteFile(path, data, 0o600)
}

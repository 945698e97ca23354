package v1alpha1_test

import (
	"context"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

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
	testEnv := testenv.Start(GinkgoT(), testenv.Options{})
	env, cfg, k8sClient = testEnv.Environment, testEnv.Config, testEnv.Client
})

package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/toolnexus/operator/internal/testenv"
)

const (
	managerNamespace = "toolnexus-system"
	serviceAccount   = "system:serviceaccount:" + managerNamespace + ":toolnexus-controller-manager"
)

// watchedNamespace is the namespace config/namespaced/watched names (`make deploy-namespaced
// WATCH_NAMESPACE=...` sets it there).
var watchedNamespace = func() string {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "namespaced", "watched", "kustomization.yaml"))
	if err != nil {
		panic(err)
	}
	var k struct {
		Namespace string `json:"namespace"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil || k.Namespace == "" {
		panic(fmt.Sprintf("config/namespaced/watched/kustomization.yaml names no namespace: %v", err))
	}
	return k.Namespace
}()

func convert[T any](obj *unstructured.Unstructured) *T {
	out := new(T)
	ExpectWithOffset(1, runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, out)).To(Succeed())
	return out
}

// expectConsistent checks what kustomize wiring can break: names, namespaces and references.
func expectConsistent(objs []*unstructured.Unstructured) {
	clusterScoped := map[string]bool{"Namespace": true, "CustomResourceDefinition": true, "ClusterRole": true,
		"ClusterRoleBinding": true, "ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
		"MutatingAdmissionPolicy": true, "MutatingAdmissionPolicyBinding": true}
	for _, obj := range objs {
		id := obj.GetKind() + " " + obj.GetName()
		Expect(obj.GetName()).NotTo(HavePrefix("toolnexus-toolnexus-"), id)
		if obj.GetKind() != "CustomResourceDefinition" {
			Expect(obj.GetName()).To(HavePrefix("toolnexus-"), id)
		}
		if clusterScoped[obj.GetKind()] {
			Expect(obj.GetNamespace()).To(BeEmpty(), "%s is cluster-scoped", id)
		} else {
			Expect(obj.GetNamespace()).NotTo(BeEmpty(), id)
		}
	}
	for _, obj := range objs {
		var ref rbacv1.RoleRef
		var subjects []rbacv1.Subject
		switch obj.GetKind() {
		case "RoleBinding":
			b := convert[rbacv1.RoleBinding](obj)
			ref, subjects = b.RoleRef, b.Subjects
			if ref.Kind == "Role" {
				role := find(objs, "Role", ref.Name)
				Expect(role).NotTo(BeNil(), "RoleBinding %s refers to Role %s", obj.GetName(), ref.Name)
				Expect(role.GetNamespace()).To(Equal(obj.GetNamespace()))
			}
		case "ClusterRoleBinding":
			b := convert[rbacv1.ClusterRoleBinding](obj)
			ref, subjects = b.RoleRef, b.Subjects
		default:
			continue
		}
		if ref.Kind == "ClusterRole" {
			Expect(find(objs, "ClusterRole", ref.Name)).NotTo(BeNil(), "%s %s refers to ClusterRole %s", obj.GetKind(), obj.GetName(), ref.Name)
		}
		for _, s := range subjects {
			sa := find(objs, "ServiceAccount", s.Name)
			Expect(sa).NotTo(BeNil(), "%s %s binds ServiceAccount %s", obj.GetKind(), obj.GetName(), s.Name)
			Expect(sa.GetNamespace()).To(Equal(s.Namespace))
		}
	}
}

// expectManager checks the manager Deployment and its metrics Service, and returns the Deployment.
func expectManager(objs []*unstructured.Unstructured) *appsv1.Deployment {
	obj := find(objs, "Deployment", "toolnexus-controller-manager")
	Expect(obj).NotTo(BeNil())
	Expect(obj.GetNamespace()).To(Equal(managerNamespace))
	Expect(find(objs, "Namespace", managerNamespace)).NotTo(BeNil())
	deploy := convert[appsv1.Deployment](obj)
	Expect(*deploy.Spec.Replicas).To(BeEquivalentTo(1))
	pod := deploy.Spec.Template.Spec
	Expect(find(objs, "ServiceAccount", pod.ServiceAccountName)).NotTo(BeNil())
	Expect(*pod.SecurityContext.RunAsNonRoot).To(BeTrue())
	Expect(pod.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
	Expect(pod.Containers).To(HaveLen(1))
	c := pod.Containers[0]
	Expect(c.Image).NotTo(BeEmpty()) // controller:latest, or IMG after `make deploy IMG=...`
	Expect(c.Args).To(ContainElements("--leader-elect", "--metrics-bind-address=:8443", "--health-probe-bind-address=:8081"))
	Expect(*c.SecurityContext.ReadOnlyRootFilesystem).To(BeTrue())
	Expect(*c.SecurityContext.AllowPrivilegeEscalation).To(BeFalse())
	Expect(c.SecurityContext.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")))
	Expect(c.Resources.Requests).NotTo(BeEmpty())
	Expect(c.Resources.Limits).NotTo(BeEmpty())
	Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
	Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	Expect(ports[c.LivenessProbe.HTTPGet.Port.StrVal]).To(BeEquivalentTo(8081))
	Expect(ports[c.ReadinessProbe.HTTPGet.Port.StrVal]).To(BeEquivalentTo(8081))

	svcObj := find(objs, "Service", "toolnexus-controller-manager-metrics-service")
	Expect(svcObj).NotTo(BeNil())
	svc := convert[corev1.Service](svcObj)
	for k, v := range svc.Spec.Selector {
		Expect(deploy.Spec.Template.Labels).To(HaveKeyWithValue(k, v), "the metrics Service selects the manager pods")
	}
	Expect(svc.Spec.Ports).To(HaveLen(1))
	Expect(svc.Spec.Ports[0].Port).To(BeEquivalentTo(8443))
	Expect(svc.Spec.Ports[0].TargetPort).To(Equal(intstr.FromString("https")))
	Expect(ports["https"]).To(BeEquivalentTo(8443))
	return deploy
}

// canI asks the API server whether the manager's ServiceAccount may do verb on resource.
func canI(args ...string) string {
	args = append([]string{"--kubeconfig", kubeconfig, "--cache-dir", cacheDir, "auth", "can-i", "--as", serviceAccount}, args...)
	out, _ := exec.Command(kubectl, args...).Output() // exits 1 for "no"; warns on stderr about custom verbs
	return strings.TrimSpace(string(out))
}

var _ = Describe("config/default", Ordered, func() {
	var objs []*unstructured.Unstructured
	var installer string

	BeforeAll(func() {
		built := kustomizeBuild("default")
		objs = decode(built)
		// What `make build-installer` writes to dist/install.yaml.
		installer = filepath.Join(GinkgoT().TempDir(), "install.yaml")
		Expect(os.WriteFile(installer, built, 0o600)).To(Succeed())
	})

	It("names everything once, in toolnexus-system, with consistent references", func() {
		expectConsistent(objs)
		Expect(find(objs, "CustomResourceDefinition", "agentruns.toolnexus.dev")).NotTo(BeNil())
		Expect(find(objs, "CustomResourceDefinition", "pendingrequests.toolnexus.dev")).NotTo(BeNil())
		Expect(find(objs, "ValidatingAdmissionPolicy", "toolnexus-answer-rules")).NotTo(BeNil())
		Expect(find(objs, "MutatingAdmissionPolicy", "toolnexus-answer-stamp")).NotTo(BeNil())
		Expect(find(objs, "ValidatingAdmissionPolicy", "toolnexus-status-owner")).NotTo(BeNil())
		Expect(find(objs, "ClusterRoleBinding", "toolnexus-manager-rolebinding")).NotTo(BeNil())
		Expect(find(objs, "ClusterRole", "toolnexus-metrics-reader")).NotTo(BeNil())
		Expect(find(objs, "ClusterRoleBinding", "toolnexus-metrics-auth-rolebinding")).NotTo(BeNil())
	})

	It("runs the manager hardened, with probes, metrics and leader election", func() {
		deploy := expectManager(objs)
		Expect(deploy.Spec.Template.Spec.Containers[0].Args).NotTo(ContainElement(HavePrefix("--watch-namespaces")))
	})

	It("is accepted by the API server (server-side dry-run)", func() {
		Expect(run(encode(prerequisites(objs)), "apply", "--server-side", "-f", "-")).Error().NotTo(HaveOccurred())
		Expect(run(nil, "wait", "--for=condition=Established", "crd/agents.toolnexus.dev", "crd/agentruns.toolnexus.dev", "crd/agentrunrecords.toolnexus.dev", "crd/pendingrequests.toolnexus.dev")).Error().NotTo(HaveOccurred())
		Expect(run(kustomizeBuild("default"), "apply", "--dry-run=server", "-f", "-")).Error().NotTo(HaveOccurred())
		Expect(run(nil, "apply", "--dry-run=server", "-f", installer)).Error().NotTo(HaveOccurred())
		// The installer a release ships, when `make build-installer` made one.
		dist := filepath.Join(testenv.RepoRoot(), "dist", "install.yaml")
		if _, err := os.Stat(dist); err == nil {
			Expect(run(nil, "apply", "--dry-run=server", "-f", dist)).Error().NotTo(HaveOccurred())
		}
	})
})

var _ = Describe("config/namespaced", Ordered, func() {
	var objs []*unstructured.Unstructured

	BeforeAll(func() {
		objs = decode(kustomizeBuild("namespaced"))
	})

	It("holds the manager's permissions in a Role of the watched namespace, never cluster-wide", func() {
		expectConsistent(objs)
		Expect(find(objs, "ClusterRole", "toolnexus-manager-role")).To(BeNil())
		Expect(find(objs, "ClusterRoleBinding", "toolnexus-manager-rolebinding")).To(BeNil())
		Expect(find(objs, "ClusterRoleBinding", "toolnexus-manager-expirer-rolebinding")).To(BeNil())

		role := find(objs, "Role", "toolnexus-manager-role")
		Expect(role).NotTo(BeNil())
		Expect(role.GetNamespace()).To(Equal(watchedNamespace))
		generated, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "rbac", "role.yaml"))
		Expect(err).NotTo(HaveOccurred())
		clusterRole := &rbacv1.ClusterRole{}
		Expect(yaml.Unmarshal(generated, clusterRole)).To(Succeed())
		Expect(convert[rbacv1.Role](role).Rules).To(Equal(clusterRole.Rules), "the Role has the rules controller-gen generated")
		for _, name := range []string{"toolnexus-manager-rolebinding", "toolnexus-manager-expirer-rolebinding"} {
			Expect(find(objs, "RoleBinding", name).GetNamespace()).To(Equal(watchedNamespace), name)
		}
	})

	It("watches only the watched namespace", func() {
		c := expectManager(objs).Spec.Template.Spec.Containers[0]
		Expect(c.Args).To(ContainElement("--watch-namespaces=$(WATCH_NAMESPACES)"))
		Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: "WATCH_NAMESPACES", Value: watchedNamespace}))
	})

	It("is accepted by the API server, and confines the manager to the watched namespace", func() {
		ns := &unstructured.Unstructured{}
		ns.SetAPIVersion("v1")
		ns.SetKind("Namespace")
		ns.SetName(watchedNamespace) // it exists before a deploy: config/namespaced does not own it
		Expect(run(encode([]*unstructured.Unstructured{ns}), "apply", "-f", "-")).Error().NotTo(HaveOccurred())
		Expect(run(encode(prerequisites(objs)), "apply", "--server-side", "-f", "-")).Error().NotTo(HaveOccurred())
		Expect(run(nil, "wait", "--for=condition=Established", "crd/agentruns.toolnexus.dev")).Error().NotTo(HaveOccurred())
		Expect(run(encode(objs), "apply", "--dry-run=server", "-f", "-")).Error().NotTo(HaveOccurred())
		// For real, to ask the authorizer what the ServiceAccount may do. (config/default was only
		// dry-run, so nothing grants it more.)
		Expect(run(encode(objs), "apply", "--server-side", "-f", "-")).Error().NotTo(HaveOccurred())

		// The authorizer sees new RBAC objects a moment after they are created, and objects of
		// different kinds (Roles, RoleBindings, ClusterRoles, ClusterRoleBindings) in no fixed
		// order: wait for each grant, not only the first.
		for _, grant := range [][]string{
			{"list", "secrets", "-n", watchedNamespace},
			{"patch", "agentruns.toolnexus.dev", "--subresource=status", "-n", watchedNamespace},
			{"create", "pendingrequests.toolnexus.dev", "-n", watchedNamespace},
			{"expire", "pendingrequests.toolnexus.dev", "--subresource=status", "-n", watchedNamespace},
			{"create", "leases.coordination.k8s.io", "-n", managerNamespace},
			{"create", "tokenreviews.authentication.k8s.io"},
		} {
			Eventually(func() string { return canI(grant...) }).WithTimeout(time.Minute).WithPolling(200*time.Millisecond).
				Should(Equal("yes"), "kubectl auth can-i %s", strings.Join(grant, " "))
		}

		// Once every grant is seen, a refusal is the authorizer's answer, not a delay.
		Expect(canI("list", "secrets", "-n", "default")).To(Equal("no"))
		Expect(canI("list", "secrets", "--all-namespaces")).To(Equal("no"))
		Expect(canI("list", "agentruns.toolnexus.dev", "--all-namespaces")).To(Equal("no"))
		Expect(canI("expire", "pendingrequests.toolnexus.dev", "--subresource=status", "-n", "default")).To(Equal("no"))
	})
})

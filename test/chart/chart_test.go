// Package chart checks that charts/toolnexus-operator installs what config/ installs: rendered
// with its default values it must give the objects `kustomize build config/default` gives, with
// the differences listed in intentionalDifferences; its values must reach the manager's flags;
// and plugins/toolnexus.yaml must have the shape krew reads. test/e2e installs, upgrades and
// uninstalls the chart on a real API server with the manager running.
//
// It renders as `helm template` and `kustomize build` do, with the Helm v4 SDK and the kustomize
// API (the versions go.mod pins, those of the Makefile's helm and kustomize).
package chart

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/strvals"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/toolnexus/operator/internal/testenv"
)

const (
	releaseName = "toolnexus"
	// The namespace config/ deploys into; the chart deploys into the release's.
	namespace = "toolnexus-system"
)

var chartDir = filepath.Join(testenv.RepoRoot(), "charts", "toolnexus-operator")

// helmLabels are the labels the chart adds to every object (templates/_helpers.tpl) and
// kustomize does not: Helm's conventions for telling releases and chart versions apart. They are
// the only thing removed before comparing.
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

// intentionalDifferences are objects config/default renders and the chart, by default, does not.
var intentionalDifferences = map[string]string{
	// Helm installs into a namespace that exists or that `helm install --create-namespace`
	// creates; a chart that owned its release namespace would delete it, with every run's record
	// in it, on uninstall. namespace.create=true renders it (TestNamespaceCreate).
	"/v1, Kind=Namespace//" + namespace: "left to --create-namespace unless namespace.create=true",
}

// kustomize builds config/<dir> as `kustomize build` does.
func kustomize(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	built, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(testenv.RepoRoot(), "config", dir))
	if err != nil {
		t.Fatalf("kustomize build config/%s: %v", dir, err)
	}
	out, err := built.AsYaml()
	if err != nil {
		t.Fatalf("kustomize build config/%s: %v", dir, err)
	}
	return decode(t, out)
}

// helmTemplate renders the chart as `helm template toolnexus charts/toolnexus-operator
// --namespace toolnexus-system --include-crds` does, with --set values.
func helmTemplate(t *testing.T, set ...string) []*unstructured.Unstructured {
	t.Helper()
	manifest, err := render(t, set...)
	if err != nil {
		t.Fatalf("helm template %v: %v", set, err)
	}
	return decode(t, []byte(manifest))
}

// render is what helmTemplate renders, or the error that stops Helm (a template's fail).
func render(t *testing.T, set ...string) (string, error) {
	t.Helper()
	chart, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading %s: %v", chartDir, err)
	}
	values := map[string]any{}
	for _, s := range set {
		if err := strvals.ParseInto(s, values); err != nil {
			t.Fatalf("--set %s: %v", s, err)
		}
	}
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName, install.Namespace = releaseName, namespace
	install.Replace = true
	install.IncludeCRDs = true
	released, err := install.Run(chart, values)
	if err != nil {
		return "", err
	}
	return released.(*releasev1.Release).Manifest, nil
}

func decode(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	objs, err := testenv.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func key(o *unstructured.Unstructured) string {
	return fmt.Sprintf("%s/%s/%s", o.GroupVersionKind(), o.GetNamespace(), o.GetName())
}

// byKey indexes objects by kind, namespace and name, with the Helm labels removed; two objects of
// the same key fail the test.
func byKey(t *testing.T, objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	t.Helper()
	m := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		labels := o.GetLabels()
		for _, l := range helmLabels {
			delete(labels, l)
		}
		if len(labels) == 0 {
			unstructured.RemoveNestedField(o.Object, "metadata", "labels")
		} else {
			o.SetLabels(labels)
		}
		k := key(o)
		if _, dup := m[k]; dup {
			t.Fatalf("%s rendered twice", k)
		}
		m[k] = o
	}
	return m
}

// sameObjects fails the test for every object one side renders and the other does not, and for
// every object both render differently.
func sameObjects(t *testing.T, kustomized, helmed map[string]*unstructured.Unstructured) {
	t.Helper()
	keys := map[string]bool{}
	for k := range kustomized {
		keys[k] = true
	}
	for k := range helmed {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	slices.Sort(sorted)
	for _, k := range sorted {
		want, got := kustomized[k], helmed[k]
		switch {
		case got == nil:
			t.Errorf("the chart does not render %s", k)
		case want == nil:
			t.Errorf("the chart renders %s, config/ does not", k)
		default:
			if diff := cmp.Diff(want.Object, got.Object); diff != "" {
				t.Errorf("%s differs (-config/ +chart):\n%s", k, diff)
			}
		}
	}
}

func TestDefaultValuesRenderConfigDefault(t *testing.T) {
	kustomized := byKey(t, kustomize(t, "default"))
	for k := range intentionalDifferences {
		if kustomized[k] == nil {
			t.Errorf("intentional difference %s: config/default no longer renders it; drop it from the list", k)
		}
		delete(kustomized, k)
	}
	helmed := byKey(t, helmTemplate(t))
	if len(helmed) < 30 {
		t.Fatalf("the chart rendered %d objects; config/default has %d besides the listed differences", len(helmed), len(kustomized))
	}
	sameObjects(t, kustomized, helmed)
}

func TestOptionalObjectsRenderTheirConfig(t *testing.T) {
	for _, c := range []struct{ value, dir string }{
		{"networkPolicy.enabled", "network-policy"},
		{"serviceMonitor.enabled", "prometheus"},
	} {
		t.Run(c.dir, func(t *testing.T) {
			optional := byKey(t, kustomize(t, c.dir))
			base := byKey(t, helmTemplate(t))
			with := byKey(t, helmTemplate(t, c.value+"=true"))
			added := map[string]*unstructured.Unstructured{}
			for k, o := range with {
				if base[k] == nil {
					added[k] = o
				}
			}
			sameObjects(t, optional, added)
		})
	}
}

func TestNamespaceCreate(t *testing.T) {
	kustomized := byKey(t, kustomize(t, "default"))
	helmed := byKey(t, helmTemplate(t, "namespace.create=true"))
	k := "/v1, Kind=Namespace//" + namespace
	if helmed[k] == nil {
		t.Fatalf("namespace.create=true renders no %s", k)
	}
	if diff := cmp.Diff(kustomized[k].Object, helmed[k].Object); diff != "" {
		t.Errorf("%s differs (-config/ +chart):\n%s", k, diff)
	}
}

func manager(t *testing.T, objs map[string]*unstructured.Unstructured) map[string]any {
	t.Helper()
	d := objs["apps/v1, Kind=Deployment/"+namespace+"/toolnexus-controller-manager"]
	if d == nil {
		t.Fatal("no Deployment toolnexus-controller-manager rendered")
	}
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if len(containers) != 1 {
		t.Fatalf("the Deployment has %d containers, want 1", len(containers))
	}
	return containers[0].(map[string]any)
}

func TestValuesReachTheManager(t *testing.T) {
	objs := byKey(t, helmTemplate(t,
		"replicaCount=2",
		"leaderElection.enabled=false",
		"manager.maxConcurrentReconciles=16",
		"manager.maxInflight=64",
		"manager.maxInflightPerNamespace=8",
		"manager.maxInflightMemoryMiB=300",
		"manager.maxTranscriptSizeMiB=2",
		"manager.maxTranscriptDecodedSizeMiB=20",
		"manager.maxToolCallsPerTurn=4",
		"manager.maxResponseSizeMiB=3",
		"manager.watchNamespaces={team-a,team-b}",
		"manager.requireSecretLabel=true",
		"manager.denyCIDRs={10.0.0.0/8,192.168.0.0/16}",
		"manager.allowCIDRs={10.1.2.3/32}",
		"manager.auditSinkURL=https://audit.example/events",
		"manager.oauthRedirectURL=https://toolnexus.example/oauth/callback",
		"manager.oauthCallbackPort=8082",
		"manager.traceContent=true",
		"manager.extraArgs={--zap-log-level=debug}",
		"otel.endpoint=http://collector:4318",
		"otel.protocol=http/protobuf",
		"otel.serviceName=toolnexus",
		"env[0].name=GOMEMLIMIT",
		"env[0].value=400MiB",
		"resources.limits.memory=1Gi",
		"image.repository=registry.example/toolnexus-operator",
		"image.tag=v0.2.0",
	))
	d := objs["apps/v1, Kind=Deployment/"+namespace+"/toolnexus-controller-manager"]
	if replicas, _, _ := unstructured.NestedFieldNoCopy(d.Object, "spec", "replicas"); fmt.Sprint(replicas) != "2" {
		t.Errorf("replicas = %v, want 2", replicas)
	}
	c := manager(t, objs)
	var args []string
	for _, a := range c["args"].([]any) {
		args = append(args, a.(string))
	}
	want := []string{
		"--metrics-bind-address=:8443",
		"--health-probe-bind-address=:8081",
		"--max-concurrent-reconciles=16",
		"--max-inflight=64",
		"--max-inflight-per-namespace=8",
		"--max-inflight-memory=300",
		"--max-transcript-size=2",
		"--max-transcript-decoded-size=20",
		"--max-tool-calls-per-turn=4",
		"--max-response-size=3",
		"--watch-namespaces=team-a,team-b",
		"--require-secret-label",
		"--deny-cidrs=10.0.0.0/8,192.168.0.0/16",
		"--allow-cidrs=10.1.2.3/32",
		"--audit-sink-url=https://audit.example/events",
		"--oauth-redirect-url=https://toolnexus.example/oauth/callback",
		"--oauth-callback-bind-address=:8082",
		"--trace-content",
		"--zap-log-level=debug",
	}
	if diff := cmp.Diff(want, args); diff != "" {
		t.Errorf("manager args (-want +got):\n%s", diff)
	}
	wantEnv := []any{
		map[string]any{"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://collector:4318"},
		map[string]any{"name": "OTEL_EXPORTER_OTLP_PROTOCOL", "value": "http/protobuf"},
		map[string]any{"name": "OTEL_SERVICE_NAME", "value": "toolnexus"},
		map[string]any{"name": "GOMEMLIMIT", "value": "400MiB"},
	}
	if diff := cmp.Diff(wantEnv, c["env"]); diff != "" {
		t.Errorf("manager env (-want +got):\n%s", diff)
	}
	if svc, ok := objs["/v1, Kind=Service/"+namespace+"/toolnexus-oauth-callback"]; !ok {
		t.Error("no Service toolnexus-oauth-callback with manager.oauthCallbackPort set")
	} else if port, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports"); len(port) != 1 || port[0].(map[string]any)["targetPort"] != "oauth-callback" {
		t.Errorf("Service toolnexus-oauth-callback ports = %v, want one to the container port oauth-callback", port)
	}
	if ports, _, _ := unstructured.NestedSlice(c, "ports"); !slices.ContainsFunc(ports, func(p any) bool {
		return p.(map[string]any)["name"] == "oauth-callback" && fmt.Sprint(p.(map[string]any)["containerPort"]) == "8082"
	}) {
		t.Errorf("container ports = %v, want oauth-callback 8082", ports)
	}
	if got, _, _ := unstructured.NestedString(c, "resources", "limits", "memory"); got != "1Gi" {
		t.Errorf("memory limit = %q, want 1Gi", got)
	}
	if got := c["image"]; got != "registry.example/toolnexus-operator:v0.2.0" {
		t.Errorf("image = %v, want registry.example/toolnexus-operator:v0.2.0", got)
	}
}

// The chart's crds/ are config/crd/bases byte for byte (`make chart` copies them): Helm installs
// crds/ as they are, so a stale copy would install an old API.
func TestCRDsAreConfigs(t *testing.T) {
	want, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "*.yaml"))
	if err != nil || len(want) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (%v)", err)
	}
	got, _ := filepath.Glob(filepath.Join(chartDir, "crds", "*.yaml"))
	base := func(paths []string) []string {
		var names []string
		for _, p := range paths {
			names = append(names, filepath.Base(p))
		}
		return names
	}
	if diff := cmp.Diff(base(want), base(got)); diff != "" {
		t.Fatalf("chart crds/ files differ from config/crd/bases (-config +chart); run `make chart`:\n%s", diff)
	}
	for _, p := range want {
		a, _ := os.ReadFile(p)
		b, _ := os.ReadFile(filepath.Join(chartDir, "crds", filepath.Base(p)))
		if !bytes.Equal(a, b) {
			t.Errorf("charts/toolnexus-operator/crds/%s differs from config/crd/bases; run `make chart`", filepath.Base(p))
		}
	}
}

// krewPlugin is the part of krew's Plugin (krew.googlecontainertools.github.com/v1alpha2) the
// manifest uses; decoding is strict, so a misspelt field fails.
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string `json:"version"`
		Homepage         string `json:"homepage"`
		ShortDescription string `json:"shortDescription"`
		Description      string `json:"description"`
		Platforms        []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Bin    string `json:"bin"`
			Files  []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
		} `json:"platforms"`
	} `json:"spec"`
}

func TestKrewManifest(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "plugins", "toolnexus.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var p krewPlugin
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		t.Fatalf("plugins/toolnexus.yaml: %v", err)
	}
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" {
		t.Errorf("apiVersion/kind = %s/%s, want krew.googlecontainertools.github.com/v1alpha2/Plugin", p.APIVersion, p.Kind)
	}
	// krew runs the plugin as kubectl-<name>, the binary cmd/kubectl-toolnexus builds.
	if p.Metadata.Name != "toolnexus" {
		t.Errorf("metadata.name = %q, want toolnexus (the binary is kubectl-toolnexus)", p.Metadata.Name)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	chartData, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(chartData, &chart); err != nil {
		t.Fatal(err)
	}
	if p.Spec.Version != "v"+chart.AppVersion {
		t.Errorf("spec.version = %q, want v%s (the chart's appVersion): the plugin and the manager are released together", p.Spec.Version, chart.AppVersion)
	}
	// krew's own validation: a short description of at most 50 characters, a homepage, and
	// per platform a selector, an https URI, a SHA-256 and a bin that the files put in place.
	if n := len(p.Spec.ShortDescription); n == 0 || n > 50 {
		t.Errorf("shortDescription has %d characters, want 1 to 50", n)
	}
	if !strings.HasPrefix(p.Spec.Homepage, "https://") || p.Spec.Description == "" {
		t.Errorf("homepage %q and description must be set, the homepage https", p.Spec.Homepage)
	}
	sha := regexp.MustCompile(`^[0-9a-f]{64}$`)
	seen := map[string]bool{}
	for i, pl := range p.Spec.Platforms {
		goos, arch := pl.Selector.MatchLabels["os"], pl.Selector.MatchLabels["arch"]
		where := fmt.Sprintf("platforms[%d] (%s/%s)", i, goos, arch)
		if goos == "" || arch == "" {
			t.Errorf("%s: selector must match os and arch", where)
		}
		if seen[goos+"/"+arch] {
			t.Errorf("%s: listed twice", where)
		}
		seen[goos+"/"+arch] = true
		wantURI := fmt.Sprintf("/releases/download/%s/kubectl-toolnexus_%s_%s.tar.gz", p.Spec.Version, goos, arch)
		if !strings.HasPrefix(pl.URI, "https://") || !strings.HasSuffix(pl.URI, wantURI) {
			t.Errorf("%s: uri %q, want https://...%s", where, pl.URI, wantURI)
		}
		if !sha.MatchString(pl.SHA256) {
			t.Errorf("%s: sha256 %q is not 64 lowercase hex digits", where, pl.SHA256)
		}
		if pl.Bin != "kubectl-toolnexus" {
			t.Errorf("%s: bin %q, want kubectl-toolnexus", where, pl.Bin)
		}
		if !slices.ContainsFunc(pl.Files, func(f struct {
			From string `json:"from"`
			To   string `json:"to"`
		}) bool {
			return f.From == pl.Bin
		}) {
			t.Errorf("%s: files do not install %s", where, pl.Bin)
		}
	}
	for _, want := range []string{"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64"} {
		if !seen[want] {
			t.Errorf("no platform for %s", want)
		}
	}
}

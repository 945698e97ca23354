//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/pkg/toolnexustest"
)

// The release and namespace the README installs the chart as.
const (
	releaseName    = "toolnexus"
	chartNamespace = "toolnexus-system"
	deploymentName = "toolnexus-controller-manager"
)

// helmAs is the Helm v4 SDK acting on the API server as kubeconfig's user, as `helm --kubeconfig
// kubeconfig --namespace toolnexus-system` does: releases are stored as Secrets of the namespace.
// Helm's log goes to dir/helm.log.
func helmAs(t *testing.T, kubeconfig, dir string) *action.Configuration {
	t.Helper()
	log, err := os.Create(filepath.Join(dir, "helm.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = log.Close() })
	flags := genericclioptions.NewConfigFlags(false)
	namespace, cache := chartNamespace, filepath.Join(dir, "helm-discovery")
	flags.KubeConfig, flags.Namespace, flags.CacheDir = &kubeconfig, &namespace, &cache
	cfg := action.NewConfiguration()
	cfg.SetLogger(slog.NewTextHandler(log, nil))
	if err := cfg.Init(flags, chartNamespace, "secret"); err != nil {
		t.Fatalf("helm: %v", err)
	}
	return cfg
}

// released is what Helm says it installed or upgraded to.
func released(t *testing.T, r any, err error) *releasev1.Release {
	t.Helper()
	if err != nil {
		t.Fatalf("helm: %v", err)
	}
	return r.(*releasev1.Release)
}

// deployedManager is how the chart's Deployment runs the manager.
type deployedManager struct {
	serviceAccount string
	args, env      []string
	generation     int64
}

func readDeployment(t *testing.T, c client.Client) deployedManager {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: chartNamespace, Name: deploymentName}, d); err != nil {
		t.Fatalf("the chart's Deployment: %v", err)
	}
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("the chart's Deployment has %d containers, want 1", n)
	}
	container := d.Spec.Template.Spec.Containers[0]
	m := deployedManager{serviceAccount: d.Spec.Template.Spec.ServiceAccountName, args: container.Args, generation: d.Generation}
	for _, e := range container.Env {
		if e.ValueFrom != nil {
			t.Fatalf("the manager's env %s comes from %v, which this test cannot resolve outside a pod", e.Name, e.ValueFrom)
		}
		m.env = append(m.env, e.Name+"="+e.Value)
	}
	return m
}

// startDeployed runs the built manager as a pod of the Deployment d would run it: as its
// ServiceAccount (with a token the API server issues), with its args and env. What a pod has and a
// process on this machine does not is supplied: ports of its own (free loopback addresses for the
// probes and metrics) and its namespace, which a pod reads from its ServiceAccount's mount and the
// leader election needs.
func startDeployed(t *testing.T, env *testenv.Env, bin, logs string, d deployedManager) *process {
	t.Helper()
	sa := env.ServiceAccount(t, chartNamespace, d.serviceAccount)
	var args []string
	for _, a := range d.args {
		switch {
		case strings.HasPrefix(a, "--health-probe-bind-address="):
			// runManager binds the probes, and waits on them.
		case strings.HasPrefix(a, "--metrics-bind-address="):
			args = append(args, "--metrics-bind-address="+freeAddr(t))
		default:
			args = append(args, a)
		}
	}
	if slices.Contains(args, "--leader-elect") && !slices.ContainsFunc(args, func(a string) bool {
		return strings.HasPrefix(a, "--leader-election-namespace=")
	}) {
		args = append(args, "--leader-election-namespace="+chartNamespace)
	}
	// The Deployment's args come after runManager's own, and the last of a flag wins.
	return runManager(t, bin, logs, freeAddr(t), append(d.env, "KUBECONFIG="+sa.Kubeconfig), args...)
}

// live reads o's live copy; nil when it does not exist.
func live(t *testing.T, c client.Client, o *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(o.GroupVersionKind())
	err := c.Get(context.Background(), client.ObjectKeyFromObject(o), got)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("reading %s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return got
}

// TestHelmChart installs charts/toolnexus-operator with the Helm v4 SDK into a bare API server,
// runs the manager binary the way the chart's Deployment runs it (envtest has no kubelet), takes a
// suspended run to its end, upgrades the release with changed values while another run is parked
// on its PendingRequest, restarts the manager with the Deployment's new flags as a rollout would,
// answers the parked request and sees the same run finish, and uninstalls the release.
func TestHelmChart(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	bin, logs := filepath.Join(tmp, "bin"), filepath.Join(tmp, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.Build(bin, "./cmd/manager"); err != nil {
		t.Fatal(err)
	}
	env := testenv.Start(t, testenv.Options{WithoutCRDs: true})
	admin := env.Client
	helm := helmAs(t, env.User(t, testenv.Admin.Name, testenv.Admin.Groups...).Kubeconfig, logs)
	chart, err := loader.Load(filepath.Join(repoRoot(), "charts", "toolnexus-operator"))
	if err != nil {
		t.Fatal(err)
	}

	install := action.NewInstall(helm)
	install.ReleaseName, install.Namespace, install.CreateNamespace = releaseName, chartNamespace, true
	// As `helm install` without --wait: the manager's pods never become ready without a kubelet.
	install.WaitStrategy, install.Timeout = kube.HookOnlyStrategy, time.Minute
	r, err := install.RunWithContext(ctx, chart, nil)
	installed := released(t, r, err)
	if !strings.Contains(installed.Info.Notes, "kubectl get pendingrequests -A") {
		t.Errorf("the release's NOTES say nothing of answering a request:\n%s", installed.Info.Notes)
	}
	objects, err := testenv.Decode([]byte(installed.Manifest))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objects {
		if live(t, admin, o) == nil {
			t.Errorf("after helm install, %s %s does not exist", o.GetKind(), o.GetName())
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	before := readDeployment(t, admin)
	if slices.Contains(before.args, "--require-secret-label") {
		t.Fatalf("the default values run the manager with --require-secret-label: %q", before.args)
	}
	manager := startDeployed(t, env, bin, logs, before)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("manager log (tail):\n%s", manager.tail(60))
		}
	})

	ns := env.Namespace(t, "helm-")
	alice := env.User(t, "alice")
	env.Bind(t, "alice-answers", "toolnexus-answerer", testenv.Users("alice")...)
	env.WaitAllowed(t, alice.User, testenv.Access("patch", "pendingrequests/status"))
	const unlabelledKey, labelledKey = "e2e-unlabelled-key", "e2e-labelled-key"
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llm"}, StringData: map[string]string{"apiKey": unlabelledKey}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llm-allowed", Labels: map[string]string{toolnexusv1alpha1.SecretAccessLabel: "true"}},
			StringData: map[string]string{"apiKey": labelledKey}},
	} {
		if err := admin.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	// The tool asks for approval on a call's first execution and deploys on its retry.
	tool := toolnexustest.NewToolServer(t, func(c toolnexustest.Call) toolnexustest.ToolReply {
		if c.Answer == nil {
			return toolnexustest.NeedsApproval("Deploy checkout?")
		}
		return toolnexustest.OK("deployed")
	})
	deployModel := func() *toolnexustest.Model {
		return toolnexustest.NewModel(t,
			toolnexustest.ToolCalls(toolnexustest.ToolCall{ID: "call_1", Name: "deploy", Arguments: `{"service":"checkout"}`}),
			toolnexustest.Text("checkout is deployed"))
	}
	newRun := func(name, secret string, model *toolnexustest.Model) *toolnexusv1alpha1.AgentRun {
		run := &toolnexusv1alpha1.AgentRun{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "deploy checkout", AgentSpec: toolnexusv1alpha1.AgentSpec{
				Model: toolnexusv1alpha1.ModelSpec{Name: "helm-e2e", BaseURL: model.URL(),
					APIKeySecretRef: &toolnexusv1alpha1.SecretKeyReference{Name: secret, Key: "apiKey"}},
				Tools: []toolnexusv1alpha1.ToolSpec{{Name: "deploy",
					Parameters: &apiextensionsv1.JSON{Raw: []byte(`{"type":"object","properties":{"service":{"type":"string"}}}`)},
					HTTP:       &toolnexusv1alpha1.HTTPToolSpec{URL: tool.URL() + "/deploy"}}},
				Suspension: &toolnexusv1alpha1.SuspensionPolicy{Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice"}}},
			}},
		}
		// The chart's admission policies refuse AgentRuns for a moment after their kind is new.
		eventually(t, time.Minute, "creating AgentRun "+name, func() error { return admin.Create(ctx, run) })
		return run
	}
	answer := func(preq *toolnexusv1alpha1.PendingRequest) {
		t.Helper()
		if err := toolnexustest.Approve(ctx, alice.Client, preq); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("a suspended run goes to its end under the installed chart", func(t *testing.T) {
		model := deployModel()
		run := newRun("first", "llm", model)
		preq, err := toolnexustest.WaitForRequest(ctx, admin, run)
		if err != nil {
			t.Fatal(err)
		}
		answer(preq)
		done, err := toolnexustest.WaitForPhase(ctx, admin, run, toolnexusv1alpha1.RunPhaseSucceeded)
		if err != nil {
			t.Fatal(err)
		}
		if done.Status.Text != "checkout is deployed" {
			t.Errorf("status.text = %q, want the model's last answer", done.Status.Text)
		}
		answered := &toolnexusv1alpha1.PendingRequest{}
		if err := admin.Get(ctx, client.ObjectKeyFromObject(preq), answered); err != nil {
			t.Fatal(err)
		}
		if answered.Status.AnsweredBy != "alice" {
			t.Errorf("answeredBy = %q, want alice, stamped by the chart's admission policies", answered.Status.AnsweredBy)
		}
		for _, r := range model.Requests() {
			if got := r.Header.Get("Authorization"); got != "Bearer "+unlabelledKey {
				t.Errorf("the model was sent Authorization %q, want the unlabelled Secret's key: the default values require no label", got)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	parkedModel := deployModel()
	parked := newRun("parked", "llm-allowed", parkedModel)
	parkedRequest, err := toolnexustest.WaitForRequest(ctx, admin, parked)
	if err != nil {
		t.Fatal(err)
	}

	upgrade := action.NewUpgrade(helm)
	upgrade.Namespace = chartNamespace
	upgrade.WaitStrategy, upgrade.Timeout = kube.HookOnlyStrategy, time.Minute
	r, err = upgrade.RunWithContext(ctx, releaseName, chart, map[string]any{
		"manager": map[string]any{"requireSecretLabel": true, "maxToolCallsPerTurn": 2, "extraArgs": []any{"--zap-log-level=debug"}},
	})
	upgraded := released(t, r, err)
	after := readDeployment(t, admin)
	t.Run("the upgrade re-renders the manager's Deployment with the new values", func(t *testing.T) {
		if upgraded.Version != 2 {
			t.Errorf("release revision %d after the upgrade, want 2", upgraded.Version)
		}
		if after.generation <= before.generation {
			t.Errorf("the Deployment's generation is %d after the upgrade, %d before: its pod template did not change", after.generation, before.generation)
		}
		for _, want := range []string{"--require-secret-label", "--max-tool-calls-per-turn=2", "--zap-log-level=debug", "--leader-elect"} {
			if !slices.Contains(after.args, want) {
				t.Errorf("after the upgrade the manager's args %q lack %s", after.args, want)
			}
		}
	})

	// A rollout: the old pod is stopped, a pod of the new template starts.
	manager.stop(syscall.SIGTERM)
	manager = startDeployed(t, env, bin, logs, after)

	t.Run("the restarted manager runs with the new flags", func(t *testing.T) {
		// A model with no script: any request to it fails the test.
		refused := newRun("unlabelled", "llm", toolnexustest.NewModel(t))
		eventually(t, time.Minute, "the run waits for the Secret's label", func() error {
			got := &toolnexusv1alpha1.AgentRun{}
			if err := admin.Get(ctx, client.ObjectKeyFromObject(refused), got); err != nil {
				return err
			}
			c := meta.FindStatusCondition(got.Status.Conditions, toolnexusv1alpha1.ConditionSucceeded)
			if c == nil || c.Reason != toolnexusv1alpha1.ReasonSecretNotAllowed || !strings.Contains(c.Message, toolnexusv1alpha1.SecretAccessLabel) {
				return fmt.Errorf("condition Succeeded is %+v, want reason %s naming the label", c, toolnexusv1alpha1.ReasonSecretNotAllowed)
			}
			return nil
		})
	})

	t.Run("the run parked across the upgrade is the same run, answered on the same request", func(t *testing.T) {
		still := &toolnexusv1alpha1.PendingRequest{}
		if err := admin.Get(ctx, client.ObjectKeyFromObject(parkedRequest), still); err != nil {
			t.Fatal(err)
		}
		if still.UID != parkedRequest.UID || still.Status.Answer != nil {
			t.Fatalf("PendingRequest %s is uid %s answered %v after the upgrade, want uid %s unanswered", still.Name, still.UID, still.Status.Answer, parkedRequest.UID)
		}
		answer(still)
		done, err := toolnexustest.WaitForPhase(ctx, admin, parked, toolnexusv1alpha1.RunPhaseSucceeded)
		if err != nil {
			t.Fatal(err)
		}
		if done.UID != parked.UID || done.Status.Text != "checkout is deployed" {
			t.Errorf("run %s (uid %s) ended with text %q, want uid %s and the model's last answer", done.Name, done.UID, done.Status.Text, parked.UID)
		}
		var requests toolnexusv1alpha1.PendingRequestList
		if err := admin.List(ctx, &requests, client.InNamespace(ns), client.MatchingLabels{toolnexusv1alpha1.RunLabel: parked.Name}); err != nil {
			t.Fatal(err)
		}
		if len(requests.Items) != 1 || requests.Items[0].UID != parkedRequest.UID {
			t.Errorf("%d PendingRequests of the parked run, want its one request %s", len(requests.Items), parkedRequest.UID)
		}
		var calls []toolnexustest.Call
		for _, c := range tool.Calls() {
			if strings.HasPrefix(c.IdempotencyKey, string(parked.UID)+"/") {
				calls = append(calls, c)
			}
		}
		if len(calls) != 2 || calls[0].Answer != nil || calls[1].Answer == nil || calls[1].IdempotencyKey != calls[0].IdempotencyKey+"/answer" {
			t.Errorf("the parked run's tool calls %+v, want a first call and one retry with alice's answer", calls)
		}
		// The run's second model turn ran under --require-secret-label, with the labelled Secret.
		if requests := parkedModel.Requests(); len(requests) != 2 || requests[1].Header.Get("Authorization") != "Bearer "+labelledKey {
			t.Errorf("the parked run's model got %d requests, want 2, the last with the labelled Secret's key", len(requests))
		}
	})

	uninstall := action.NewUninstall(helm)
	uninstall.WaitStrategy, uninstall.Timeout = kube.StatusWatcherStrategy, time.Minute
	if _, err := uninstall.Run(releaseName); err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	// The Deployment is gone, and with it, on a cluster, the manager's pod.
	manager.stop(syscall.SIGTERM)
	t.Run("uninstall removes the release and keeps the CRDs and the runs", func(t *testing.T) {
		for _, o := range objects {
			got := live(t, admin, o)
			// Helm never deletes what crds/ installed, so AgentRuns and PendingRequests outlive a
			// release; everything else goes.
			if o.GetKind() == "CustomResourceDefinition" {
				if got == nil {
					t.Errorf("helm uninstall deleted %s", o.GetName())
				}
				continue
			}
			if got != nil && got.GetDeletionTimestamp() == nil {
				t.Errorf("after helm uninstall, %s %s still exists", o.GetKind(), o.GetName())
			}
		}
		kept := &toolnexusv1alpha1.AgentRun{}
		if err := admin.Get(ctx, client.ObjectKeyFromObject(parked), kept); err != nil || kept.Status.Phase != toolnexusv1alpha1.RunPhaseSucceeded {
			t.Errorf("after helm uninstall the finished run reads %v (phase %q), want it kept", err, kept.Status.Phase)
		}
	})
}

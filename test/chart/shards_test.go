package chart

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// With shards the chart renders the unsharded Deployment as before and one more per shard, the
// same manager with --shard and its pods labelled, selected apart from the others.
func TestShardsRenderADeploymentEach(t *testing.T) {
	base := byKey(t, helmTemplate(t))
	objs := byKey(t, helmTemplate(t, "shards={a,b}", "replicaCount=2", "manager.maxInflight=64"))
	deployments := map[string]*unstructured.Unstructured{}
	for k, o := range objs {
		if o.GetKind() == "Deployment" {
			deployments[o.GetName()] = o
		} else if base[k] == nil {
			t.Errorf("shards add %s; they add only Deployments", k)
		}
	}
	if len(deployments) != 3 {
		t.Fatalf("rendered Deployments %v, want toolnexus-controller-manager and one per shard", keys(deployments))
	}
	unsharded := deployments["toolnexus-controller-manager"]
	if args := argsOf(t, unsharded); strings.Contains(strings.Join(args, " "), "--shard") {
		t.Errorf("the unsharded Deployment runs with %v", args)
	}
	if replicas, _, _ := unstructured.NestedFieldNoCopy(unsharded.Object, "spec", "replicas"); fmt.Sprint(replicas) != "2" {
		t.Errorf("%v replicas, want replicaCount's 2", replicas)
	}
	for _, shard := range []string{"a", "b"} {
		got := deployments["toolnexus-controller-manager-"+shard]
		if got == nil {
			t.Fatalf("no Deployment toolnexus-controller-manager-%s in %v", shard, keys(deployments))
		}
		// The unsharded Deployment, named for the shard, its pods labelled and selected by the
		// shard too, the manager run with --shard.
		want := unsharded.DeepCopy()
		want.SetName("toolnexus-controller-manager-" + shard)
		for _, path := range [][]string{{"metadata", "labels"}, {"spec", "selector", "matchLabels"}, {"spec", "template", "metadata", "labels"}} {
			labels, _, _ := unstructured.NestedStringMap(want.Object, path...)
			labels["toolnexus.dev/shard"] = shard
			if err := unstructured.SetNestedStringMap(want.Object, labels, path...); err != nil {
				t.Fatal(err)
			}
		}
		containers, _, _ := unstructured.NestedSlice(want.Object, "spec", "template", "spec", "containers")
		c := containers[0].(map[string]any)
		c["args"] = append([]any{"--shard=" + shard}, c["args"].([]any)...)
		if err := unstructured.SetNestedSlice(want.Object, containers, "spec", "template", "spec", "containers"); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want.Object, got.Object); diff != "" {
			t.Errorf("shard %s (-the unsharded Deployment with --shard=%s +rendered):\n%s", shard, shard, diff)
		}
	}
}

func TestShardsRefuseNamesNoManagerTakes(t *testing.T) {
	for _, tc := range []struct {
		set  string
		want string
	}{
		{"shards={Team_A}", `shards: "Team_A" is no DNS label`},
		{"shards={a,a}", "shards [a a]: each shard is named once"},
		{"shards={" + strings.Repeat("a", 64) + "}", "is longer than 63 characters"},
	} {
		t.Run(tc.set, func(t *testing.T) {
			_, err := render(t, tc.set)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("helm template --set %s: %v, want an error saying %q", tc.set, err, tc.want)
			}
		})
	}
}

func argsOf(t *testing.T, d *unstructured.Unstructured) []string {
	t.Helper()
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	var args []string
	for _, a := range containers[0].(map[string]any)["args"].([]any) {
		args = append(args, a.(string))
	}
	return args
}

func keys(m map[string]*unstructured.Unstructured) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

package controller_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/toolnexus/operator/internal/controller"
)

func TestShards(t *testing.T) {
	for _, tc := range []struct {
		shard, lease string
		selects      map[string]bool // label set (shard value, "-" for none) → selected
		wantErr      string
	}{
		{shard: "", lease: "toolnexus-operator.toolnexus.dev", selects: map[string]bool{"-": true, "a": false, "": false}},
		{shard: "a", lease: "toolnexus-operator-shard-a.toolnexus.dev", selects: map[string]bool{"-": false, "a": true, "b": false}},
		{shard: "team-7", lease: "toolnexus-operator-shard-team-7.toolnexus.dev", selects: map[string]bool{"team-7": true, "team": false}},
		{shard: "Team_A", wantErr: `--shard "Team_A": a lowercase RFC 1123 label`},
		{shard: strings.Repeat("a", 64), wantErr: "must be no more than 63 characters"},
		{shard: "-a", wantErr: "must start and end with an alphanumeric character"},
	} {
		t.Run(tc.shard, func(t *testing.T) {
			opts, err := controller.CacheOptions(tc.shard, nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("CacheOptions(%q) = %v, want an error saying %q", tc.shard, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := controller.LeaderElectionID(tc.shard); got != tc.lease {
				t.Errorf("LeaderElectionID(%q) = %q, want %q", tc.shard, got, tc.lease)
			}
			if len(opts.ByObject) != 3 {
				t.Fatalf("%d kinds selected by shard, want AgentRuns, PendingRequests and AgentRunRecords", len(opts.ByObject))
			}
			for obj, by := range opts.ByObject {
				for value, want := range tc.selects {
					set := labels.Set{"toolnexus.dev/run": "r"}
					if value != "-" {
						set["toolnexus.dev/shard"] = value
					}
					if got := by.Label.Matches(set); got != want {
						t.Errorf("%T of shard %q: selects %v = %t, want %t", obj, tc.shard, set, got, want)
					}
				}
			}
		})
	}
}

func TestCacheOptionsNamespaces(t *testing.T) {
	opts, err := controller.CacheOptions("", []string{"team-a", " team-b"})
	if err != nil {
		t.Fatal(err)
	}
	if len(opts.DefaultNamespaces) != 2 {
		t.Fatalf("DefaultNamespaces = %v, want team-a and team-b", opts.DefaultNamespaces)
	}
	for _, ns := range []string{"team-a", "team-b"} {
		if _, ok := opts.DefaultNamespaces[ns]; !ok {
			t.Errorf("namespace %s is not watched: %v", ns, opts.DefaultNamespaces)
		}
	}
	if opts.DefaultTransform == nil {
		t.Error("managed fields are not stripped")
	}
}

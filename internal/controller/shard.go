package controller

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// A shard is one manager's part of the runs, as in Flux's sharding: a manager started with
// --shard=NAME caches only the AgentRuns, PendingRequests and AgentRunRecords labelled
// toolnexus.dev/shard=NAME, one started without caches only those without the label. So every run
// has exactly one manager that sees it, each shard elects its own leader and has its own executor
// (its own process), and what the runs share (Agents, ApprovalPolicies, Namespaces, the Secrets'
// metadata) stays cluster-wide in every shard.

// CacheOptions is the cache of a manager of shard ("" for none) watching namespaces (all when
// none): managed fields stripped, and the run's kinds limited to the shard's objects. cmd/manager
// and the test harness both build their cache with it.
func CacheOptions(shard string, namespaces []string) (cache.Options, error) {
	if err := checkShard(shard); err != nil {
		return cache.Options{}, err
	}
	// Managed fields are never read here; stripping them keeps thousands of parked runs small.
	o := cache.Options{DefaultTransform: cache.TransformStripManagedFields()}
	if len(namespaces) > 0 {
		o.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			o.DefaultNamespaces[strings.TrimSpace(ns)] = cache.Config{}
		}
	}
	// The shard's objects are labelled with its name; those of no shard not at all.
	op, values := selection.Equals, []string{shard}
	if shard == "" {
		op, values = selection.DoesNotExist, nil
	}
	req, err := labels.NewRequirement(toolnexusv1alpha1.ShardLabel, op, values)
	if err != nil {
		return cache.Options{}, fmt.Errorf("--shard %q: %w", shard, err)
	}
	selector := labels.NewSelector().Add(*req)
	o.ByObject = map[client.Object]cache.ByObject{}
	// Records have no informer now (they are read around the cache); the selector keeps one added
	// later to its shard.
	for _, obj := range []client.Object{&toolnexusv1alpha1.AgentRun{}, &toolnexusv1alpha1.PendingRequest{}, &toolnexusv1alpha1.AgentRunRecord{}} {
		o.ByObject[obj] = cache.ByObject{Label: selector}
	}
	return o, nil
}

// LeaderElectionID is the name of shard's leader-election lease: each shard elects its own leader.
func LeaderElectionID(shard string) string {
	if shard == "" {
		return "toolnexus-operator.toolnexus.dev"
	}
	return "toolnexus-operator-shard-" + shard + ".toolnexus.dev"
}

// checkShard refuses a shard name that cannot name a lease, a Deployment and a label value alike:
// it must be a DNS label (RFC 1123: lowercase letters, digits and '-', at most 63).
func checkShard(shard string) error {
	if shard == "" {
		return nil
	}
	if errs := validation.IsDNS1123Label(shard); len(errs) > 0 {
		return fmt.Errorf("--shard %q: %s", shard, strings.Join(errs, "; "))
	}
	return nil
}

package main

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// policies measures what the platform's ApprovalPolicies cost a tool call: the throughput
// workload's rounds without any, then with -policies installed, none of which gates the workload's
// calls (so every call is checked against all of them and runs), in the same run of the bench.
func (h *harness) policies(ctx context.Context) error {
	for round := range h.cfg.rounds {
		r, err := h.throughputRound(ctx, 100+round, h.cfg.turns)
		if err != nil {
			return err
		}
		logf("policies: round %d without policies: %.1f turns/s, CPU/turn: manager %.2f ms", round, r.rate(), r.cpuPerTurn())
		h.results.policiesNone = append(h.results.policiesNone, r)
	}
	created, err := h.installPolicies(ctx, h.cfg.policies)
	if err != nil {
		return err
	}
	defer func() {
		for _, p := range created {
			_ = h.c.Delete(context.WithoutCancel(ctx), p)
		}
	}()
	for round := range h.cfg.rounds {
		r, err := h.throughputRound(ctx, 200+round, h.cfg.turns)
		if err != nil {
			return err
		}
		logf("policies: round %d with %d policies: %.1f turns/s, CPU/turn: manager %.2f ms", round, len(created), r.rate(), r.cpuPerTurn())
		h.results.policiesMany = append(h.results.policiesMany, r)
	}
	return nil
}

// installPolicies creates n ApprovalPolicies as a platform would have them, none gating the
// workload: half select namespaces by a label the bench's lack, the rest select every namespace
// with tool globs the workload's tool does not match, and one in ten of those has a `when`; then
// waits until each is Ready.
func (h *harness) installPolicies(ctx context.Context, n int) ([]*toolnexusv1alpha1.ApprovalPolicy, error) {
	var out []*toolnexusv1alpha1.ApprovalPolicy
	for i := range n {
		p := &toolnexusv1alpha1.ApprovalPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-policy-%03d", i)},
			Spec: toolnexusv1alpha1.ApprovalPolicySpec{
				Tools:     []string{fmt.Sprintf("delete_%d_*", i), fmt.Sprintf("github_merge_%d", i)},
				Approvers: toolnexusv1alpha1.Approvers{Groups: []string{"sre"}},
			},
		}
		switch {
		case i%2 == 0:
			p.Spec.NamespaceSelector = &toolnexusv1alpha1.LabelSelector{MatchLabels: map[string]toolnexusv1alpha1.LabelValue{"tier": "prod"}}
		case i%10 == 1:
			p.Spec.Tools, p.Spec.When = []string{"*"}, fmt.Sprintf("tool == 'delete_%d' && args.amount > 1000", i)
		}
		if err := h.c.Create(ctx, p); err != nil {
			return out, err
		}
		out = append(out, p)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for _, p := range out {
		for {
			got := &toolnexusv1alpha1.ApprovalPolicy{}
			if err := h.c.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
				return out, err
			}
			if meta.IsStatusConditionTrue(got.Status.Conditions, toolnexusv1alpha1.ConditionReady) {
				break
			}
			if time.Now().After(deadline) {
				return out, fmt.Errorf("ApprovalPolicy %s is not Ready after 2 minutes", p.Name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	logf("policies: %d ApprovalPolicies installed and Ready", len(out))
	return out, nil
}

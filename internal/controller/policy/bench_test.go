package policy

import (
	"context"
	"fmt"
	"testing"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// BenchmarkCheck100Policies is the cost policies add to one tool call with 100 installed (issue
// #27): most select other namespaces or other tools, a few have a when. "gated" is a call two
// policies gate (a third's when does not hold); "ungated" one no policy matches. Run it with
//
//	go test -run '^$' -bench Check100Policies -benchmem ./internal/controller/policy/
func BenchmarkCheck100Policies(b *testing.B) {
	var policies []*toolnexusv1alpha1.ApprovalPolicy
	add := func(name string, edit func(*toolnexusv1alpha1.ApprovalPolicySpec)) {
		policies = append(policies, newPolicy(name, edit))
	}
	for i := range 60 { // other teams' namespaces
		add(fmt.Sprintf("team-%02d-prod", i), func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.NamespaceSelector = selector(map[string]toolnexusv1alpha1.LabelValue{"team": toolnexusv1alpha1.LabelValue(fmt.Sprintf("team-%02d", i)), "tier": "prod"})
			s.Tools = []string{"delete_*", "github_merge_*", fmt.Sprintf("team%02d_*", i)}
		})
	}
	for i := range 25 { // this namespace, other tools
		add(fmt.Sprintf("prod-tools-%02d", i), func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.NamespaceSelector = selector(map[string]toolnexusv1alpha1.LabelValue{"tier": "prod"})
			s.Tools = []string{fmt.Sprintf("tool%02d_*", i), "kubectl_delete"}
		})
	}
	for i := range 8 { // every namespace, other tools, with a when
		add(fmt.Sprintf("all-when-%d", i), func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.Tools, s.When = []string{fmt.Sprintf("shell%d", i)}, `args.command.contains("rm")`
		})
	}
	for i := range 4 { // this namespace and tool, other runs
		add(fmt.Sprintf("runs-%d", i), func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.RunSelector = selector(map[string]toolnexusv1alpha1.LabelValue{"app": toolnexusv1alpha1.LabelValue(fmt.Sprintf("app-%d", i))})
			s.Tools = []string{"payments_*"}
		})
	}
	add("refunds", func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
		s.NamespaceSelector = selector(map[string]toolnexusv1alpha1.LabelValue{"tier": "prod"})
		s.Tools = []string{"payments_refund"}
	})
	add("large-amounts", func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
		s.Tools, s.When = []string{"payments_*"}, `namespace == "payments" && labels["env"] == "live" && args.amount > 1000.0`
		s.Prompt = `Refund {{index .arguments "amount"}} {{index .arguments "currency"}}?`
	})
	add("other-currency", func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
		s.Tools, s.When = []string{"payments_*"}, `args.currency == "USD"`
	})
	r := fed(policies...)
	for i := range 200 {
		r.setNamespace(fmt.Sprintf("team-%02d", i), map[string]string{"team": fmt.Sprintf("team-%02d", i), "tier": "prod"})
	}
	r.setNamespace("payments", map[string]string{"team": "payments", "tier": "prod", "kubernetes.io/metadata.name": "payments"})
	runLabels := map[string]string{"app": "billing", "env": "live"}
	args := map[string]any{"amount": 5000.0, "currency": "EUR"}
	raw := `{"amount":5000,"currency":"EUR"}`
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		tool  string
		gates int
	}{{"gated", "payments_refund", 2}, {"ungated", "read_invoice", 0}} {
		if gates, err := r.Check(ctx, Call{Namespace: "payments", Labels: runLabels, Tool: c.tool, Args: args, ID: "call_1", RawArguments: raw}); err != nil || len(gates) != c.gates {
			b.Fatalf("%s: %d gates (%v), want %d", c.name, len(gates), err, c.gates)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Check(ctx, Call{Namespace: "payments", Labels: runLabels, Tool: c.tool, Args: args, ID: "call_1", RawArguments: raw}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

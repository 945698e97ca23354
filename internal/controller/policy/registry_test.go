package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// newPolicy is a policy named name at generation 1 that gates every tool for group sre, changed
// by edit.
func newPolicy(name string, edit func(*toolnexusv1alpha1.ApprovalPolicySpec)) *toolnexusv1alpha1.ApprovalPolicy {
	p := &toolnexusv1alpha1.ApprovalPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Generation: 1},
		Spec: toolnexusv1alpha1.ApprovalPolicySpec{Tools: []string{"*"}, Approvers: toolnexusv1alpha1.Approvers{Groups: []string{"sre"}},
			Required: 1, OnTimeout: toolnexusv1alpha1.OnTimeoutDecline},
	}
	if edit != nil {
		edit(&p.Spec)
	}
	return p
}

func selector(labels map[string]toolnexusv1alpha1.LabelValue, exprs ...toolnexusv1alpha1.LabelSelectorRequirement) *toolnexusv1alpha1.LabelSelector {
	return &toolnexusv1alpha1.LabelSelector{MatchLabels: labels, MatchExpressions: exprs}
}

// fed is a registry that has read policies, and namespaces prod (tier=prod) and dev (tier=dev).
func fed(policies ...*toolnexusv1alpha1.ApprovalPolicy) *Registry {
	r := NewRegistry()
	r.synced = nil
	r.setNamespace("prod", map[string]string{"tier": "prod", "kubernetes.io/metadata.name": "prod"})
	r.setNamespace("dev", map[string]string{"tier": "dev"})
	for _, p := range policies {
		r.setPolicy(p)
	}
	return r
}

// outcome is a gate in brief: the policy, and "refused: <message>", or the request's id (with
// " whenError" when the when could not be evaluated).
func outcomes(gates []Gate) []string {
	var out []string
	for _, g := range gates {
		switch {
		case g.Refused != "":
			out = append(out, g.Policy+" refused: "+g.Refused)
		case g.Request.Data["whenError"] != nil:
			out = append(out, g.Policy+" "+g.Request.ID+" whenError")
		default:
			out = append(out, g.Policy+" "+g.Request.ID)
		}
	}
	return out
}

type testCall struct {
	namespace string
	labels    map[string]string
	tool      string
	args      map[string]any
}

func (c testCall) check(t *testing.T, r *Registry) []Gate {
	t.Helper()
	gates, err := r.Check(context.Background(), Call{Namespace: c.namespace, Labels: c.labels, Tool: c.tool, Args: c.args, ID: "call_1"})
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return gates
}

func TestCheckApplies(t *testing.T) {
	prodOnly := func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
		s.NamespaceSelector = selector(map[string]toolnexusv1alpha1.LabelValue{"tier": "prod"})
	}
	tests := []struct {
		name   string
		policy func(*toolnexusv1alpha1.ApprovalPolicySpec)
		call   testCall
		want   []string
	}{
		{name: "no selectors: every namespace and run", call: testCall{namespace: "dev", tool: "x"},
			want: []string{"p policy:p:call_1"}},
		{name: "namespaceSelector matches", policy: prodOnly, call: testCall{namespace: "prod", tool: "x"},
			want: []string{"p policy:p:call_1"}},
		{name: "namespaceSelector does not match", policy: prodOnly, call: testCall{namespace: "dev", tool: "x"}},
		{name: "an empty namespaceSelector selects every namespace", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.NamespaceSelector = selector(nil)
		}, call: testCall{namespace: "dev", tool: "x"}, want: []string{"p policy:p:call_1"}},
		{name: "namespaceSelector expression", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.NamespaceSelector = selector(nil, toolnexusv1alpha1.LabelSelectorRequirement{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"prod"}})
		}, call: testCall{namespace: "dev", tool: "x"}, want: []string{"p policy:p:call_1"}},
		{name: "runSelector matches", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.RunSelector = selector(map[string]toolnexusv1alpha1.LabelValue{"team": "payments"})
		}, call: testCall{namespace: "dev", labels: map[string]string{"team": "payments"}, tool: "x"}, want: []string{"p policy:p:call_1"}},
		{name: "runSelector does not match", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.RunSelector = selector(map[string]toolnexusv1alpha1.LabelValue{"team": "payments"})
		}, call: testCall{namespace: "dev", labels: map[string]string{"team": "web"}, tool: "x"}},
		{name: "runSelector, run without labels", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.RunSelector = selector(nil, toolnexusv1alpha1.LabelSelectorRequirement{Key: "team", Operator: metav1.LabelSelectorOpExists})
		}, call: testCall{namespace: "dev", tool: "x"}},
		{name: "a glob matches", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.Tools = []string{"github_merge_*", "delete_*"} },
			call: testCall{namespace: "dev", tool: "delete_user"}, want: []string{"p policy:p:call_1"}},
		{name: "no glob matches", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.Tools = []string{"github_merge_*", "delete_*"} },
			call: testCall{namespace: "dev", tool: "get_user"}},
		{name: "when over args holds", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.When = "args.amount > 1000.0" },
			call: testCall{namespace: "dev", tool: "pay", args: map[string]any{"amount": 5000.0}}, want: []string{"p policy:p:call_1"}},
		{name: "when over args does not hold", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.When = "args.amount > 1000.0" },
			call: testCall{namespace: "dev", tool: "pay", args: map[string]any{"amount": 5.0}}},
		{name: "when over namespace", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.When = `namespace == "prod" && tool == "pay"` },
			call: testCall{namespace: "prod", tool: "pay"}, want: []string{"p policy:p:call_1"}},
		{name: "when over namespace does not hold", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.When = `namespace == "prod"` },
			call: testCall{namespace: "dev", tool: "pay"}},
		{name: "when over the run's labels", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.When = `labels["env"] == "live"` },
			call: testCall{namespace: "dev", labels: map[string]string{"env": "live"}, tool: "pay"}, want: []string{"p policy:p:call_1"}},
		{name: "when over the labels of a run without labels", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.When = `!("env" in labels)` },
			call: testCall{namespace: "dev", tool: "pay"}, want: []string{"p policy:p:call_1"}},
		{name: "a when that cannot be evaluated gates", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.When = "args.amount > 1000.0" },
			call: testCall{namespace: "dev", tool: "pay"}, want: []string{"p policy:p:call_1 whenError"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := fed(newPolicy("p", tt.policy))
			if diff := cmp.Diff(tt.want, outcomes(tt.call.check(t, r))); diff != "" {
				t.Errorf("gates (-want +got):\n%s", diff)
			}
		})
	}
}

// A policy that cannot be used fails closed: it matches at least every call it would match if
// it were right, and each is refused, naming the policy and the field at fault.
func TestCheckFailsClosed(t *testing.T) {
	badSelector := toolnexusv1alpha1.LabelSelectorRequirement{Key: "tier", Operator: metav1.LabelSelectorOpIn} // In needs values
	refused := func(field string) string {
		return "p refused: ApprovalPolicy p cannot be applied, so the calls it gates are refused until it is fixed: spec." + field
	}
	tests := []struct {
		name   string
		policy func(*toolnexusv1alpha1.ApprovalPolicySpec)
		call   testCall
		want   string // prefix of the one outcome; empty: no gate
	}{
		{name: "a broken namespaceSelector selects every namespace", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.NamespaceSelector = selector(nil, badSelector)
			s.Tools = []string{"delete_*"}
		}, call: testCall{namespace: "dev", tool: "delete_x"}, want: refused("namespaceSelector: values: Invalid value")},
		{name: "a broken namespaceSelector leaves the globs to decide", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.NamespaceSelector = selector(nil, badSelector)
			s.Tools = []string{"delete_*"}
		}, call: testCall{namespace: "dev", tool: "get_x"}},
		{name: "a broken runSelector selects every run", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.RunSelector = selector(map[string]toolnexusv1alpha1.LabelValue{"bad key!": "x"})
		}, call: testCall{namespace: "dev", tool: "x"}, want: refused("runSelector: ")},
		{name: "a broken when: the globs decide", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.Tools, s.When = []string{"pay"}, "args.amount >"
		}, call: testCall{namespace: "dev", tool: "pay", args: map[string]any{"amount": 1.0}}, want: refused(`when: when "args.amount >": ERROR`)},
		{name: "a broken when: a tool no glob matches", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.Tools, s.When = []string{"pay"}, "args.amount >"
		}, call: testCall{namespace: "dev", tool: "get"}},
		{name: "a when that yields no bool", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.When = "tool" },
			call: testCall{namespace: "dev", tool: "x"}, want: refused(`when: when "tool" yields string, want bool`)},
		{name: "a broken prompt", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.Prompt = "{{.tool" },
			call: testCall{namespace: "dev", tool: "x"}, want: refused("prompt: prompt: template: p:1: unclosed action")},
		{name: "broken globs match every tool", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.Tools, s.When = []string{"pay[", "x"}, `namespace == "prod"`
		}, call: testCall{namespace: "dev", tool: "anything"}, want: refused(`tools: tool pattern "pay[": syntax error in pattern`)},
		{name: "a prompt that cannot be rendered for this call", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.Prompt = `{{index .arguments.list 5}}`
		}, call: testCall{namespace: "dev", tool: "x", args: map[string]any{"list": []any{}}},
			want: refused("prompt: prompt cannot be rendered: template: p:1:2: executing")},
		{name: "every field at fault is named", policy: func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
			s.RunSelector = selector(nil, badSelector)
			s.When, s.Prompt = "args.x ==", "{{"
		}, call: testCall{namespace: "dev", tool: "x"}, want: refused("runSelector: ")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gates := tt.call.check(t, fed(newPolicy("p", tt.policy)))
			got := outcomes(gates)
			switch {
			case tt.want == "" && len(got) > 0:
				t.Errorf("gates %q, want none", got)
			case tt.want != "" && (len(got) != 1 || !strings.HasPrefix(got[0], tt.want)):
				t.Errorf("gates %q, want one starting %q", got, tt.want)
			case len(gates) == 1 && gates[0].Request != nil:
				t.Errorf("a refused gate has a request: %+v", gates[0].Request)
			}
		})
	}
	// The last case names each field.
	gates := testCall{namespace: "dev", tool: "x"}.check(t, fed(newPolicy("p", tests[len(tests)-1].policy)))
	for _, field := range []string{"spec.runSelector: ", "; spec.when: ", "; spec.prompt: "} {
		if !strings.Contains(gates[0].Refused, field) {
			t.Errorf("refusal %q does not name %s", gates[0].Refused, field)
		}
	}
}

// A gate carries the request the approver sees and the policy's terms, defaults applied.
func TestCheckGate(t *testing.T) {
	p := newPolicy("prod-changes", func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
		s.Tools = []string{"delete_*"}
		s.Approvers = toolnexusv1alpha1.Approvers{Users: []string{"alice"}, Groups: []string{"sre"}}
		s.Required, s.ExcludeRequester, s.OnTimeout = 2, true, ""
		s.Timeout = &metav1.Duration{Duration: 4 * time.Hour}
		s.Escalation = []toolnexusv1alpha1.EscalationStep{{After: metav1.Duration{Duration: 30 * time.Minute},
			Approvers: &toolnexusv1alpha1.Approvers{Groups: []string{"sre-leads"}}}}
	})
	p.Generation = 3
	custom := newPolicy("custom", func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
		s.Prompt, s.Required = `Delete {{index .arguments "id"}} with {{.tool}}?`, 0
	})
	r := fed(p, custom)
	gates, err := r.Check(context.Background(), Call{Namespace: "prod", Tool: "delete_user", Args: map[string]any{"id": "u1"}, ID: "call_7", RawArguments: `{"id":"u1"}`})
	if err != nil {
		t.Fatal(err)
	}
	want := []Gate{
		{Policy: "custom", Generation: 1,
			Request: &tools.Request{ID: "policy:custom:call_7", Kind: wire.KindApproval, Prompt: "Delete u1 with delete_user?",
				Data: map[string]any{"tool": "delete_user", "arguments": map[string]any{"id": "u1"}, "policy": "custom"}},
			Terms: Terms{Policy: toolnexusv1alpha1.PolicyReference{Name: "custom", Generation: 1},
				Approvers: toolnexusv1alpha1.Approvers{Groups: []string{"sre"}}, Required: 1, OnTimeout: toolnexusv1alpha1.OnTimeoutDecline}},
		{Policy: "prod-changes", Generation: 3,
			Request: &tools.Request{ID: "policy:prod-changes:call_7", Kind: wire.KindApproval,
				Prompt: "Approve the call to delete_user? (policy prod-changes)",
				Data:   map[string]any{"tool": "delete_user", "arguments": map[string]any{"id": "u1"}, "policy": "prod-changes"}},
			Terms: Terms{Policy: toolnexusv1alpha1.PolicyReference{Name: "prod-changes", Generation: 3},
				Approvers: toolnexusv1alpha1.Approvers{Users: []string{"alice"}, Groups: []string{"sre"}}, Required: 2,
				ExcludeRequester: true, Escalation: p.Spec.Escalation, Timeout: 4 * time.Hour, OnTimeout: toolnexusv1alpha1.OnTimeoutDecline}},
	}
	if diff := cmp.Diff(want, gates); diff != "" {
		t.Errorf("gates (-want +got):\n%s", diff)
	}

	// The terms go into the run's state as JSON and come back whole.
	raw, err := json.Marshal(gates[1].Terms)
	if err != nil {
		t.Fatal(err)
	}
	var back Terms
	if err := json.Unmarshal(raw, &back); err != nil || !cmp.Equal(back, gates[1].Terms) {
		t.Errorf("terms round trip: %s -> %+v, %v", raw, back, err)
	}

	// A gate's terms are its own: changing them changes nothing the next call sees.
	gates[1].Terms.Approvers.Groups[0] = "everyone"
	gates[1].Terms.Escalation[0].Approvers.Groups[0] = "everyone"
	again, _ := r.Check(context.Background(), Call{Namespace: "prod", Tool: "delete_user", ID: "call_8"})
	if again[1].Terms.Approvers.Groups[0] != "sre" || again[1].Terms.Escalation[0].Approvers.Groups[0] != "sre-leads" {
		t.Errorf("a caller's change of a gate's terms reached the registry: %+v", again[1].Terms)
	}
}

// Gates come sorted by policy name, whatever order the policies were read in; deleting and
// changing a policy take effect on the next call.
func TestCheckSortedAndCurrent(t *testing.T) {
	r := fed()
	for _, name := range []string{"m", "z", "a", "k"} {
		r.setPolicy(newPolicy(name, nil))
	}
	call := testCall{namespace: "dev", tool: "x"}
	if diff := cmp.Diff([]string{"a policy:a:call_1", "k policy:k:call_1", "m policy:m:call_1", "z policy:z:call_1"}, outcomes(call.check(t, r))); diff != "" {
		t.Errorf("gates (-want +got):\n%s", diff)
	}
	r.deletePolicy("k")
	changed := newPolicy("m", func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.Tools = []string{"other"} })
	changed.Generation = 2
	r.setPolicy(changed)
	if diff := cmp.Diff([]string{"a policy:a:call_1", "z policy:z:call_1"}, outcomes(call.check(t, r))); diff != "" {
		t.Errorf("after delete and change (-want +got):\n%s", diff)
	}
	// The same generation seen again (a status update) keeps what was compiled.
	stale := newPolicy("a", func(s *toolnexusv1alpha1.ApprovalPolicySpec) { s.Tools = []string{"other"} })
	r.setPolicy(stale)
	if got := outcomes(call.check(t, r)); len(got) != 2 {
		t.Errorf("gates %q: a policy seen again at its generation was compiled again", got)
	}
}

// A request id fits what a request holds, and stays one per policy and call.
func TestRequestIDBound(t *testing.T) {
	long := strings.Repeat("p", 253)
	longCall := strings.Repeat("c", 200)
	ids := map[string]bool{}
	for _, c := range []struct{ policy, call string }{
		{"p", "call_1"}, {long, "call_1"}, {long, "call_2"}, {"p", longCall}, {long, longCall}, {long[:200], "call_1"},
	} {
		id := requestID(c.policy, c.call)
		if len(id) > wire.MaxRequestIDLen || !strings.HasPrefix(id, RequestIDPrefix) {
			t.Errorf("requestID(%d bytes, %d bytes) = %q (%d bytes), want at most %d starting %s",
				len(c.policy), len(c.call), id, len(id), wire.MaxRequestIDLen, RequestIDPrefix)
		}
		if ids[id] {
			t.Errorf("requestID(%d bytes, %d bytes) = %q again", len(c.policy), len(c.call), id)
		}
		ids[id] = true
		if again := requestID(c.policy, c.call); again != id {
			t.Errorf("requestID is not stable: %q, then %q", id, again)
		}
	}
	if got := requestID("p", "call_1"); got != "policy:p:call_1" {
		t.Errorf("requestID = %q, want policy:p:call_1", got)
	}
	// The request of a gate built from such an id is one a PendingRequest holds.
	gates := testCall{namespace: "dev", tool: "x"}.check(t, fed(newPolicy(long, nil)))
	if err := gates[0].Request.CheckBounds(); err != nil {
		t.Errorf("the request of a long policy name: %v", err)
	}
}

// Until the policies and namespaces are read, and until the run's namespace is seen, a call
// waits; it never runs ungated.
func TestCheckWaits(t *testing.T) {
	short := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 50*time.Millisecond)
	}
	r := NewRegistry()
	ctx, cancel := short()
	defer cancel()
	if gates, err := r.Check(ctx, Call{Namespace: "dev", Tool: "x", ID: "c"}); gates != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a registry not fed: Check = %v, %v; want the context's deadline", gates, err)
	} else if f := loop.Classify(fmt.Errorf("loop: BeforeTool hook for x: %w", err)); !f.Transient {
		t.Errorf("the step that waited fails %+v; want a transient failure, retried with backoff", f)
	}

	synced := make(chan struct{})
	r.synced = []<-chan struct{}{synced}
	r.setPolicy(newPolicy("p", nil))
	done := make(chan []Gate)
	go func() {
		gates, _ := r.Check(context.Background(), Call{Namespace: "new", Tool: "x", ID: "c"})
		done <- gates
	}()
	select {
	case gates := <-done:
		t.Fatalf("Check returned %v before the handlers synced", gates)
	case <-time.After(50 * time.Millisecond):
	}
	close(synced)
	select {
	case gates := <-done:
		t.Fatalf("Check returned %v before namespace new was seen", gates)
	case <-time.After(50 * time.Millisecond):
	}
	r.setNamespace("other", nil)
	r.setNamespace("new", map[string]string{"tier": "prod"})
	select {
	case gates := <-done:
		if diff := cmp.Diff([]string{"p policy:p:c"}, outcomes(gates)); diff != "" {
			t.Errorf("gates (-want +got):\n%s", diff)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Check still waits after the namespace was seen")
	}

	// With no policy at all, a namespace not seen yet cannot matter.
	empty := fed()
	if gates, err := empty.Check(context.Background(), Call{Namespace: "unseen", Tool: "x", ID: "c"}); gates != nil || err != nil {
		t.Errorf("no policies: Check = %v, %v", gates, err)
	}
	ctx, cancel = short()
	defer cancel()
	if _, err := r.Check(ctx, Call{Namespace: "unseen", Tool: "x", ID: "c"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("an unseen namespace: Check = %v, want the context's deadline", err)
	}
}

// A namespace's labels are read when the call is checked: relabelling a namespace moves its
// runs in or out of a policy.
func TestCheckNamespaceLabels(t *testing.T) {
	r := fed(newPolicy("p", func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
		s.NamespaceSelector = selector(map[string]toolnexusv1alpha1.LabelValue{"tier": "prod"})
	}))
	call := testCall{namespace: "dev", tool: "x"}
	if got := outcomes(call.check(t, r)); got != nil {
		t.Errorf("dev: gates %q", got)
	}
	labels := map[string]string{"tier": "prod"}
	r.setNamespace("dev", labels)
	labels["tier"] = "dev" // the registry keeps its own copy
	if got := outcomes(call.check(t, r)); len(got) != 1 {
		t.Errorf("dev relabelled tier=prod: gates %q, want p", got)
	}
	r.deleteNamespace("dev")
	if _, seen := r.namespaces["dev"]; seen {
		t.Errorf("a deleted namespace is still kept")
	}
}

// A run's author names its tools and MCP servers; what a call reaches they do not: a policy over
// url and remoteTool holds the call however the tool is called.
func TestCheckSeesWhatACallReaches(t *testing.T) {
	r := fed(newPolicy("github-merges", func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
		s.When = `url.startsWith("https://mcp.github.test/") && remoteTool == "merge_pull_request"`
	}), newPolicy("payments", func(s *toolnexusv1alpha1.ApprovalPolicySpec) {
		s.When = `url == "https://pay.test/charge/{id}"`
	}))
	for _, tc := range []struct {
		name string
		call Call
		want []string
	}{
		{"an MCP tool under the name the platform expects", Call{Tool: "github_merge_pull_request", URL: "https://mcp.github.test/v1", RemoteTool: "merge_pull_request"},
			[]string{"github-merges policy:github-merges:call_1"}},
		{"the same tool behind a prefix the tenant chose", Call{Tool: "gh_merge_pull_request", URL: "https://mcp.github.test/v1", RemoteTool: "merge_pull_request"},
			[]string{"github-merges policy:github-merges:call_1"}},
		{"an HTTP tool renamed by the tenant", Call{Tool: "buy", URL: "https://pay.test/charge/{id}"}, []string{"payments policy:payments:call_1"}},
		{"another server's tool of that name", Call{Tool: "gh_merge_pull_request", URL: "https://mcp.other.test/", RemoteTool: "merge_pull_request"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.call
			c.Namespace, c.ID = "prod", "call_1"
			gates, err := r.Check(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, outcomes(gates)); diff != "" {
				t.Errorf("gates (-want +got):\n%s", diff)
			}
		})
	}
}

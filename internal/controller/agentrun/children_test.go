package agentrun

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller/runspec"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/runstore"
	"github.com/toolnexus/operator/internal/tools/wire"
)

func delegatedBy(path ...string) *toolnexusv1alpha1.AgentRun {
	run := &toolnexusv1alpha1.AgentRun{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: path[len(path)-1], UID: types.UID("uid-" + path[len(path)-1])}}
	if len(path) > 1 {
		run.Spec.DelegatedBy = &toolnexusv1alpha1.Delegation{Path: path[:len(path)-1], ParentUID: "uid-" + path[len(path)-2], RootUID: "uid-" + path[0], CallID: "call_1"}
	}
	return run
}

// A child's name is the same for the same call of the same turn of the same run, different for
// any other, and always fits a label value.
func TestChildName(t *testing.T) {
	run := delegatedBy("orders")
	long := delegatedBy(strings.Repeat("a-very-long-run-name-", 10) + "end")
	name := childName(run, 1, "call_1")
	if again := childName(run, 1, "call_1"); again != name || !strings.HasPrefix(name, "orders-") {
		t.Errorf("childName = %q then %q, want one name starting with the run's", name, again)
	}
	other := run.DeepCopy()
	other.UID = "uid-another-orders"
	for _, n := range []string{childName(run, 2, "call_1"), childName(run, 1, "call_2"), childName(other, 1, "call_1")} {
		if n == name {
			t.Errorf("%q names two calls' children", n)
		}
	}
	for _, n := range []string{name, childName(long, 999, strings.Repeat("x", 256))} {
		if errs := validation.IsValidLabelValue(n); len(errs) > 0 || len(validation.IsDNS1123Subdomain(n)) > 0 {
			t.Errorf("%q is not a label value and an object name: %v", n, errs)
		}
	}
}

// A child carries the path from the root, the root's uid, its parent's requester, labels for people
// and no more.
func TestNewChild(t *testing.T) {
	parent := delegatedBy("orders", "orders-3f2a", "orders-3f2a-77c1")
	parent.Spec.RequestedBy = "alice"
	child := newChild(context.Background(), parent, 2, runspec.SubAgentCall{Tool: "buyer", Agent: "purchasing", CallID: "call_9", Prompt: "buy a gpu"})
	want := toolnexusv1alpha1.AgentRunSpec{AgentRef: &toolnexusv1alpha1.AgentReference{Name: "purchasing"}, Prompt: "buy a gpu", RequestedBy: "alice",
		DelegatedBy: &toolnexusv1alpha1.Delegation{Path: []string{"orders", "orders-3f2a", "orders-3f2a-77c1"},
			ParentUID: "uid-orders-3f2a-77c1", RootUID: "uid-orders", CallID: "call_9"}}
	if diff := cmp.Diff(want, child.Spec); diff != "" {
		t.Errorf("spec (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{toolnexusv1alpha1.RootRunLabel: "orders", toolnexusv1alpha1.ParentRunLabel: "orders-3f2a-77c1"}, child.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if child.Annotations != nil {
		t.Errorf("annotations %v without a trace", child.Annotations)
	}
}

// What a call's child may be found as: its own (adopted), or anything else (refused, named).
func TestAdoptable(t *testing.T) {
	parent := delegatedBy("orders")
	want := newChild(context.Background(), parent, 1, runspec.SubAgentCall{Agent: "purchasing", CallID: "call_1", Prompt: "buy a gpu"})
	want.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(parent, toolnexusv1alpha1.GroupVersion.WithKind("AgentRun"))}
	for _, tc := range []struct {
		name string
		edit func(*toolnexusv1alpha1.AgentRun)
		want string
	}{
		{"the call's own", func(*toolnexusv1alpha1.AgentRun) {}, ""},
		{"another owner", func(c *toolnexusv1alpha1.AgentRun) { c.OwnerReferences = nil }, "is not the run this call creates"},
		{"another call", func(c *toolnexusv1alpha1.AgentRun) { c.Spec.DelegatedBy.CallID = "call_2" }, "is not the run this call creates"},
		{"a run nobody delegated", func(c *toolnexusv1alpha1.AgentRun) { c.Spec.DelegatedBy = nil }, "is not the run this call creates"},
		{"another prompt", func(c *toolnexusv1alpha1.AgentRun) { c.Spec.Prompt = "buy two" }, "with another agent or prompt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			found := want.DeepCopy()
			tc.edit(found)
			if got := adoptable(found, parent, want); (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("adoptable = %q, want %q", got, tc.want)
			}
		})
	}
}

// A run keeps the children its calls wait on and those a call still to run may adopt; any other
// is cancelled.
func TestWaitedOn(t *testing.T) {
	run := delegatedBy("orders")
	st := loop.NewState("buy")
	st.Turn = 3
	st.Calls = []loop.Call{
		{ID: "waiting", Phase: loop.PhaseWaiting, Args: "{}", Wait: &loop.Wait{Wait: wire.Wait{Kind: wire.WaitKindAgentRun, ID: "orders-child-w"}}},
		{ID: "queued", Phase: loop.PhaseQueued},
		{ID: "task", Phase: loop.PhaseWaiting, Args: "{}", Wait: &loop.Wait{Wait: wire.Wait{Kind: wire.WaitKindMCPTask, ID: "t-1"}}},
		{ID: "done", Phase: loop.PhaseDone, Result: &wire.ToolResult{Output: "x"}},
	}
	got := waitedOn(&scope{run: run, rec: &runstore.Record{State: st}})
	want := map[string]bool{"orders-child-w": true, childName(run, 3, "queued"): true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("waitedOn (-want +got):\n%s", diff)
	}
}

// A request of a delegated run names its root and its path; one of a run nobody delegated gets
// neither.
func TestMarkLineage(t *testing.T) {
	preq := &toolnexusv1alpha1.PendingRequest{}
	markLineage(preq, delegatedBy("orders"))
	if preq.Labels != nil || preq.Annotations != nil {
		t.Errorf("a root run's request got %v %v", preq.Labels, preq.Annotations)
	}
	markLineage(preq, delegatedBy("orders", "orders-3f2a"))
	if diff := cmp.Diff(map[string]string{toolnexusv1alpha1.RootRunLabel: "orders", toolnexusv1alpha1.RootRunUIDLabel: "uid-orders"}, preq.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if got := preq.RunPath(); !cmp.Equal(got, []string{"orders", "orders-3f2a"}) {
		t.Errorf("RunPath = %v", got)
	}
	if got := rootOfRequest(context.Background(), preq); !cmp.Equal(got, []reconcile.Request{{NamespacedName: types.NamespacedName{Name: "orders"}}}) {
		t.Errorf("rootOfRequest = %v", got)
	}
}

// A request of a delegated run wakes its root when it opens, closes or goes; its other changes
// (notifications, conditions) do not.
func TestRequestOfSubRun(t *testing.T) {
	p := requestOfSubRun()
	open := &toolnexusv1alpha1.PendingRequest{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{toolnexusv1alpha1.RootRunUIDLabel: "uid-orders"}}}
	notified := open.DeepCopy()
	notified.Status.Phase = toolnexusv1alpha1.RequestPhaseWaiting
	answered := open.DeepCopy()
	answered.Status.Answer = &toolnexusv1alpha1.Answer{OK: true}
	own := &toolnexusv1alpha1.PendingRequest{}
	for _, tc := range []struct {
		name string
		got  bool
		want bool
	}{
		{"opened", p.Create(event.CreateEvent{Object: open}), true},
		{"a root run's own", p.Create(event.CreateEvent{Object: own}), false},
		{"still open", p.Update(event.UpdateEvent{ObjectOld: open, ObjectNew: notified}), false},
		{"answered", p.Update(event.UpdateEvent{ObjectOld: notified, ObjectNew: answered}), true},
		{"deleted", p.Delete(event.DeleteEvent{Object: answered}), true},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: passes %t, want %t", tc.name, tc.got, tc.want)
		}
	}
}

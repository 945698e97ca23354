package operator_test

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller"
	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/internal/testenv/operator"
)

// waitReady waits until the Agent's Ready condition is True for its current generation: what only
// a running manager writes.
func waitReady(t *testing.T, c client.Client, agent *toolnexusv1alpha1.Agent) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got := &toolnexusv1alpha1.Agent{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(agent), got); err != nil {
			return false, err
		}
		ready := meta.FindStatusCondition(got.Status.Conditions, toolnexusv1alpha1.ConditionReady)
		return ready != nil && ready.Status == metav1.ConditionTrue && ready.ObservedGeneration == got.Generation, nil
	})
	if err != nil {
		t.Fatalf("Agent %s not Ready: %v", agent.Name, err)
	}
}

func TestManagerStartsStopsAndRestartsAsItsServiceAccount(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Install: []string{"rbac"}})
	starts := 0
	m := operator.New(t, env.Manager(t).Config, func() controller.Options {
		starts++
		return controller.Options{}
	})
	if m.Done() != nil {
		t.Fatal("Done of a manager never started is not nil")
	}
	m.Start(t)

	ns := env.Namespace(t, "operator-")
	agent := &toolnexusv1alpha1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a"},
		Spec: toolnexusv1alpha1.AgentSpec{Model: toolnexusv1alpha1.ModelSpec{Name: "m", BaseURL: "http://127.0.0.1:1/v1"}}}
	if err := env.Client.Create(context.Background(), agent); err != nil {
		t.Fatal(err)
	}
	waitReady(t, env.Client, agent)

	m.Restart(t)
	before := agent.DeepCopy()
	agent.Spec.SystemPrompt = "a new generation"
	if err := env.Client.Patch(context.Background(), agent, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	waitReady(t, env.Client, agent)
	if starts != 2 {
		t.Errorf("options called %d times, want once a start", starts)
	}

	done := m.Done()
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	default:
		t.Error("Done is open after Stop returned")
	}
	if err := m.Stop(); err != nil || m.Done() != nil {
		t.Errorf("Stop of a stopped manager: %v, Done %v; want nil and nil", err, m.Done())
	}
}

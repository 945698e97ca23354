package toolnexustest_test

import (
	"context"
	"fmt"
	"os"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/pkg/toolnexustest"
)

// A run whose purchase tool needs alice's approval parks on a PendingRequest; alice approves it,
// the tool runs once and the run succeeds.
func Example() {
	// In a test, t is the test's *testing.T (or Ginkgo's GinkgoT()); an example has none.
	t := newExampleT()
	defer t.finish()
	ctx := context.Background()

	env := toolnexustest.Start(t, toolnexustest.Options{})
	alice := env.User(t, "alice")
	env.Grant(t, toolnexustest.RoleAnswerer, alice)

	model := toolnexustest.NewModel(t,
		toolnexustest.ToolCalls(toolnexustest.ToolCall{ID: "call_1", Name: "purchase", Arguments: `{"amount":40,"item":"gpu"}`}),
		toolnexustest.Text("bought"))
	shop := toolnexustest.NewToolServer(t, func(toolnexustest.Call) toolnexustest.ToolReply {
		return toolnexustest.OK("order 7 placed")
	})

	run := &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: env.Namespace(t, "example-"), Name: "buy"},
		Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "buy a gpu", AgentSpec: toolnexusv1alpha1.AgentSpec{
			Model: toolnexusv1alpha1.ModelSpec{Name: "fake", BaseURL: model.URL()},
			Tools: []toolnexusv1alpha1.ToolSpec{{Name: "purchase",
				Parameters: &apiextensionsv1.JSON{Raw: []byte(`{"type":"object"}`)},
				HTTP:       &toolnexusv1alpha1.HTTPToolSpec{URL: shop.URL() + "/purchase"}}},
			Approvals:  []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"purchase"}}},
			Suspension: &toolnexusv1alpha1.SuspensionPolicy{Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice"}}},
		}},
	}
	if err := env.Admin.Create(ctx, run); err != nil {
		t.Fatalf("%v", err)
	}

	preq, err := env.WaitForRequest(ctx, run)
	if err != nil {
		t.Fatalf("%v", err)
	}
	fmt.Println(preq.Spec.Request.Kind, preq.Spec.Request.Prompt, preq.Spec.ToolCall.Arguments)
	if err := toolnexustest.Approve(ctx, alice.Client, preq); err != nil {
		t.Fatalf("%v", err)
	}

	done, err := env.WaitForPhase(ctx, run, toolnexusv1alpha1.RunPhaseSucceeded)
	if err != nil {
		t.Fatalf("%v", err)
	}
	fmt.Println(done.Status.Phase, done.Status.Text, len(shop.Calls()))
	// Output:
	// approval Approve the call to purchase? {"amount":40,"item":"gpu"}
	// Succeeded bought 1
}

// exampleT is the part of *testing.T the kit uses, for an example, which has none: a failure
// panics, and finish runs the cleanups, newest first.
type exampleT struct {
	cleanups []func()
}

func newExampleT() *exampleT { return &exampleT{} }

func (*exampleT) Helper() {}

func (*exampleT) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func (*exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func (t *exampleT) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }

func (t *exampleT) TempDir() string {
	dir, err := os.MkdirTemp("", "toolnexustest-example-")
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func (t *exampleT) finish() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

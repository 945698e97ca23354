package toolnexustest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/pkg/toolnexustest"
)

// run is a run in ns of one HTTP tool, purchase, at shop; gated adds an approval gate for it, and
// alice is the approver of every request.
func run(ns, name string, model *toolnexustest.Model, shop *toolnexustest.ToolServer, gated bool) *toolnexusv1alpha1.AgentRun {
	r := &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "buy a gpu", AgentSpec: toolnexusv1alpha1.AgentSpec{
			Model: toolnexusv1alpha1.ModelSpec{Name: "fake", BaseURL: model.URL()},
			Tools: []toolnexusv1alpha1.ToolSpec{{Name: "purchase",
				Parameters: &apiextensionsv1.JSON{Raw: []byte(`{"type":"object"}`)},
				HTTP:       &toolnexusv1alpha1.HTTPToolSpec{URL: shop.URL() + "/purchase"}}},
			Suspension: &toolnexusv1alpha1.SuspensionPolicy{Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice"}}},
		}},
	}
	if gated {
		r.Spec.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"purchase"}}}
	}
	return r
}

// lastMessage is what the model was last told: after a tool call, the tool's output.
func lastMessage(t *testing.T, req toolnexustest.ModelRequest) string {
	t.Helper()
	m, err := req.LastMessage()
	if err != nil {
		t.Fatal(err)
	}
	return m.Text
}

func TestTheOperatorRunsAgainstTheKit(t *testing.T) {
	ctx := context.Background()
	env := toolnexustest.Start(t, toolnexustest.Options{})
	alice, bob := env.User(t, "alice"), env.User(t, "bob", "shoppers")
	for _, u := range []*toolnexustest.User{alice, bob} {
		env.Grant(t, toolnexustest.RoleAnswerer, u)
	}
	ns := env.Namespace(t, "kit-")
	purchase := toolnexustest.ToolCalls(toolnexustest.ToolCall{ID: "call_1", Name: "purchase", Arguments: `{"amount":40}`})
	// The model's last answer repeats what the tool told it, so the run's text shows it was told.
	echo := toolnexustest.Computed(func(req toolnexustest.ModelRequest) toolnexustest.Reply {
		return toolnexustest.Text("told: " + lastMessage(t, req))
	})

	t.Run("a gated call parks, is approved by its approver as herself, runs once and the run succeeds", func(t *testing.T) {
		model := toolnexustest.NewModel(t, purchase, echo)
		shop := toolnexustest.NewToolServer(t, func(toolnexustest.Call) toolnexustest.ToolReply { return toolnexustest.OK("order 7") })
		r := run(ns, "gated", model, shop, true)
		if err := env.Admin.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		preq, err := env.WaitForRequest(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if preq.Spec.Request.Kind != "approval" || preq.Spec.ToolCall.Name != "purchase" {
			t.Fatalf("request %s asks %q about %q, want an approval of purchase", preq.Name, preq.Spec.Request.Kind, preq.Spec.ToolCall.Name)
		}
		if len(shop.Calls()) != 0 {
			t.Fatalf("the tool ran before its approval: %+v", shop.Calls())
		}
		if err := toolnexustest.Approve(ctx, bob.Client, preq); !apierrors.IsForbidden(err) {
			t.Fatalf("bob, an answerer but not the run's approver, approving: %v, want Forbidden", err)
		}
		if err := toolnexustest.Approve(ctx, alice.Client, preq); err != nil {
			t.Fatal(err)
		}
		done, err := env.WaitForPhase(ctx, r, toolnexusv1alpha1.RunPhaseSucceeded)
		if err != nil {
			t.Fatal(err)
		}
		if done.Status.Text != "told: order 7" {
			t.Errorf("run text %q, want the tool's output relayed by the model", done.Status.Text)
		}
		calls := shop.Calls()
		if len(calls) != 1 {
			t.Fatalf("the tool ran %d times, want once", len(calls))
		}
		if want := string(done.UID) + "/call_1"; !strings.HasPrefix(calls[0].IdempotencyKey, want) {
			t.Errorf("Idempotency-Key %q, want %s...", calls[0].IdempotencyKey, want)
		}
		if calls[0].Args["amount"] != float64(40) {
			t.Errorf("the tool got arguments %v, want the model's", calls[0].Args)
		}
		answered := &toolnexusv1alpha1.PendingRequest{}
		if err := env.Admin.Get(ctx, client.ObjectKeyFromObject(preq), answered); err != nil {
			t.Fatal(err)
		}
		if answered.Status.AnsweredBy != "alice" || answered.Status.Answer.RequestUID != string(preq.UID) {
			t.Errorf("answered by %q with requestUID %q, want alice bound to %s", answered.Status.AnsweredBy, answered.Status.Answer.RequestUID, preq.UID)
		}
	})

	t.Run("a declined call never runs and the model is told why", func(t *testing.T) {
		model := toolnexustest.NewModel(t, purchase, echo)
		shop := toolnexustest.NewToolServer(t, func(toolnexustest.Call) toolnexustest.ToolReply { return toolnexustest.OK("order 8") })
		r := run(ns, "declined", model, shop, true)
		if err := env.Admin.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		preq, err := env.WaitForRequest(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if err := toolnexustest.Decline(ctx, alice.Client, preq, "over budget"); err != nil {
			t.Fatal(err)
		}
		done, err := env.WaitForPhase(ctx, r, toolnexusv1alpha1.RunPhaseSucceeded)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(done.Status.Text, "over budget") {
			t.Errorf("run text %q, want the model told the reason", done.Status.Text)
		}
		if calls := shop.Calls(); len(calls) != 0 {
			t.Errorf("a declined tool ran: %+v", calls)
		}
	})

	t.Run("a tool's own input request is answered with a result the tool's retry receives", func(t *testing.T) {
		// The model fails once (a 503 the operator retries) and answers slowly once.
		model := toolnexustest.NewModel(t, toolnexustest.Failure(http.StatusServiceUnavailable, "overloaded"), purchase, echo.After(200*time.Millisecond))
		shop := toolnexustest.NewToolServer(t, func(c toolnexustest.Call) toolnexustest.ToolReply {
			if c.Answer == nil {
				return toolnexustest.NeedsInput("Which cost centre?")
			}
			return toolnexustest.OK("charged to " + c.Answer.Data["output"].(string))
		})
		r := run(ns, "input", model, shop, false)
		if err := env.Admin.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		preq, err := env.WaitForRequest(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if preq.Spec.Request.Kind != "input" || preq.Spec.Request.Prompt != "Which cost centre?" {
			t.Fatalf("request %s is %q %q, want the tool's input request", preq.Name, preq.Spec.Request.Kind, preq.Spec.Request.Prompt)
		}
		if err := toolnexustest.Answer(ctx, alice.Client, preq, toolnexusv1alpha1.Answer{OK: true, Data: toolnexustest.AnswerOutput("cc-42")}); err != nil {
			t.Fatal(err)
		}
		done, err := env.WaitForPhase(ctx, r, toolnexusv1alpha1.RunPhaseSucceeded)
		if err != nil {
			t.Fatal(err)
		}
		if done.Status.Text != "told: charged to cc-42" {
			t.Errorf("run text %q, want the retried tool's output", done.Status.Text)
		}
		calls := shop.Calls()
		if len(calls) != 2 || calls[0].Answer != nil || calls[1].Answer == nil || !calls[1].Answer.OK {
			t.Fatalf("calls %+v, want a first call without an answer and a retry with alice's", calls)
		}
		if !strings.HasSuffix(calls[1].IdempotencyKey, "/answer") || calls[1].IdempotencyKey != calls[0].IdempotencyKey+"/answer" {
			t.Errorf("Idempotency-Keys %q then %q, want the retry's to add /answer", calls[0].IdempotencyKey, calls[1].IdempotencyKey)
		}
		if n := len(model.Requests()); n != 3 {
			t.Errorf("the model was asked %d times, want 3 (a failure, the tool call, the answer)", n)
		}
	})

	t.Run("auth_required parks the run on an authorization request", func(t *testing.T) {
		model := toolnexustest.NewModel(t, purchase, echo)
		shop := toolnexustest.NewToolServer(t, func(c toolnexustest.Call) toolnexustest.ToolReply {
			if c.Answer == nil {
				return toolnexustest.AuthRequired("https://login.invalid/start", "session-1")
			}
			return toolnexustest.OK("logged in")
		})
		r := run(ns, "auth", model, shop, false)
		if err := env.Admin.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		preq, err := env.WaitForRequest(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		var data map[string]any
		if preq.Spec.Request.Data != nil {
			_ = json.Unmarshal(preq.Spec.Request.Data.Raw, &data)
		}
		if preq.Spec.Request.Kind != "authorization" || preq.Spec.Request.URL != "https://login.invalid/start" || data["auth_id"] != "session-1" {
			t.Fatalf("request %+v, want an authorization at the tool's URL with its auth_id", preq.Spec.Request)
		}
		if err := toolnexustest.Approve(ctx, alice.Client, preq); err != nil {
			t.Fatal(err)
		}
		if _, err := env.WaitForPhase(ctx, r, toolnexusv1alpha1.RunPhaseSucceeded); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("an answer bound to another request is refused", func(t *testing.T) {
		model := toolnexustest.NewModel(t, purchase, echo)
		shop := toolnexustest.NewToolServer(t, func(toolnexustest.Call) toolnexustest.ToolReply { return toolnexustest.OK("order 9") })
		r := run(ns, "stale", model, shop, true)
		if err := env.Admin.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		preq, err := env.WaitForRequest(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		stale := preq.DeepCopy()
		stale.UID = "00000000-0000-0000-0000-000000000000"
		err = toolnexustest.Approve(ctx, alice.Client, stale)
		if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "requestUID") {
			t.Fatalf("an answer bound to another uid: %v, want it refused", err)
		}
		if err := env.Admin.Delete(ctx, r); err != nil {
			t.Fatal(err)
		}
	})
}

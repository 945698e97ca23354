package answerbot_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	answerbot "github.com/toolnexus/operator/examples/answer-bot"
	"github.com/toolnexus/operator/pkg/toolnexustest"
)

// purchaseRun is a run whose model buys for amount with the gated tool purchase at shop; the bot's
// user is its approver.
func purchaseRun(t *testing.T, env *toolnexustest.Env, ns, name, amount string, shop *toolnexustest.ToolServer) *toolnexusv1alpha1.AgentRun {
	model := toolnexustest.NewModel(t,
		toolnexustest.ToolCalls(toolnexustest.ToolCall{ID: "call_1", Name: "purchase", Arguments: `{"amount":` + amount + `,"item":"gpu"}`}),
		// The model ends by repeating what it was told, so the run's text shows whether the
		// purchase was made or why not.
		toolnexustest.Computed(func(req toolnexustest.ModelRequest) toolnexustest.Reply {
			last, err := req.LastMessage()
			if err != nil {
				t.Error(err)
			}
			return toolnexustest.Text("told: " + last.Text)
		}))
	run := &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "buy a gpu", AgentSpec: toolnexusv1alpha1.AgentSpec{
			Model:      toolnexusv1alpha1.ModelSpec{Name: "fake", BaseURL: model.URL()},
			Tools:      []toolnexusv1alpha1.ToolSpec{{Name: "purchase", HTTP: &toolnexusv1alpha1.HTTPToolSpec{URL: shop.URL() + "/purchase"}}},
			Approvals:  []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"purchase"}}},
			Suspension: &toolnexusv1alpha1.SuspensionPolicy{Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"answer-bot"}}},
		}},
	}
	if err := env.Admin.Create(context.Background(), run); err != nil {
		t.Fatal(err)
	}
	return run
}

func TestTheBotApprovesSmallPurchasesAndDeclinesLargeOnes(t *testing.T) {
	ctx := context.Background()
	env := toolnexustest.Start(t, toolnexustest.Options{})
	botUser := env.User(t, "answer-bot")
	env.Grant(t, toolnexustest.RoleAnswerer, botUser)
	ns := env.Namespace(t, "answer-bot-")

	bot := &answerbot.Bot{Client: botUser.Client, Namespace: ns, Rule: answerbot.MaxAmount("purchase", 100)}
	botCtx, stopBot := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { bot.Run(botCtx, 100*time.Millisecond, func(err error) { t.Errorf("bot: %v", err) }) })
	t.Cleanup(func() { stopBot(); wg.Wait() })

	t.Run("a purchase of 40 is approved by the bot and the run succeeds", func(t *testing.T) {
		shop := toolnexustest.NewToolServer(t, func(toolnexustest.Call) toolnexustest.ToolReply { return toolnexustest.OK("order 7 placed") })
		run := purchaseRun(t, env, ns, "small", "40", shop)
		done, err := env.WaitForPhase(ctx, run, toolnexusv1alpha1.RunPhaseSucceeded)
		if err != nil {
			t.Fatal(err)
		}
		if done.Status.Text != "told: order 7 placed" {
			t.Errorf("run text %q, want the purchase's output", done.Status.Text)
		}
		if calls := shop.Calls(); len(calls) != 1 || calls[0].Args["amount"] != float64(40) {
			t.Errorf("the shop got %+v, want one purchase of 40", calls)
		}
		preq := answeredRequest(t, env, run)
		if preq.Status.AnsweredBy != "answer-bot" || !preq.Status.Answer.OK || preq.Status.Answer.RequestUID != string(preq.UID) {
			t.Errorf("answer %+v by %q, want the bot's approval bound to %s", preq.Status.Answer, preq.Status.AnsweredBy, preq.UID)
		}
	})

	t.Run("a purchase of 5000 is declined by the bot with a reason and never made", func(t *testing.T) {
		shop := toolnexustest.NewToolServer(t, func(toolnexustest.Call) toolnexustest.ToolReply { return toolnexustest.OK("order 8 placed") })
		run := purchaseRun(t, env, ns, "large", "5000", shop)
		done, err := env.WaitForPhase(ctx, run, toolnexusv1alpha1.RunPhaseSucceeded)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(done.Status.Text, "amount 5000 is over the limit of 100") {
			t.Errorf("run text %q, want the model told the bot's reason", done.Status.Text)
		}
		if calls := shop.Calls(); len(calls) != 0 {
			t.Errorf("a declined purchase was made: %+v", calls)
		}
		preq := answeredRequest(t, env, run)
		if preq.Status.AnsweredBy != "answer-bot" || preq.Status.Answer.OK {
			t.Errorf("answer %+v by %q, want the bot's refusal", preq.Status.Answer, preq.Status.AnsweredBy)
		}
	})
}

// answeredRequest is the run's one PendingRequest, as the administrator reads it.
func answeredRequest(t *testing.T, env *toolnexustest.Env, run *toolnexusv1alpha1.AgentRun) *toolnexusv1alpha1.PendingRequest {
	t.Helper()
	var list toolnexusv1alpha1.PendingRequestList
	if err := env.Admin.List(context.Background(), &list, client.InNamespace(run.Namespace),
		client.MatchingLabels{toolnexusv1alpha1.RunLabel: run.Name}); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Status.Answer == nil {
		t.Fatalf("run %s has requests %+v, want one answered", run.Name, list.Items)
	}
	return &list.Items[0]
}

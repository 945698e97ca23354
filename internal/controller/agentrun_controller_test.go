package controller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

var ctx = context.Background()

// newRun builds an AgentRun against the fake model at modelURL with HTTP tools served by ts.
func newRun(ns, name, modelURL string, ts *toolstest.Server, toolNames ...string) *toolnexusv1alpha1.AgentRun {
	run := &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "do the thing", AgentSpec: toolnexusv1alpha1.AgentSpec{
			Model: toolnexusv1alpha1.ModelSpec{Name: "gpt-4o-mini", BaseURL: modelURL},
		}},
	}
	for _, t := range toolNames {
		run.Spec.Tools = append(run.Spec.Tools, toolnexusv1alpha1.ToolSpec{
			Name: t, Description: "test tool " + t,
			Parameters: &apiextensionsv1.JSON{Raw: []byte(`{"type":"object","properties":{}}`)},
			HTTP:       &toolnexusv1alpha1.HTTPToolSpec{URL: ts.URL + "/" + t},
		})
	}
	return run
}

func getRun(run *toolnexusv1alpha1.AgentRun) *toolnexusv1alpha1.AgentRun {
	got := &toolnexusv1alpha1.AgentRun{}
	Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(run), got)).To(Succeed())
	return got
}

func phaseOf(run *toolnexusv1alpha1.AgentRun) func() toolnexusv1alpha1.RunPhase {
	return func() toolnexusv1alpha1.RunPhase { return getRun(run).Status.Phase }
}

func requestsOf(run *toolnexusv1alpha1.AgentRun) []toolnexusv1alpha1.PendingRequest {
	var list toolnexusv1alpha1.PendingRequestList
	Expect(k8sClient.List(ctx, &list, client.InNamespace(run.Namespace),
		client.MatchingLabels{toolnexusv1alpha1.RunLabel: run.Name})).To(Succeed())
	return list.Items
}

func requestNamed(run *toolnexusv1alpha1.AgentRun, name string) *toolnexusv1alpha1.PendingRequest {
	p := &toolnexusv1alpha1.PendingRequest{}
	Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: run.Namespace, Name: name}, p)).To(Succeed())
	return p
}

// answer patches status.answer the way `kubectl patch --subresource=status --type=merge` does.
func answer(p *toolnexusv1alpha1.PendingRequest, answerJSON string) {
	patchRequestStatus(p, `{"status":{"answer":`+answerJSON+`}}`)
}

// waitSuspended waits for the run to park on want requests and returns them.
func waitSuspended(run *toolnexusv1alpha1.AgentRun, want int) []toolnexusv1alpha1.PendingRequest {
	Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSuspended))
	Eventually(func() []toolnexusv1alpha1.PendingRequest { return requestsOf(run) }, eventually).Should(HaveLen(want))
	return requestsOf(run)
}

// lastToolMessages returns the tool results the model was sent in its last request.
func lastToolMessages(model *looptest.Server) []map[string]any {
	reqs := model.Requests()
	body := reqs[len(reqs)-1].JSON(GinkgoT())
	var out []map[string]any
	for _, m := range body["messages"].([]any) {
		msg := m.(map[string]any)
		if msg["role"] == "tool" {
			out = append(out, msg)
		}
	}
	return out
}

// reasonOf is the reason of the run's Succeeded condition, empty before it is set.
func reasonOf(run *toolnexusv1alpha1.AgentRun) string {
	if c := condition(run, toolnexusv1alpha1.ConditionSucceeded); c != nil {
		return c.Reason
	}
	return ""
}

func condition(run *toolnexusv1alpha1.AgentRun, t string) *metav1.Condition {
	return meta.FindStatusCondition(getRun(run).Status.Conditions, t)
}

var _ = Describe("AgentRun", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("runs the AuthRequired calendar seed: one authorization request, the tool retried once after ok", func() {
		ts := toolstest.Serve(GinkgoT(), func(c toolstest.Call) (int, string) {
			if c.Answer != nil && c.Answer.OK {
				return 200, "09:00 standup, 14:00 1:1"
			}
			return 200, toolstest.Pending(tools.Request{Kind: tools.KindAuthorization, Prompt: tools.DefaultAuthPrompt, URL: "https://accounts.example.com/authorize"})
		})
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "read_calendar", Arguments: "{}"}),
			looptest.OpenAIText("You have a 09:00 standup and a 14:00 1:1."))
		run := newRun(ns, "calendar", model.URL, ts, "read_calendar")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())

		reqs := waitSuspended(run, 1)
		preq := reqs[0]
		Expect(preq.Name).To(Equal("calendar-1-call-1"))
		Expect(preq.Spec.Request.Kind).To(Equal("authorization"))
		Expect(preq.Spec.Request.URL).To(Equal("https://accounts.example.com/authorize"))
		Expect(preq.Spec.Request.Prompt).To(Equal("Authorization required to continue"))
		Expect(preq.Spec.ToolCall).To(Equal(toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "read_calendar", Arguments: "{}"}))
		Expect(metav1.IsControlledBy(&preq, getRun(run))).To(BeTrue())
		st := getRun(run).Status
		Expect(st.Result).To(Equal("pending"))
		Expect(st.Text).To(Equal("Authorization required to continue"))
		Expect(st.Pending).To(ConsistOf(toolnexusv1alpha1.PendingSummary{Name: "calendar-1-call-1", Kind: "authorization",
			Prompt: "Authorization required to continue", URL: "https://accounts.example.com/authorize", ToolCallID: "call_1"}))
		Expect(condition(run, toolnexusv1alpha1.ConditionSuspended).Status).To(Equal(metav1.ConditionTrue))
		Eventually(func() toolnexusv1alpha1.RequestPhase { return requestNamed(run, preq.Name).Status.Phase }, eventually).
			Should(Equal(toolnexusv1alpha1.RequestPhaseWaiting))

		answer(&preq, `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		final := getRun(run).Status
		Expect(final.Text).To(Equal("You have a 09:00 standup and a 14:00 1:1."))
		Expect(final.Result).To(Equal("done"))
		Expect(final.Turns).To(Equal(int32(2)))
		Expect(final.Usage.TotalTokens).To(Equal(int64(30)))
		Expect(final.Pending).To(BeEmpty())
		Expect(final.TranscriptRef).NotTo(BeNil())
		Expect(condition(run, toolnexusv1alpha1.ConditionSucceeded).Status).To(Equal(metav1.ConditionTrue))
		Expect(condition(run, toolnexusv1alpha1.ConditionSuspended).Status).To(Equal(metav1.ConditionFalse))

		calls := ts.Calls()
		Expect(calls).To(HaveLen(2), "the tool runs once, then once more with the answer")
		Expect(calls[0].Answer).To(BeNil())
		Expect(calls[1].Answer).To(Equal(&tools.Answer{ID: preq.Spec.Request.ID, OK: true}))
		uid := string(getRun(run).UID)
		Expect(calls[0].IdempotencyKey).To(Equal(uid + "/call_1"))
		Expect(calls[1].IdempotencyKey).To(Equal(uid + "/call_1/answer"))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content", "09:00 standup, 14:00 1:1")))

		Eventually(func() []metav1.ConditionStatus {
			p := requestNamed(run, preq.Name)
			return []metav1.ConditionStatus{
				meta.FindStatusCondition(p.Status.Conditions, toolnexusv1alpha1.ConditionAnswered).Status,
				meta.FindStatusCondition(p.Status.Conditions, toolnexusv1alpha1.ConditionResolved).Status,
			}
		}, eventually).Should(Equal([]metav1.ConditionStatus{metav1.ConditionTrue, metav1.ConditionTrue}))
		Expect(requestNamed(run, preq.Name).Status.Phase).To(Equal(toolnexusv1alpha1.RequestPhaseAnswered))
	})

	It("stays Suspended while nobody answers", func() {
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) {
			return 200, toolstest.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "approve?"})
		})
		model := looptest.New(GinkgoT(), looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}))
		run := newRun(ns, "parked", model.URL, ts, "approve")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		waitSuspended(run, 1)
		Consistently(phaseOf(run), "2s").Should(Equal(toolnexusv1alpha1.RunPhaseSuspended))
		Expect(getRun(run).Status.Pending).To(HaveLen(1))
		Expect(ts.Calls()).To(HaveLen(1))
		Expect(model.Requests()).To(HaveLen(1))
	})

	It("feeds `unresolved: <prompt>` to the model when the retry suspends again, with exactly one request", func() {
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) {
			return 200, toolstest.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "approve?"})
		})
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "flaky_approve", Arguments: "{}"}),
			looptest.OpenAIText("gave up after one retry"))
		run := newRun(ns, "flaky", model.URL, ts, "flaky_approve")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		answer(&reqs[0], `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(requestsOf(run)).To(HaveLen(1))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content", "unresolved: approve?")))
		Expect(getRun(run).Status.ToolCalls).To(ConsistOf(HaveField("Output", "unresolved: approve?")))
	})

	It("tells the model a decline with its reason, and never re-runs the tool", func() {
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) {
			return 200, toolstest.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "Approve purchase of gpu?"})
		})
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve_purchase", Arguments: `{"item":"gpu"}`}),
			looptest.OpenAIText("ok, not buying"))
		run := newRun(ns, "declined", model.URL, ts, "approve_purchase")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		answer(&reqs[0], `{"ok":false,"reason":"too expensive"}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content",
			"declined/expired: Approve purchase of gpu?\nreason: too expensive")))
		Expect(ts.Calls()).To(HaveLen(1))
		Expect(ts.Calls()[0].Args).To(Equal(map[string]any{"item": "gpu"}))
	})

	It("passes free-text input to the retried tool", func() {
		ts := toolstest.Serve(GinkgoT(), func(c toolstest.Call) (int, string) {
			if c.Answer != nil {
				out, _ := c.Answer.OutputOf()
				return 200, "deployed to " + out
			}
			return 200, toolstest.Pending(tools.Request{Kind: tools.KindInput, Prompt: "Which environment?"})
		})
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "deploy", Arguments: "{}"}),
			looptest.OpenAIText("deployed"))
		run := newRun(ns, "deploy", model.URL, ts, "deploy")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		Expect(reqs[0].Spec.Request.Kind).To(Equal("input"))
		answer(&reqs[0], `{"ok":true,"data":{"output":"staging"}}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content", "deployed to staging")))
	})

	It("asks the question built-in and returns the answer data as JSON", func() {
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "question",
				Arguments: `{"questions":[{"question":"Pick a color?","options":["red","green"]}]}`}),
			looptest.OpenAIText("red it is"))
		run := newRun(ns, "question", model.URL, nil)
		run.Spec.Builtins = []toolnexusv1alpha1.Builtin{toolnexusv1alpha1.BuiltinQuestion}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		Expect(reqs[0].Spec.Request.Kind).To(Equal("question"))
		Expect(reqs[0].Spec.Request.Prompt).To(Equal("Pick a color? (options: red, green)"))
		answer(&reqs[0], `{"ok":true,"data":{"answers":["red"]}}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content", `{"answers":["red"]}`)))
	})

	It("raises an approval gate before the tool runs, and runs it once after approval", func() {
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, "user deleted" })
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(
				looptest.ToolCall{ID: "call_1", Name: "delete_user", Arguments: `{"user":"mallory","count":5}`},
				looptest.ToolCall{ID: "call_2", Name: "delete_user", Arguments: `{"user":"eve","count":1}`}),
			looptest.OpenAIText("done"))
		run := newRun(ns, "gated", model.URL, ts, "delete_user")
		run.Spec.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"delete_*"}, When: "args.count > 1"}}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		Expect(reqs[0].Spec.Request.ID).To(Equal("toolguard:call_1"))
		Expect(reqs[0].Spec.Request.Kind).To(Equal("approval"))
		Expect(reqs[0].Spec.Request.Prompt).To(Equal("Approve the call to delete_user?"))
		Expect(ts.Calls()).To(HaveLen(1), "only the call the gate let through has run")
		answer(&reqs[0], `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(ts.Calls()).To(HaveLen(2))
		Expect(ts.Calls()[1].Answer).To(BeNil(), "the approval is not the tool's own answer")
		Expect(ts.Calls()[1].IdempotencyKey).To(HaveSuffix("/call_1"), "the approved call's first run")
	})

	It("turns the LangSmith Fleet auth_required JSON into an authorization request", func() {
		ts := toolstest.Serve(GinkgoT(), func(c toolstest.Call) (int, string) {
			if c.Answer != nil {
				return 200, "3 unread messages"
			}
			return 200, `{"auth_required": true, "auth_url": "https://auth.example.com/start", "auth_id": "opaque-tracking-id"}`
		})
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "read_mail", Arguments: "{}"}),
			looptest.OpenAIText("you have 3 unread messages"))
		run := newRun(ns, "langsmith", model.URL, ts, "read_mail")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		Expect(reqs[0].Spec.Request.Kind).To(Equal("authorization"))
		Expect(reqs[0].Spec.Request.URL).To(Equal("https://auth.example.com/start"))
		Expect(reqs[0].Spec.Request.Prompt).To(Equal("Authorization required to continue"))
		Expect(string(reqs[0].Spec.Request.Data.Raw)).To(MatchJSON(`{"auth_id":"opaque-tracking-id"}`))
		answer(&reqs[0], `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content", "3 unread messages")))
	})

	It("keeps two suspensions of one turn apart, answered in reverse order, results in call order", func() {
		ts := toolstest.Serve(GinkgoT(), func(c toolstest.Call) (int, string) {
			switch {
			case c.Path == "/lookup":
				return 200, "looked up"
			case c.Answer != nil:
				return 200, "approved " + c.Path
			}
			return 200, toolstest.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "approve " + c.Path + "?"})
		})
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(
				looptest.ToolCall{ID: "call_a", Name: "first", Arguments: "{}"},
				looptest.ToolCall{ID: "call_b", Name: "lookup", Arguments: "{}"},
				looptest.ToolCall{ID: "call_c", Name: "second", Arguments: "{}"}),
			looptest.OpenAIText("all done"))
		run := newRun(ns, "two", model.URL, ts, "first", "lookup", "second")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		waitSuspended(run, 2)
		answer(requestNamed(run, "two-1-call-c"), `{"ok":true}`)
		Consistently(phaseOf(run), "1s").Should(Equal(toolnexusv1alpha1.RunPhaseSuspended))
		Expect(getRun(run).Status.Pending).To(ConsistOf(HaveField("Name", "two-1-call-a")))
		answer(requestNamed(run, "two-1-call-a"), `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(model.Requests()).To(HaveLen(2))
		msgs := lastToolMessages(model)
		Expect(msgs).To(HaveLen(3))
		Expect([]any{msgs[0]["tool_call_id"], msgs[1]["tool_call_id"], msgs[2]["tool_call_id"]}).To(Equal([]any{"call_a", "call_b", "call_c"}))
		Expect([]any{msgs[0]["content"], msgs[1]["content"], msgs[2]["content"]}).To(Equal([]any{"approved /first", "looked up", "approved /second"}))
		lookups := 0
		for _, c := range ts.Calls() {
			if c.Path == "/lookup" {
				lookups++
			}
		}
		Expect(lookups).To(Equal(1), "a call that did not suspend is never re-run")
	})

	It("fails the run with a redacted message on 401", func() {
		model := looptest.New(GinkgoT(), looptest.Reply{Status: http.StatusUnauthorized, Body: `{"error":{"message":"bad key sk-secret-123"}}`})
		run := newRun(ns, "unauthorized", model.URL, nil)
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseFailed))
		c := condition(run, toolnexusv1alpha1.ConditionSucceeded)
		Expect(c.Reason).To(Equal(toolnexusv1alpha1.ReasonModelError))
		Expect(c.Message).To(ContainSubstring("401"))
		Expect(c.Message).NotTo(ContainSubstring("sk-secret-123"))
	})

	It("retries a 429 with backoff and then succeeds", func() {
		model := looptest.New(GinkgoT(),
			looptest.Reply{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"1"}}, Body: `{"error":{"message":"slow down"}}`},
			looptest.Reply{Status: http.StatusServiceUnavailable, Body: `{}`},
			looptest.OpenAIText("finally"))
		run := newRun(ns, "ratelimited", model.URL, nil)
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("finally"))
		Expect(getRun(run).Status.ModelFailures).To(BeZero())
		Expect(model.Requests()).To(HaveLen(3))
	})

	It("waits for a missing Secret and starts when it appears; the key never reaches status", func() {
		model := looptest.New(GinkgoT(), looptest.OpenAIText("hello"))
		run := newRun(ns, "needs-key", model.URL, nil)
		run.Spec.Model.APIKeySecretRef = &toolnexusv1alpha1.SecretKeyReference{Name: "llm", Key: "apiKey"}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(func() string { return reasonOf(run) }, eventually).
			Should(Equal(toolnexusv1alpha1.ReasonSecretNotFound))
		Expect(condition(run, toolnexusv1alpha1.ConditionSucceeded).Message).To(ContainSubstring(`Secret "llm"`))
		Expect(model.Requests()).To(BeEmpty())

		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llm"},
			StringData: map[string]string{"apiKey": "sk-live-abcdef"}})).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(model.Requests()[0].Header.Get("Authorization")).To(Equal("Bearer sk-live-abcdef"))
		raw, err := json.Marshal(getRun(run))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(raw)).NotTo(ContainSubstring("sk-live-abcdef"))
	})

	It("cancels a parked run and marks its request cancelled", func() {
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) {
			return 200, toolstest.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "approve?"})
		})
		model := looptest.New(GinkgoT(), looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}))
		run := newRun(ns, "cancel-me", model.URL, ts, "approve")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		Expect(k8sClient.Patch(ctx, getRun(run), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"cancel":true}}`)))).To(Succeed())
		Eventually(func() string { return reasonOf(run) }, eventually).
			Should(Equal(toolnexusv1alpha1.ReasonCancelled))
		Expect(getRun(run).Status.Phase).To(Equal(toolnexusv1alpha1.RunPhaseFailed))
		Eventually(func() toolnexusv1alpha1.RequestPhase { return requestNamed(run, reqs[0].Name).Status.Phase }, eventually).
			Should(Equal(toolnexusv1alpha1.RequestPhaseCancelled))
	})

	It("ends Incomplete with limit maxTurns when the model never stops calling tools", func() {
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, "again" })
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "poke", Arguments: "{}"}),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_2", Name: "poke", Arguments: "{}"}))
		run := newRun(ns, "endless", model.URL, ts, "poke")
		run.Spec.MaxTurns = 2
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseIncomplete))
		st := getRun(run).Status
		Expect([]any{st.Result, st.Limit, st.Turns}).To(Equal([]any{"incomplete", "maxTurns", int32(2)}))
		Expect(condition(run, toolnexusv1alpha1.ConditionSucceeded).Status).To(Equal(metav1.ConditionFalse))
	})

	It("reaches the model with an unknown tool and malformed arguments as error results", func() {
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, "fine" })
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(
				looptest.ToolCall{ID: "call_1", Name: "nope", Arguments: "{}"},
				looptest.ToolCall{ID: "call_2", Name: "real", Arguments: `{"broken`}),
			looptest.OpenAIText("sorry"))
		run := newRun(ns, "garbage", model.URL, ts, "real")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		msgs := lastToolMessages(model)
		Expect(msgs[0]["content"]).To(Equal("Unknown tool: nope"))
		Expect(msgs[1]["content"]).To(ContainSubstring("invalid JSON arguments for real"))
		Expect(ts.Calls()).To(BeEmpty())
	})

	It("deletes a finished run after ttlSecondsAfterFinished", func() {
		model := looptest.New(GinkgoT(), looptest.OpenAIText("bye"))
		run := newRun(ns, "short-lived", model.URL, nil)
		run.Spec.TTLSecondsAfterFinished = ptr.To[int32](1)
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(func() bool {
			err := k8sClient.Get(ctx, client.ObjectKeyFromObject(run), &toolnexusv1alpha1.AgentRun{})
			return err != nil && strings.Contains(err.Error(), "not found")
		}, eventually).Should(BeTrue())
	})
})

var _ = Describe("AgentRun with a spec that passed admission but cannot run", func() {
	It("fails with InvalidSpec when a `when` expression does not compile, without crash-looping", func() {
		ns := newNamespace()
		model := looptest.New(GinkgoT())
		run := newRun(ns, "bad-when", model.URL, nil)
		run.Spec.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"*"}, When: "args.amount >"}}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseFailed))
		c := condition(run, toolnexusv1alpha1.ConditionSucceeded)
		Expect(c.Reason).To(Equal(toolnexusv1alpha1.ReasonInvalidSpec))
		Expect(c.Message).To(ContainSubstring("spec.approvals"))
		Expect(model.Requests()).To(BeEmpty())
	})

	It("fails with InvalidSpec when an approval prompt cannot be rendered, and runs nothing", func() {
		ns := newNamespace()
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, "ran" })
		model := looptest.New(GinkgoT(), looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "act", Arguments: "{}"}))
		run := newRun(ns, "bad-prompt", model.URL, ts, "act")
		run.Spec.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"*"}, Prompt: `{{printf "%600000000d" 1}}`}}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseFailed))
		c := condition(run, toolnexusv1alpha1.ConditionSucceeded)
		Expect(c.Reason).To(Equal(toolnexusv1alpha1.ReasonInvalidSpec))
		Expect(c.Message).To(ContainSubstring("prompt cannot be rendered"))
		Expect(ts.Calls()).To(BeEmpty())
		Expect(model.Requests()).To(HaveLen(1), "not retried as a model failure")
	})
})

var _ = Describe("AgentRun events", func() {
	It("records the run's start and end once, however fast its turns follow each other", func() {
		ns := newNamespace()
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, "done" })
		var replies []looptest.Reply
		for i := range 5 {
			replies = append(replies, looptest.OpenAIToolCalls(looptest.ToolCall{ID: fmt.Sprintf("call_%d", i), Name: "work", Arguments: "{}"}))
		}
		model := looptest.New(GinkgoT(), append(replies, looptest.OpenAIText("all done"))...)
		run := newRun(ns, "fast-turns", model.URL, ts, "work")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Turns).To(Equal(int32(6)))
		for _, reason := range []string{"RunStarted", "RunSucceeded"} {
			Eventually(func() int { return occurrences(run, reason) }, eventually).Should(Equal(1), reason)
			Consistently(func() int { return occurrences(run, reason) }, "1s").Should(Equal(1), reason)
		}
	})
})

// occurrences counts the run's events with reason, a series of isomorphic events counting each.
func occurrences(run *toolnexusv1alpha1.AgentRun, reason string) int {
	var list eventsv1.EventList
	Expect(k8sClient.List(ctx, &list, client.InNamespace(run.Namespace))).To(Succeed())
	n := 0
	for _, e := range list.Items {
		if e.Regarding.Name != run.Name || e.Reason != reason {
			continue
		}
		n++
		if e.Series != nil {
			n += int(e.Series.Count) - 1
		}
	}
	return n
}

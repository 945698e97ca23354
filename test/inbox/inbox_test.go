package inbox_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/pkg/toolnexustest"
)

// newRun is a run of prompt against the fake model, its agent spec completed by configure.
func newRun(ns, name, prompt string, model *toolnexustest.Model, configure func(*toolnexusv1alpha1.AgentSpec)) *toolnexusv1alpha1.AgentRun {
	run := &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: prompt, AgentSpec: toolnexusv1alpha1.AgentSpec{
			Model: toolnexusv1alpha1.ModelSpec{Name: "m", BaseURL: model.URL()},
		}},
	}
	configure(&run.Spec.AgentSpec)
	return run
}

// httpTool is an HTTP tool at the fake tool server.
func httpTool(name string, ts *toolnexustest.ToolServer) toolnexusv1alpha1.ToolSpec {
	return toolnexusv1alpha1.ToolSpec{
		Name: name, Parameters: &apiextensionsv1.JSON{Raw: []byte(`{"type":"object"}`)},
		HTTP: &toolnexusv1alpha1.HTTPToolSpec{URL: ts.URL() + "/" + name},
	}
}

// purchaseRun is a run whose purchase tool needs alice's approval.
func purchaseRun(ns string, ts *toolnexustest.ToolServer) *toolnexusv1alpha1.AgentRun {
	model := toolnexustest.NewModel(GinkgoT(),
		toolnexustest.ToolCalls(toolnexustest.ToolCall{ID: "call_1", Name: "purchase", Arguments: `{"amount":5000,"item":"gpu"}`}),
		toolnexustest.Text("Bought the gpu."))
	return newRun(ns, "buy-gpu", "buy a gpu", model, func(a *toolnexusv1alpha1.AgentSpec) {
		a.Tools = []toolnexusv1alpha1.ToolSpec{httpTool("purchase", ts)}
		a.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"purchase"}, Prompt: "Approve buying {{.arguments}}?"}}
		a.Suspension = &toolnexusv1alpha1.SuspensionPolicy{
			Timeout:   &metav1.Duration{Duration: 24 * time.Hour},
			Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice"}},
		}
	})
}

// openRequestPage starts user's inbox for the request's namespace and opens the request's page
// in a browser window of width x height.
func openRequestPage(user string, preq *toolnexusv1alpha1.PendingRequest, width, height int) context.Context {
	GinkgoHelper()
	url := startInbox(user, preq.Namespace)
	browser := newBrowser(width, height)
	base := strings.SplitN(url, "/?", 2)[0]
	Expect(load(browser, chromedp.Navigate(url))).To(BeEquivalentTo(http.StatusOK))
	Expect(load(browser, chromedp.Navigate(base+"/requests/"+preq.Namespace+"/"+preq.Name))).To(BeEquivalentTo(http.StatusOK))
	return browser
}

func purchaseTool() *toolnexustest.ToolServer {
	return toolnexustest.NewToolServer(GinkgoT(), func(toolnexustest.Call) toolnexustest.ToolReply { return toolnexustest.OK("purchased") })
}

// openRequest waits for the run's open PendingRequest.
func openRequest(run *toolnexusv1alpha1.AgentRun) *toolnexusv1alpha1.PendingRequest {
	GinkgoHelper()
	preq, err := env.WaitForRequest(ctx, run)
	Expect(err).NotTo(HaveOccurred())
	return preq
}

var _ = Describe("The inbox", func() {
	It("shows alice a request as it opens, takes her approval, and shows the run finish", func() {
		ns := newNamespace()
		url := startInbox("alice", ns)
		browser := newBrowser(1100, 800)
		Expect(load(browser, chromedp.Navigate(url))).To(BeEquivalentTo(http.StatusOK))
		run(browser, chromedp.WaitVisible(chromedp.CSS(".empty")))
		Expect(chromedp.Run(browser, chromedp.Location())).To(HaveSuffix("/"), "the token left the address bar")

		By("a run parks on alice after the page has loaded")
		ts := purchaseTool()
		buy := purchaseRun(ns, ts)
		Expect(admin.Create(ctx, buy)).To(Succeed())
		preq := openRequest(buy)
		card := `li.card[data-request="` + ns + "/" + preq.Name + `"]`
		Eventually(text(browser, card), eventually).Should(And(
			ContainSubstring(`Approve buying {"amount":5000,"item":"gpu"}?`), ContainSubstring("APPROVAL"),
			ContainSubstring("buy-gpu"), ContainSubstring("purchase"), ContainSubstring("alice"), ContainSubstring("in 23h")))
		screenshot(browser, "inbox-list")

		By("alice opens it and approves")
		Expect(load(browser, chromedp.Click(chromedp.CSS(card+" a")))).To(BeEquivalentTo(http.StatusOK))
		Expect(text(browser, "pre.args")()).To(ContainSubstring(`"amount": 5000`))
		Eventually(text(browser, "pre.transcript"), eventually).Should(ContainSubstring("-> call purchase call_1"))
		screenshot(browser, "inbox-request")
		Expect(load(browser, chromedp.Click(chromedp.CSS(`button[value=approve]`)))).To(BeEquivalentTo(http.StatusOK))
		Eventually(text(browser, ".answered"), eventually).Should(ContainSubstring("Answered ok: true by alice"))
		Eventually(text(browser, "#run-phase"), eventually).Should(Equal("Succeeded"))
		Eventually(text(browser, ".run"), eventually).Should(ContainSubstring("Bought the gpu."))
		run(browser, chromedp.WaitNotPresent(chromedp.CSS("#actions")))
		Expect(ts.Calls()).To(HaveLen(1), "the approved call ran once")

		got := &toolnexusv1alpha1.PendingRequest{}
		Expect(admin.Get(ctx, client.ObjectKeyFromObject(preq), got)).To(Succeed())
		Expect(got.Status.AnsweredBy).To(Equal("alice"), "the API server stamped who answered")
		Expect(got.Status.Answer.RequestUID).To(Equal(string(got.UID)), "the answer is bound to the request the page showed")

		By("the request leaves the list")
		Expect(load(browser, chromedp.Click(chromedp.CSS(".back a")))).To(BeEquivalentTo(http.StatusOK))
		run(browser, chromedp.WaitVisible(chromedp.CSS(".empty")))
	})

	It("shows bob the API server's refusal when he is no approver", func() {
		ns := newNamespace()
		ts := purchaseTool()
		buy := purchaseRun(ns, ts)
		Expect(admin.Create(ctx, buy)).To(Succeed())
		preq := openRequest(buy)
		_, err := env.WaitForPhase(ctx, buy, toolnexusv1alpha1.RunPhaseSuspended)
		Expect(err).NotTo(HaveOccurred())

		browser := openRequestPage("bob", preq, 1100, 800)
		Expect(load(browser, chromedp.Click(chromedp.CSS(`button[value=approve]`)))).To(BeEquivalentTo(http.StatusForbidden))
		Expect(text(browser, "#error")()).To(ContainSubstring("user bob may not answer this request: spec.approvers allows only"))
		Expect(text(browser, "#actions")()).To(ContainSubstring("Approve"), "the request can still be answered")

		got := &toolnexusv1alpha1.PendingRequest{}
		Expect(admin.Get(ctx, client.ObjectKeyFromObject(preq), got)).To(Succeed())
		Expect(got.Status.Answer).To(BeNil())
		Expect(ts.Calls()).To(BeEmpty())
	})

	It("answers an MCP form elicitation through the form it generates from the schema", func() {
		ns := newNamespace()
		mcpURL, received := deployServer()
		model := toolnexustest.NewModel(GinkgoT(),
			toolnexustest.ToolCalls(toolnexustest.ToolCall{ID: "call_1", Name: "ops_deploy", Arguments: `{"service":"web"}`}),
			toolnexustest.Text("Deployed."))
		deploy := newRun(ns, "deploy-web", "deploy web", model, func(a *toolnexusv1alpha1.AgentSpec) {
			a.MCPServers = []toolnexusv1alpha1.MCPServerSpec{{Name: "ops", URL: mcpURL}}
		})
		Expect(admin.Create(ctx, deploy)).To(Succeed())
		preq := openRequest(deploy)
		Expect(preq.Spec.Request.Kind).To(Equal("input"))

		browser := openRequestPage("alice", preq, 420, 900) // a phone-sized window
		Expect(text(browser, "#actions")()).To(And(ContainSubstring("Environment"), ContainSubstring("Replicas"), ContainSubstring("Notify the team")))
		run(browser,
			chromedp.SetValue(chromedp.CSS(`select[name="f.env"]`), "staging"),
			chromedp.SendKeys(chromedp.CSS(`input[name="f.replicas"]`), "3"),
			chromedp.SendKeys(chromedp.CSS(`input[name="f.note"]`), "after the standup"),
			chromedp.Click(chromedp.CSS(`input[name="f.notify"]`)))
		screenshot(browser, "inbox-form")
		Expect(load(browser, chromedp.Click(chromedp.CSS(`button[value=form]`)))).To(BeEquivalentTo(http.StatusOK))
		Eventually(text(browser, ".answered"), eventually).Should(ContainSubstring("by alice"))
		Eventually(text(browser, "#run-phase"), eventually).Should(Equal("Succeeded"))

		var content map[string]any
		Eventually(received, eventually).Should(Receive(&content))
		Expect(content).To(Equal(map[string]any{"env": "staging", "replicas": float64(3), "notify": true, "note": "after the standup"}))
	})
})

var _ = Describe("The inbox's question form", func() {
	It("sends the options alice picks, and the model receives them", func() {
		ns := newNamespace()
		model := toolnexustest.NewModel(GinkgoT(),
			toolnexustest.ToolCalls(toolnexustest.ToolCall{ID: "call_1", Name: "question", Arguments: `{"questions":[` +
				`{"question":"Which region?","options":["eu","us"]},` +
				`{"question":"Which sizes?","options":["S","M","L"],"multiple":true},` +
				`{"question":"Why?"}]}`}),
			toolnexustest.Text("Noted."))
		ask := newRun(ns, "ask", "ask me", model, func(a *toolnexusv1alpha1.AgentSpec) {
			a.Builtins = []toolnexusv1alpha1.Builtin{"question"}
		})
		Expect(admin.Create(ctx, ask)).To(Succeed())
		preq := openRequest(ask)

		browser := openRequestPage("alice", preq, 1100, 800)
		run(browser,
			chromedp.Click(chromedp.CSS(`input[name="q.0"][value="eu"]`)),
			chromedp.Click(chromedp.CSS(`input[name="q.1"][value="S"]`)),
			chromedp.Click(chromedp.CSS(`input[name="q.1"][value="L"]`)),
			chromedp.SendKeys(chromedp.CSS(`input[name="q.2"]`), "closer to users"))
		Expect(load(browser, chromedp.Click(chromedp.CSS(`button[value=question]`)))).To(BeEquivalentTo(http.StatusOK))
		Eventually(text(browser, "#run-phase"), eventually).Should(Equal("Succeeded"))

		requests := model.Requests()
		last, err := requests[len(requests)-1].LastMessage()
		Expect(err).NotTo(HaveOccurred())
		Expect(last.Role).To(Equal("tool"))
		Expect(last.Text).To(MatchJSON(`{"answers":[{"question":"Which region?","answer":"eu"},` +
			`{"question":"Which sizes?","answer":["S","L"]},{"question":"Why?","answer":"closer to users"}]}`))
	})
})

var _ = Describe("The inbox's sign-in page", func() {
	It("links to the login and resumes the tool when alice has signed in", func() {
		ns := newNamespace()
		ts := toolnexustest.NewToolServer(GinkgoT(), func(c toolnexustest.Call) toolnexustest.ToolReply {
			if c.Answer == nil {
				return toolnexustest.AuthRequired("http://127.0.0.1:9/login?state=x", "a1")
			}
			return toolnexustest.OK("3 new issues")
		})
		model := toolnexustest.NewModel(GinkgoT(),
			toolnexustest.ToolCalls(toolnexustest.ToolCall{ID: "call_1", Name: "issues", Arguments: `{}`}),
			toolnexustest.Text("You have 3 new issues."))
		issues := newRun(ns, "issues", "any new issues?", model, func(a *toolnexusv1alpha1.AgentSpec) {
			a.Tools = []toolnexusv1alpha1.ToolSpec{httpTool("issues", ts)}
		})
		Expect(admin.Create(ctx, issues)).To(Succeed())
		preq := openRequest(issues)
		Expect(preq.Spec.Request.Kind).To(Equal("authorization"))

		browser := openRequestPage("alice", preq, 1100, 800)
		link, err := chromedp.Run(browser, chromedp.OuterHTML(chromedp.CSS("a.signin")))
		Expect(err).NotTo(HaveOccurred())
		Expect(link).To(And(ContainSubstring(`href="http://127.0.0.1:9/login?state=x"`), ContainSubstring(`rel="noopener noreferrer"`)))
		Expect(load(browser, chromedp.Click(chromedp.CSS(`button[value=signed-in]`)))).To(BeEquivalentTo(http.StatusOK))
		Eventually(text(browser, "#run-phase"), eventually).Should(Equal("Succeeded"))
		Eventually(text(browser, ".run"), eventually).Should(ContainSubstring("You have 3 new issues."))
		calls := ts.Calls()
		Expect(calls).To(HaveLen(2))
		Expect(calls[1].Answer).NotTo(BeNil())
		Expect(calls[1].Answer.OK).To(BeTrue(), "the retry carries alice's answer")
	})
})

// deployServer serves an MCP server whose deploy tool asks for a form: where, how many replicas,
// whether to notify, and an optional note. The content of an accepted form arrives on received.
func deployServer() (url string, received chan map[string]any) {
	received = make(chan map[string]any, 1)
	schema := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"env":      map[string]any{"type": "string", "title": "Environment", "enum": []any{"staging", "production"}},
			"replicas": map[string]any{"type": "integer", "title": "Replicas", "minimum": 1, "maximum": 10},
			"notify":   map[string]any{"type": "boolean", "title": "Notify the team"},
			"note":     map[string]any{"type": "string", "title": "Note", "description": "Shown in the deploy log"},
		},
		"required": []any{"env", "replicas"},
	}
	var once sync.Once
	server := mcp.NewServer(&mcp.Implementation{Name: "ops", Version: "v0"}, nil)
	server.AddTool(&mcp.Tool{Name: "deploy", Description: "Deploys a service", InputSchema: map[string]any{"type": "object"}},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if r, ok := req.Params.InputResponses["form"].(*mcp.ElicitResult); ok {
				if r.Action == "accept" {
					once.Do(func() { received <- r.Content })
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: r.Action}}}, nil
			}
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{
				"form": &mcp.ElicitParams{Message: "How should web be deployed?", RequestedSchema: schema}}}, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	DeferCleanup(srv.Close)
	return srv.URL, received
}

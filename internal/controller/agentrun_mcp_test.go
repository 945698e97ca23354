package controller_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
)

// envSchema is the form the MCP deploy tool asks for.
var envSchema = map[string]any{
	"type":       "object",
	"properties": map[string]any{"env": map[string]any{"type": "string", "enum": []any{"staging", "production"}}},
	"required":   []any{"env"},
}

// startOpsMCP serves an MCP server whose deploy tool elicits the environment with a form.
func startOpsMCP() string {
	server := mcp.NewServer(&mcp.Implementation{Name: "ops", Version: "v0"}, nil)
	server.AddTool(&mcp.Tool{Name: "deploy", Description: "Deploys the service", InputSchema: map[string]any{"type": "object"}},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if r, ok := req.Params.InputResponses["env"].(*mcp.ElicitResult); ok {
				text := r.Action
				if r.Action == "accept" {
					text = fmt.Sprintf("deployed to %v", r.Content["env"])
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil
			}
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{
				"env": &mcp.ElicitParams{Message: "Which environment?", RequestedSchema: envSchema}}}, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	DeferCleanup(srv.Close)
	return srv.URL
}

var _ = Describe("AgentRun with MCP servers", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("parks a form elicitation as an input request and replays the answer to the server", func() {
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "ops_deploy", Arguments: "{}"}),
			looptest.OpenAIText("deployed"))
		run := newRun(ns, "mcp-deploy", model.URL, nil)
		run.Spec.MCPServers = []toolnexusv1alpha1.MCPServerSpec{{Name: "ops", URL: startOpsMCP()}}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		Expect(reqs[0].Spec.Request.Kind).To(Equal("input"))
		Expect(reqs[0].Spec.Request.Prompt).To(Equal("Which environment?"))
		Expect(string(reqs[0].Spec.Request.Data.Raw)).To(ContainSubstring(`"required":["env"]`))
		tools := condition(run, toolnexusv1alpha1.ConditionToolsReady)
		Expect(tools.Status).To(Equal(metav1.ConditionTrue))
		// A server of the revision before keeps the elicitation path.
		Expect(tools.Message).To(Equal("Every MCP server answered: ops (MCP 2025-11-25)"))
		answer(&reqs[0], `{"ok":true,"data":{"env":"staging"}}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content", "deployed to staging")))
	})

	It("says which allow-listed tools a server does not offer", func() {
		model := looptest.New(GinkgoT(), looptest.OpenAIText("no tools needed"))
		run := newRun(ns, "mcp-typo", model.URL, nil)
		run.Spec.MCPServers = []toolnexusv1alpha1.MCPServerSpec{{Name: "ops", URL: startOpsMCP(), Tools: []string{"deploy", "delpoy"}}}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		c := condition(run, toolnexusv1alpha1.ConditionToolsReady)
		Expect(c.Status).To(Equal(metav1.ConditionFalse))
		Expect(c.Message).To(ContainSubstring("ops: does not offer the allow-listed tools delpoy; answered: ops (MCP 2025-11-25)"))
		Expect(model.Requests()[0].JSON(GinkgoT())["tools"]).To(HaveLen(1), "the tool it offers is still there")
	})

	It("leaves out the tools of an unreachable server, says why, and runs on", func() {
		model := looptest.New(GinkgoT(), looptest.OpenAIText("no tools needed"))
		run := newRun(ns, "mcp-down", model.URL, nil)
		run.Spec.MCPServers = []toolnexusv1alpha1.MCPServerSpec{{Name: "gone", URL: "http://127.0.0.1:1/mcp", Timeout: &metav1.Duration{Duration: 2e9}}}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		c := condition(run, toolnexusv1alpha1.ConditionToolsReady)
		Expect(c.Status).To(Equal(metav1.ConditionFalse))
		Expect(c.Reason).To(Equal(toolnexusv1alpha1.ReasonMCPServerUnavailable))
		Expect(c.Message).To(ContainSubstring("gone"))
		Expect(model.Requests()[0].JSON(GinkgoT())).NotTo(HaveKey("tools"))
	})
})

// metricValue sums the samples of a metric family whose labels include want.
func metricValue(name string, want map[string]string) float64 {
	families, err := registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	total := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	samples:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue samples
				}
			}
			switch {
			case m.GetCounter() != nil:
				total += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				total += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				total += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return total
}

var _ = Describe("Metrics", func() {
	It("count a suspension as pending, not as a tool error, and the open request by kind", func() {
		ns := newNamespace()
		ts := approvalServer()
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "metered", Arguments: "{}"}),
			looptest.OpenAIText("done"))
		run := newRun(ns, "metered", model.URL, ts, "metered")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		Expect(metricValue("toolnexus_tool_calls_total", map[string]string{"tool": "metered", "pending": "true", "is_error": "false"})).To(Equal(1.0))
		// The gauge counts the manager's cache when scraped, which may lag the API server a moment.
		Eventually(func() float64 {
			return metricValue("toolnexus_pending_requests", map[string]string{"kind": "approval"})
		}, eventually).
			Should(BeNumerically(">=", 1))
		Expect(metricValue("toolnexus_llm_requests_total", map[string]string{"model": "gpt-4o-mini", "status": "200"})).To(BeNumerically(">=", 1))
		answer(&reqs[0], `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(metricValue("toolnexus_tool_calls_total", map[string]string{"tool": "metered", "pending": "false", "is_error": "false"})).To(Equal(1.0))
		Expect(metricValue("toolnexus_suspension_wait_seconds", map[string]string{"kind": "approval", "outcome": "ok"})).To(BeNumerically(">=", 1))
	})
})

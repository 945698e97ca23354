package controller_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/telemetry"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// spansOf returns the spans written so far in trace, by name.
func spansOf(tid trace.TraceID) map[string][]tracetest.SpanStub {
	out := map[string][]tracetest.SpanStub{}
	for _, s := range spans.GetSpans() {
		if s.SpanContext.TraceID() == tid {
			out[s.Name] = append(out[s.Name], s)
		}
	}
	return out
}

func spanValue(s tracetest.SpanStub, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func spanAttr(s tracetest.SpanStub, key attribute.Key) string { return spanValue(s, key).String() }

// traceparentOf is the W3C traceparent a request made inside s carries.
func traceparentOf(s trace.SpanContext) string {
	return "00-" + s.TraceID().String() + "-" + s.SpanID().String() + "-01"
}

// startTracedMCP serves an MCP server with a ping tool and returns the traceparent headers it
// received, by JSON-RPC method.
func startTracedMCP() (string, func() map[string][]string) {
	server := mcp.NewServer(&mcp.Implementation{Name: "echo", Version: "v0"}, nil)
	server.AddTool(&mcp.Tool{Name: "ping", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "pong"}}}, nil
		})
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	var mu sync.Mutex
	seen := map[string][]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string `json:"method"`
		}
		_ = json.Unmarshal(body, &msg)
		mu.Lock()
		seen[msg.Method] = append(seen[msg.Method], r.Header.Get("traceparent"))
		mu.Unlock()
		handler.ServeHTTP(w, r)
	}))
	DeferCleanup(srv.Close)
	return srv.URL, func() map[string][]string {
		mu.Lock()
		defer mu.Unlock()
		out := map[string][]string{}
		for k, v := range seen {
			out[k] = append([]string(nil), v...)
		}
		return out
	}
}

var _ = Describe("AgentRun traces", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("writes one trace for a run that parks across a manager restart: chat, execute_tool, suspension and the run span", func() {
		ts := approvalServer()
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}),
			looptest.OpenAIText("approved and done"))
		run := newRun(ns, "traced", model.URL, ts, "approve")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		preq := waitSuspended(run, 1)[0]
		uid := string(getRun(run).UID)
		tid, runSpan := telemetry.TraceID(uid), telemetry.RunSpanID(uid)
		Expect(tid.String()).To(Equal(strings.ReplaceAll(uid, "-", "")), "the trace id is the run's UID")

		By("before the restart: the first model turn and the call that suspended")
		before := spansOf(tid)
		Expect(before).To(HaveKey("chat gpt-4o-mini"))
		Expect(before["execute_tool approve"]).To(HaveLen(1))
		pending := before["execute_tool approve"][0]
		Expect(spanAttr(pending, "toolnexus.tool.outcome")).To(Equal("pending"))
		Expect(spanAttr(pending, "toolnexus.suspension.kind")).To(Equal("approval"))
		Expect(before).NotTo(HaveKey("toolnexus.suspension approval"), "a suspension's span is written when it ends")
		Expect(before).NotTo(HaveKey("invoke_agent traced"), "the run span is written when the run ends")

		By("after a restart the answer is consumed by another manager, in the same trace")
		restartManager()
		patchRequestStatus(&preq, `{"status":{"answer":{"ok":true},"answeredBy":"alice"}}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		done := getRun(run)
		Eventually(func() map[string][]tracetest.SpanStub { return spansOf(tid) }, eventually).Should(HaveKey("invoke_agent traced"))
		all := spansOf(tid)
		Expect(all["chat gpt-4o-mini"]).To(HaveLen(2))
		Expect(all["execute_tool approve"]).To(HaveLen(2))
		Expect(all["toolnexus.suspension approval"]).To(HaveLen(1))
		Expect(all["invoke_agent traced"]).To(HaveLen(1))

		By("every step and the suspension hang under the run span, which is the trace's root")
		for name, ss := range all {
			for _, s := range ss {
				Expect(spanAttr(s, "k8s.namespace.name")).To(Equal(ns), name)
				Expect(spanAttr(s, "toolnexus.agentrun.name")).To(Equal("traced"), name)
				if name == "invoke_agent traced" {
					Expect(s.SpanContext.SpanID()).To(Equal(runSpan))
					Expect(s.Parent.IsValid()).To(BeFalse(), "a run without a caller is the root of its trace")
					continue
				}
				Expect(s.Parent.SpanID()).To(Equal(runSpan), name)
			}
		}
		retry := all["execute_tool approve"][1]
		Expect(spanAttr(retry, "toolnexus.tool.outcome")).To(Equal("ok"))
		Expect(spanAttr(retry, "gen_ai.tool.call.id")).To(Equal("call_1"))
		chat := all["chat gpt-4o-mini"][1]
		Expect(spanAttr(chat, "gen_ai.request.model")).To(Equal("gpt-4o-mini"))
		Expect(spanValue(chat, "gen_ai.response.finish_reasons").AsStringSlice()).To(Equal([]string{"stop"}))
		Expect(spanAttr(chat, "gen_ai.usage.input_tokens")).To(Equal("10"))

		By("the suspension spans the request's life and says who answered")
		susp := all["toolnexus.suspension approval"][0]
		Expect(susp.StartTime).To(Equal(preq.CreationTimestamp.Time))
		Expect(susp.EndTime).To(BeTemporally(">=", susp.StartTime))
		Expect(spanAttr(susp, "toolnexus.suspension.outcome")).To(Equal("answered"))
		Expect(spanAttr(susp, "toolnexus.suspension.answered_by")).To(Equal("alice"))
		Expect(spanAttr(susp, "toolnexus.pendingrequest.name")).To(Equal(preq.Name))

		By("the run span starts when the run started and ends when it completed")
		rs := all["invoke_agent traced"][0]
		Expect(rs.StartTime).To(Equal(done.Status.StartTime.Time))
		Expect(rs.EndTime).To(Equal(done.Status.CompletionTime.Time))
		Expect(spanAttr(rs, "toolnexus.agentrun.reason")).To(Equal(toolnexusv1alpha1.ReasonCompleted))

		By("the tool server saw the traceparent of the execute_tool span of each call")
		calls := ts.Calls()
		Expect(calls).To(HaveLen(2))
		for i, c := range calls {
			Expect(c.Header.Get("traceparent")).To(Equal(traceparentOf(all["execute_tool approve"][i].SpanContext)))
		}
	})

	It("sends an MCP server the traceparent of the run span while connecting and of the execute_tool span for a call", func() {
		url, seen := startTracedMCP()
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "echo_ping", Arguments: "{}"}),
			looptest.OpenAIText("pong"))
		run := newRun(ns, "mcp-traced", model.URL, nil)
		run.Spec.MCPServers = []toolnexusv1alpha1.MCPServerSpec{{Name: "echo", URL: url}}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		uid := string(getRun(run).UID)
		tid := telemetry.TraceID(uid)
		Eventually(func() map[string][]tracetest.SpanStub { return spansOf(tid) }, eventually).Should(HaveKey("execute_tool echo_ping"))
		var calls []string
		for _, s := range spansOf(tid)["execute_tool echo_ping"] {
			Expect(spanAttr(s, "toolnexus.tool.source")).To(Equal("mcp"))
			calls = append(calls, traceparentOf(s.SpanContext))
		}
		// The MCP client may open a session again within a call: whatever it sends is in the run's trace.
		for method, headers := range seen() {
			Expect(headers).To(HaveEach(HavePrefix("00-"+tid.String()+"-")), method)
		}
		Expect(seen()["tools/call"]).NotTo(BeEmpty())
		Expect(seen()["tools/call"]).To(HaveEach(BeElementOf(calls)), "a call carries its execute_tool span")
		runSpan := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: telemetry.RunSpanID(uid)})
		Expect(seen()["initialize"]).To(ContainElement(traceparentOf(runSpan)), "connecting, the step carries the run span")
	})

	It("ends a suspension's span as expired, or as cancelled when the run is cancelled or the answer says cancelled, once", func() {
		ts := approvalServer()
		expiring := newRun(ns, "expiring", looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}),
			looptest.OpenAIText("nobody answered")).URL, ts, "approve")
		expiring.Spec.Suspension = &toolnexusv1alpha1.SuspensionPolicy{Timeout: &metav1.Duration{Duration: time.Second}, OnTimeout: toolnexusv1alpha1.OnTimeoutDecline}
		cancelled := newRun(ns, "cancelled", looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"})).URL, ts, "approve")
		declined := newRun(ns, "declined-cancelled", looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}),
			looptest.OpenAIText("told")).URL, ts, "approve")
		Expect(k8sClient.Create(ctx, expiring)).To(Succeed())
		Expect(k8sClient.Create(ctx, cancelled)).To(Succeed())
		Expect(k8sClient.Create(ctx, declined)).To(Succeed())
		waitSuspended(cancelled, 1)
		answer(&waitSuspended(declined, 1)[0], `{"ok":false,"reason":"cancelled"}`)
		Expect(k8sClient.Patch(ctx, getRun(cancelled), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"cancel":true}}`)))).To(Succeed())
		for run, want := range map[*toolnexusv1alpha1.AgentRun][]string{
			expiring:  {"expired", toolnexusv1alpha1.ExpiredAnswerer, toolnexusv1alpha1.ReasonCompleted},
			cancelled: {"cancelled", "", toolnexusv1alpha1.ReasonCancelled},
			declined:  {"cancelled", "", toolnexusv1alpha1.ReasonCompleted},
		} {
			tid := telemetry.TraceID(string(getRun(run).UID))
			Eventually(func() map[string][]tracetest.SpanStub { return spansOf(tid) }, eventually).Should(HaveKey("invoke_agent " + run.Name))
			all := spansOf(tid)
			Expect(all["toolnexus.suspension approval"]).To(HaveLen(1), run.Name)
			susp := all["toolnexus.suspension approval"][0]
			Expect(spanAttr(susp, "toolnexus.suspension.outcome")).To(Equal(want[0]), run.Name)
			Expect(spanAttr(susp, "toolnexus.suspension.answered_by")).To(Equal(want[1]), run.Name)
			Expect(spanAttr(all["invoke_agent "+run.Name][0], "toolnexus.agentrun.reason")).To(Equal(want[2]), run.Name)
		}
	})

	It("makes a run with a traceparent annotation a child of the caller's span", func() {
		const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
		model := looptest.New(GinkgoT(), looptest.OpenAIText("hello"))
		run := newRun(ns, "child", model.URL, toolstest.Serve(GinkgoT(), nil))
		run.Annotations = map[string]string{toolnexusv1alpha1.TraceparentAnnotation: "00-" + callerTrace + "-" + callerSpan + "-01"}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		tid, err := trace.TraceIDFromHex(callerTrace)
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() map[string][]tracetest.SpanStub { return spansOf(tid) }, eventually).Should(HaveKey("invoke_agent child"))
		all := spansOf(tid)
		rs := all["invoke_agent child"][0]
		Expect(rs.Parent.SpanID().String()).To(Equal(callerSpan))
		Expect(rs.SpanContext.SpanID()).To(Equal(telemetry.RunSpanID(string(getRun(run).UID))))
		Expect(all["chat gpt-4o-mini"]).To(ConsistOf(HaveField("Parent", HaveField("SpanID()", rs.SpanContext.SpanID()))))
		Expect(spansOf(telemetry.TraceID(string(getRun(run).UID)))).To(BeEmpty(), "no span goes to the UID's own trace")
	})

	It("ignores a malformed traceparent annotation, says so in the log, and traces the run on its own", func() {
		model := looptest.New(GinkgoT(), looptest.OpenAIText("hello"))
		run := newRun(ns, "orphan", model.URL, toolstest.Serve(GinkgoT(), nil))
		run.Annotations = map[string]string{toolnexusv1alpha1.TraceparentAnnotation: "not-a-traceparent"}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		tid := telemetry.TraceID(string(getRun(run).UID))
		Eventually(func() map[string][]tracetest.SpanStub { return spansOf(tid) }, eventually).Should(HaveKey("invoke_agent orphan"))
		Expect(spansOf(tid)["invoke_agent orphan"][0].Parent.IsValid()).To(BeFalse())
		Expect(managerLog.String()).To(ContainSubstring("Ignoring the run's traceparent annotation"))
		Expect(managerLog.String()).To(ContainSubstring("not a W3C traceparent"))
	})
})

package controller_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// gatedModel is a model endpoint that answers request n with replies[n] once the test has
// released it: hold(n) makes request n wait, so a test can act while a model turn is in flight.
type gatedModel struct {
	URL      string
	mu       sync.Mutex
	replies  []looptest.Reply
	gates    map[int]chan struct{}
	arrived  map[int]chan struct{}
	requests atomic.Int32
	// aborted counts held requests whose client went away before they were released.
	aborted atomic.Int32
}

func newGatedModel(replies ...looptest.Reply) *gatedModel {
	m := &gatedModel{replies: replies, gates: map[int]chan struct{}{}, arrived: map[int]chan struct{}{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := int(m.requests.Add(1))
		m.mu.Lock()
		gate, arrived := m.gates[n], m.arrived[n]
		m.mu.Unlock()
		if arrived != nil {
			close(arrived)
		}
		if gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done():
				m.aborted.Add(1)
				return
			}
		}
		if n > len(m.replies) {
			http.Error(w, `{"error":{"message":"gatedModel: no scripted reply"}}`, http.StatusInternalServerError)
			return
		}
		reply := m.replies[n-1]
		for k, v := range reply.Header {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(max(reply.Status, http.StatusOK))
		_, _ = io.WriteString(w, reply.Body)
	}))
	DeferCleanup(srv.Close)
	m.URL = srv.URL + "/v1"
	return m
}

// hold makes request n (1-based) wait for the returned release; arrived is closed when it comes.
func (m *gatedModel) hold(n int) (arrived <-chan struct{}, release func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	gate, in := make(chan struct{}), make(chan struct{})
	m.gates[n], m.arrived[n] = gate, in
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	DeferCleanup(release)
	return in, release
}

// eventNotes are the notes of the run's events with reason.
func eventNotes(run *toolnexusv1alpha1.AgentRun, reason string) []string {
	var list eventsv1.EventList
	Expect(k8sClient.List(ctx, &list, client.InNamespace(run.Namespace))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == run.Name && e.Reason == reason {
			out = append(out, e.Note)
		}
	}
	return out
}

// reconcileCounter reads controller-runtime's own counters of the agentrun controller.
func reconcileCounter(name string) float64 {
	families, err := ctrlmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	total := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "agentrun" {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// toolMessage is the content of the tool result the model was last sent for a call.
func toolMessage(model *looptest.Server, callID string) string {
	for _, m := range lastToolMessages(model) {
		if m["tool_call_id"] == callID {
			content, _ := m["content"].(string)
			return content
		}
	}
	return ""
}

var _ = Describe("AgentRun model endpoint faults", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("retries a model request that outlives spec.model.requestTimeout, and then succeeds", func() {
		model := newGatedModel(looptest.OpenAIText("unused"), looptest.OpenAIText("second time lucky"))
		arrived, _ := model.hold(1) // never released: only the request timeout ends it
		run := newRun(ns, "slow-model", model.URL, nil)
		run.Spec.Model.RequestTimeout = &metav1.Duration{Duration: 300 * time.Millisecond}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(arrived, eventually).Should(BeClosed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("second time lucky"))
		Expect(getRun(run).Status.ModelFailures).To(BeZero())
		Expect(model.requests.Load()).To(Equal(int32(2)))
		Eventually(func() []string { return eventNotes(run, "ModelRetrying") }, eventually).
			Should(ContainElement(ContainSubstring("no answer within 300ms")))
	})

	It("treats a body that is not JSON, a truncated body and empty choices as transient", func() {
		model := looptest.New(GinkgoT(),
			looptest.Reply{Body: "<html><body>502 Bad Gateway</body></html>"},
			looptest.Reply{Body: `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hal`},
			looptest.Reply{Body: `{"id":"chatcmpl-2","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1}}`},
			looptest.OpenAIText("whole at last"))
		run := newRun(ns, "garbled", model.URL, nil)
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		st := getRun(run).Status
		Expect(st.Text).To(Equal("whole at last"))
		Expect(st.Turns).To(Equal(int32(1)), "a garbled answer is not a turn")
		Expect(st.Usage.TotalTokens).To(Equal(int64(looptest.PromptTokens+looptest.CompletionTokens)), "garbage adds no usage")
		Expect(model.Requests()).To(HaveLen(4))
		notes := eventNotes(run, "ModelRetrying")
		Expect(notes).To(ContainElement(ContainSubstring("body is not JSON")))
		Expect(notes).To(ContainElement(ContainSubstring("no choices")))
	})

	It("fails with ModelError naming the attempts after a burst of 5xx beyond spec.model.retries", func() {
		var burst []looptest.Reply
		for _, code := range []int{500, 502, 503, 504, 529} {
			burst = append(burst, looptest.Reply{Status: code, Body: fmt.Sprintf(`{"error":{"message":"upstream %d"}}`, code)})
		}
		model := looptest.New(GinkgoT(), burst...)
		run := newRun(ns, "burst", model.URL, nil)
		run.Spec.Model.Retries = ptr.To[int32](2)
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseFailed))
		c := condition(run, toolnexusv1alpha1.ConditionSucceeded)
		Expect(c.Reason).To(Equal(toolnexusv1alpha1.ReasonModelError))
		Expect(c.Message).To(And(ContainSubstring("failed 3 times in a row"), ContainSubstring("HTTP 503"), ContainSubstring("upstream 503")))
		Expect(eventNotes(run, "ModelRetrying")).To(ConsistOf(
			ContainSubstring("attempt 1 of 3"), ContainSubstring("attempt 2 of 3")))
		Consistently(func() []looptest.Request { return model.Requests() }, "2s").Should(HaveLen(3), "no request after the run failed")
	})
})

var _ = Describe("AgentRun tool faults", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("gives the model error results for a tool server that is down or too slow, and runs on", func() {
		down := httptest.NewServer(http.NotFoundHandler())
		down.Close()
		release := make(chan struct{})
		slow := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) {
			<-release
			return 200, "too late"
		})
		DeferCleanup(func() { close(release) }) // before the server's Close, which waits for the handler
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(
				looptest.ToolCall{ID: "call_down", Name: "lookup", Arguments: `{"q":"x"}`},
				looptest.ToolCall{ID: "call_slow", Name: "slow", Arguments: `{}`}),
			looptest.OpenAIText("both tools failed; here is what I know"))
		run := newRun(ns, "tools-down", model.URL, slow, "slow")
		lookup := newRun(ns, "", model.URL, &toolstest.Server{URL: down.URL}, "lookup").Spec.Tools[0]
		run.Spec.Tools = append(run.Spec.Tools, lookup)
		run.Spec.Tools[0].HTTP.Timeout = &metav1.Duration{Duration: 300 * time.Millisecond}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(toolMessage(model, "call_down")).To(And(HavePrefix("HTTP tool lookup: "), ContainSubstring("connection refused")))
		Expect(toolMessage(model, "call_slow")).To(MatchRegexp(`^HTTP tool slow: no response from http://127\.0\.0\.1:\d+/slow within 300ms$`))
		Expect(getRun(run).Status.ToolCalls).To(ConsistOf(
			HaveField("IsError", true), HaveField("IsError", true)))
		Expect(metricValue("toolnexus_tool_calls_total", map[string]string{"tool": "lookup", "is_error": "true"})).To(BeNumerically(">=", 1))
	})

	It("truncates a 10 MB tool response and tells the model so", func() {
		line := strings.Repeat("abcdefghijklmnopqrstuvwxyz012345", 2) + "\n"
		big := strings.Repeat(line, (10<<20)/len(line))
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, big })
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "dump", Arguments: "{}"}),
			looptest.OpenAIText("skimmed it"))
		run := newRun(ns, "big-output", model.URL, ts, "dump")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		seen := toolMessage(model, "call_1")
		Expect(len(seen)).To(BeNumerically("<=", tools.DefaultMaxOutputBytes+64))
		Expect(seen).To(HavePrefix(big[:4096]))
		Expect(seen).To(MatchRegexp(`\n\[truncated: 1048576 of (more than 1048576|%d) bytes\]$`, len(big)))
		Expect(getRun(run).Status.ToolCalls[0].Output).To(ContainSubstring("[truncated"), "status keeps a bounded excerpt")
	})

	It("gives an error result when an MCP server goes away between listing and the call, and runs on", func() {
		server := mcp.NewServer(&mcp.Implementation{Name: "kb", Version: "v0"}, nil)
		server.AddTool(&mcp.Tool{Name: "lookup", Description: "Looks things up", InputSchema: map[string]any{"type": "object"}},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "found it"}}}, nil
			})
		mcpSrv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
		DeferCleanup(mcpSrv.Close)
		model := newGatedModel(
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "kb_lookup", Arguments: "{}"}),
			looptest.OpenAIText("the knowledge base is gone"))
		arrived, release := model.hold(1)
		run := newRun(ns, "mcp-gone", model.URL, nil)
		run.Spec.MCPServers = []toolnexusv1alpha1.MCPServerSpec{{Name: "kb", URL: mcpSrv.URL, Timeout: &metav1.Duration{Duration: 3 * time.Second}}}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(arrived, eventually).Should(BeClosed()) // the tools were listed: the model request carries them
		mcpSrv.CloseClientConnections()
		mcpSrv.Close()
		release()
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		st := getRun(run).Status
		Expect(st.ToolCalls).To(ConsistOf(And(HaveField("IsError", true), HaveField("Output", HavePrefix("MCP server kb: tool lookup: ")))))
		c := condition(run, toolnexusv1alpha1.ConditionToolsReady)
		Expect(c.Status).To(Equal(metav1.ConditionFalse), "the next turn found the server gone")
		Expect(c.Reason).To(Equal(toolnexusv1alpha1.ReasonMCPServerUnavailable))
		Expect(model.requests.Load()).To(Equal(int32(2)))
	})
})

var _ = Describe("AgentRun API faults", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("keeps the labels and annotations a user writes while the controller writes status", func() {
		ts := toolstest.Serve(GinkgoT(), func(c toolstest.Call) (int, string) {
			if c.Path == "/approve" && c.Answer == nil {
				return 200, toolstest.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "approve?"})
			}
			return 200, "ok " + c.Path
		})
		var replies []looptest.Reply
		for i := 1; i <= 6; i++ {
			replies = append(replies, looptest.OpenAIToolCalls(looptest.ToolCall{ID: fmt.Sprintf("call_%d", i), Name: "step", Arguments: "{}"}))
		}
		replies = append(replies,
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_7", Name: "approve", Arguments: "{}"}),
			looptest.OpenAIText("done despite the edits"))
		model := looptest.New(GinkgoT(), replies...)
		run := newRun(ns, "edited", model.URL, ts, "step", "approve")
		run.Spec.MaxTurns = 10
		Expect(k8sClient.Create(ctx, run)).To(Succeed())

		stop := make(chan struct{})
		var edits atomic.Int32
		editorDone := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(editorDone)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				patch := fmt.Sprintf(`{"metadata":{"labels":{"edit-%d":"yes"},"annotations":{"example.com/note-%d":"edited while running"}}}`, i, i)
				Expect(k8sClient.Patch(ctx, &toolnexusv1alpha1.AgentRun{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "edited"}},
					client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
				for _, p := range requestsOf(run) {
					err := k8sClient.Patch(ctx, &p, client.RawPatch(types.MergePatchType, []byte(patch)))
					Expect(client.IgnoreNotFound(err)).To(Succeed())
				}
				edits.Add(1)
				time.Sleep(5 * time.Millisecond)
			}
		}()
		reqs := waitSuspended(run, 1)
		// Keep editing the parked run and its request for a while, then answer under the edits.
		from := edits.Load()
		Eventually(edits.Load, eventually).Should(BeNumerically(">=", from+20))
		answer(&reqs[0], `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		close(stop)
		<-editorDone

		final := getRun(run)
		Expect(final.Status.Text).To(Equal("done despite the edits"))
		Expect(final.Status.Turns).To(Equal(int32(8)))
		n := int(edits.Load())
		Expect(n).To(BeNumerically(">", 20), "the editor raced the whole run")
		for i := range n {
			Expect(final.Labels).To(HaveKeyWithValue(fmt.Sprintf("edit-%d", i), "yes"))
			Expect(final.Annotations).To(HaveKey(fmt.Sprintf("example.com/note-%d", i)))
		}
		Expect(requestNamed(run, reqs[0].Name).Labels).To(HaveKeyWithValue(toolnexusv1alpha1.RunLabel, "edited"))
		Expect(requestNamed(run, reqs[0].Name).Status.Phase).To(Equal(toolnexusv1alpha1.RequestPhaseAnswered))
		retries := 0
		for _, c := range ts.Calls() {
			if c.Answer != nil {
				retries++
			}
		}
		Expect(retries).To(Equal(1))
		Expect(ts.Calls()).To(HaveLen(8), "six steps, the approval and its retry: nothing re-executed")
	})

	It("neither repeats a step nor drops the label when a backup tool labels the record mid-turn", func() {
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, "ok" })
		model := newGatedModel(
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "step", Arguments: "{}"}),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_2", Name: "step", Arguments: "{}"}),
			looptest.OpenAIText("done"))
		arrived, release := model.hold(2)
		run := newRun(ns, "labelled-transcript", model.URL, ts, "step")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(arrived, eventually).Should(BeClosed())
		cm := &toolnexusv1alpha1.AgentRunRecord{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "labelled-transcript"}}
		Expect(k8sClient.Patch(ctx, cm, client.RawPatch(types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"backup.example.com/include":"true"}}}`)))).To(Succeed())
		release()
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		// A conflict on the record would throw the second model turn away and ask again: the
		// model's second answer (call_2) would never run.
		Expect(getRun(run).Status.Turns).To(Equal(int32(3)))
		Expect(getRun(run).Status.ToolCallCount).To(Equal(int32(2)), "the second turn's tool call ran")
		Expect(model.requests.Load()).To(Equal(int32(3)), "no model turn is repeated")
		Expect(ts.Calls()).To(HaveLen(2), "no tool call is repeated")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
		Expect(cm.Labels).To(HaveKeyWithValue("backup.example.com/include", "true"))
	})

	It("copes with the AgentRun deleted while its model turn is in flight", func() {
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) {
			return 200, toolstest.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "approve?"})
		})
		model := newGatedModel(
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "step", Arguments: "{}"}),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_2", Name: "approve", Arguments: "{}"}))
		arrived, release := model.hold(2)
		ts1 := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, "ok" })
		run := newRun(ns, "doomed", model.URL, ts1, "step")
		run.Spec.Tools = append(run.Spec.Tools, newRun(ns, "", model.URL, ts, "approve").Spec.Tools[0])
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(arrived, eventually).Should(BeClosed())
		uid := getRun(run).UID
		panics, errs := reconcileCounter("controller_runtime_reconcile_panics_total"), reconcileCounter("controller_runtime_reconcile_errors_total")

		Expect(k8sClient.Delete(ctx, run)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(run), &toolnexusv1alpha1.AgentRun{}))
		}, eventually).Should(BeTrue())
		Eventually(model.aborted.Load, eventually).Should(Equal(int32(1)), "the in-flight model request is aborted")
		release()
		Consistently(func() int32 { return model.requests.Load() }, "2s").Should(Equal(int32(2)), "the deleted run takes no further model turn")
		Expect(reconcileCounter("controller_runtime_reconcile_panics_total")).To(Equal(panics))
		// envtest runs no garbage collector: whatever the run owned must name its UID, so that a
		// cluster's collector removes it.
		var cms toolnexusv1alpha1.AgentRunRecordList
		Expect(k8sClient.List(ctx, &cms, client.InNamespace(ns), client.MatchingLabels{toolnexusv1alpha1.RunLabel: "doomed"})).To(Succeed())
		for _, cm := range cms.Items {
			Expect(cm.OwnerReferences).To(ConsistOf(HaveField("UID", uid)))
		}
		for _, p := range requestsOf(run) {
			Expect(p.OwnerReferences).To(ConsistOf(HaveField("UID", uid)))
		}
		// Deleting a run is how a user stops it: the tool call its last model turn asked for must
		// not run, and the end of the in-flight reconcile is not an error.
		Expect(ts.Calls()).To(BeEmpty(), "no tool runs for a deleted run")
		Expect(requestsOf(run)).To(BeEmpty(), "no PendingRequest is created for a deleted run")
		Expect(reconcileCounter("controller_runtime_reconcile_errors_total")).To(Equal(errs), "a run that is gone is not an error")
	})
})

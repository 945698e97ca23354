package controller_test

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/runstore"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// bigOutputs is a tool server whose "dump" answers every call with 1 MiB of base64 of random
// bytes (the HTTP tool-output bound, and what gzip cannot shrink below 3/4), and whose other
// tools answer "ok". It keeps what it sent, by call.
type bigOutputs struct {
	*toolstest.Server
	mu   sync.Mutex
	sent map[string]string // Idempotency-Key → output
}

func serveBigOutputs() *bigOutputs {
	b := &bigOutputs{sent: map[string]string{}}
	b.Server = toolstest.Serve(GinkgoT(), func(c toolstest.Call) (int, string) {
		if !strings.HasSuffix(c.Path, "/dump") {
			return 200, "ok"
		}
		raw := make([]byte, tools.DefaultMaxOutputBytes*3/4)
		_, _ = rand.Read(raw)
		out := base64.StdEncoding.EncodeToString(raw)
		b.mu.Lock()
		b.sent[c.IdempotencyKey] = out
		b.mu.Unlock()
		return 200, out
	})
	return b
}

// output is what the server sent for the run's call id.
func (b *bigOutputs) output(run *toolnexusv1alpha1.AgentRun, id string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sent[string(getRun(run).UID)+"/"+id]
}

// expectWholeOutputs checks that the run's record, read as the plugin reads it, holds every
// output the server sent for calls ids whole, and that the model was sent them whole.
func expectWholeOutputs(run *toolnexusv1alpha1.AgentRun, ts *bigOutputs, model *looptest.Server, ids ...string) {
	GinkgoHelper()
	rec, err := runstore.Read(ctx, k8sClient, getRun(run), runstore.DefaultMaxRawBytes)
	Expect(err).NotTo(HaveOccurred())
	stored := map[string]string{}
	for _, m := range rec.State.Messages {
		if m.Role == state.RoleTool {
			stored[m.ToolCallID] = m.Content
		}
	}
	sent := map[string]any{}
	for _, m := range lastToolMessages(model) {
		sent[m["tool_call_id"].(string)] = m["content"]
	}
	for _, id := range ids {
		out := ts.output(run, id)
		Expect(out).To(HaveLen(tools.DefaultMaxOutputBytes), "call %s", id)
		Expect(stored[id]).To(Equal(out), "the record holds call %s's output whole", id)
		Expect(sent[id]).To(Equal(out), "the model was sent call %s's output whole", id)
	}
}

var _ = Describe("AgentRun with tool outputs as big as a tool may return", func() {
	It("succeeds with two outputs of 1 MiB that do not compress", func() {
		ns := newNamespace()
		ts := serveBigOutputs()
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "dump", Arguments: "{}"}),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_2", Name: "dump", Arguments: "{}"}),
			looptest.OpenAIText("dumped twice"))
		run := newRun(ns, "two-dumps", model.URL, ts.Server, "dump")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("dumped twice"))
		expectWholeOutputs(run, ts, model, "call_1", "call_2")
	})

	It("parks a turn whose finished calls hold 2 MiB, and succeeds once the waiting call is approved", func() {
		ns := newNamespace()
		ts := serveBigOutputs()
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(
				looptest.ToolCall{ID: "call_1", Name: "dump", Arguments: "{}"},
				looptest.ToolCall{ID: "call_2", Name: "dump", Arguments: "{}"},
				looptest.ToolCall{ID: "call_3", Name: "deploy", Arguments: "{}"}),
			looptest.OpenAIText("dumped and deployed"))
		run := newRun(ns, "dumps-then-gate", model.URL, ts.Server, "dump", "deploy")
		run.Spec.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"deploy"}}}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		gate := waitSuspended(run, 1)[0]
		Expect(ts.output(run, "call_1")).NotTo(BeEmpty(), "the dumps ran before the gate parked the turn")
		Expect(ts.output(run, "call_2")).NotTo(BeEmpty())

		By("restarted, the manager reads the parked turn back and goes on from it")
		restartManager()
		answer(&gate, `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("dumped and deployed"))
		Expect(ts.Calls()).To(HaveLen(3), "no call ran twice")
		expectWholeOutputs(run, ts, model, "call_1", "call_2")
	})

	It("fails TranscriptTooLarge naming the run's compressed total when it passes it (4 MiB in this suite)", func() {
		ns := newNamespace()
		ts := serveBigOutputs()
		// Each output adds about 0.77 MiB compressed: the sixth passes 4 MiB, and the save after its
		// step fails.
		var replies []looptest.Reply
		for i := 1; i <= 8; i++ {
			replies = append(replies, looptest.OpenAIToolCalls(looptest.ToolCall{ID: fmt.Sprintf("call_%d", i), Name: "dump", Arguments: "{}"}))
		}
		model := looptest.New(GinkgoT(), replies...)
		run := newRun(ns, "too-many-dumps", model.URL, ts.Server, "dump")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseFailed))
		Expect(reasonOf(run)).To(Equal(toolnexusv1alpha1.ReasonTranscriptTooLarge))
		message := condition(run, toolnexusv1alpha1.ConditionSucceeded).Message
		Expect(message).To(MatchRegexp(`the transcript needs 4\.\d\d MiB compressed, more than the 4 MiB compressed a run may store \(--max-transcript-size\)`))
		Expect(message).NotTo(ContainSubstring("decoded"), "the decoded total was not hit")
		Expect(len(ts.Calls())).To(BeNumerically("<", 8), "the run stopped")
	})
})

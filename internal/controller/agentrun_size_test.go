package controller_test

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	mathrand "math/rand/v2"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

var words = strings.Fields(`alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar
papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu cluster node pod service deploy
secret volume claim ingress gateway route policy quota limit request answer approve decline expire cancel
model token turn tool call result error pending input question schema server client`)

// prose is n bytes of word salad: compressible like real tool output, but not trivially so.
func prose(rng *mathrand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(words[rng.IntN(len(words))])
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

var _ = Describe("AgentRun size limits", func() {
	It("completes a 200-turn run with 2 MB of tool output", func() {
		ns := newNamespace()
		rng := mathrand.New(mathrand.NewPCG(1, 2))
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, prose(rng, 10*1024) })
		var replies []looptest.Reply
		for i := 1; i < 200; i++ {
			replies = append(replies, looptest.OpenAIToolCalls(looptest.ToolCall{ID: fmt.Sprintf("call_%d", i), Name: "read", Arguments: "{}"}))
		}
		replies = append(replies, looptest.OpenAIText("read it all"))
		model := looptest.New(GinkgoT(), replies...)
		run := newRun(ns, "long", model.URL, ts, "read")
		run.Spec.MaxTurns = 200
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), "180s").Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		st := getRun(run).Status
		Expect(st.Turns).To(Equal(int32(200)))
		Expect(st.ToolCallCount).To(Equal(int32(199)))
		Expect(len(st.ToolCalls)).To(BeNumerically("<=", 20), "status keeps bounded summaries")
	})

	It("fails with TranscriptTooLarge, not a crash loop, beyond what it can store (4 MiB in this suite)", func() {
		ns := newNamespace()
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) {
			raw := make([]byte, 768*1024)
			_, _ = rand.Read(raw)
			return 200, base64.StdEncoding.EncodeToString(raw) // 1 MiB that compresses to 0.75 MiB at best
		})
		var replies []looptest.Reply
		// The sixth output passes 4 MiB; the step that ran it asks the model once more.
		for i := 1; i <= 8; i++ {
			replies = append(replies, looptest.OpenAIToolCalls(looptest.ToolCall{ID: fmt.Sprintf("call_%d", i), Name: "dump", Arguments: "{}"}))
		}
		model := looptest.New(GinkgoT(), replies...)
		run := newRun(ns, "huge", model.URL, ts, "dump")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseFailed))
		Expect(reasonOf(run)).To(Equal(toolnexusv1alpha1.ReasonTranscriptTooLarge))
		Expect(condition(run, toolnexusv1alpha1.ConditionSucceeded).Message).To(ContainSubstring("transcript"))
	})
})

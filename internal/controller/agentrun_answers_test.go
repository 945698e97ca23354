package controller_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

var _ = Describe("Answers while a step runs", func() {
	It("takes an answer that came while another call of the turn was running, when that step ends", func() {
		ns := newNamespace()
		// The first approved call takes two seconds, so the second answer lands while it runs; the
		// requests expire only in an hour, so nothing but the step's end can take that answer.
		release := make(chan struct{})
		ts := toolstest.Serve(GinkgoT(), func(c toolstest.Call) (int, string) {
			if c.Args["id"] == "a" {
				<-release
			}
			return 200, "done " + c.Args["id"].(string)
		})
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(
				looptest.ToolCall{ID: "call_a", Name: "deploy", Arguments: `{"id":"a"}`},
				looptest.ToolCall{ID: "call_b", Name: "deploy", Arguments: `{"id":"b"}`}),
			looptest.OpenAIText("both deployed"))
		run := newRun(ns, "two-gates", model.URL, ts, "deploy")
		run.Spec.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"deploy"}}}
		run.Spec.Suspension = &toolnexusv1alpha1.SuspensionPolicy{Timeout: &metav1.Duration{Duration: time.Hour}}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 2)
		byCall := map[string]toolnexusv1alpha1.PendingRequest{}
		for _, r := range reqs {
			byCall[r.Spec.ToolCall.ID] = r
		}
		a, b := byCall["call_a"], byCall["call_b"]
		answer(&a, `{"ok":true}`)
		Eventually(ts.Calls, eventually).Should(HaveLen(1), "the first approved call started")
		answer(&b, `{"ok":true}`)
		time.Sleep(500 * time.Millisecond) // the answer's event meets the step in flight
		close(release)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(ts.Calls()).To(HaveLen(2))
	})
})

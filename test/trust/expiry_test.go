package trust_test

import (
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// A request that expired while the manager was down is expired, not approved: the API server
// refuses the late answer, and the manager, once back, records the expiry (SPEC.md section 3).
var _ = Describe("An answer after the request expired", func() {
	DescribeTable("is refused while the manager is down; once back, the manager expires the request and the tool never runs with ok",
		func(onTimeout toolnexusv1alpha1.OnTimeout, want string) {
			ns := newNamespace()
			// The tool itself suspends: it asks for approval on the first call, and does the work
			// on the retry that carries an ok answer.
			ts := toolstest.Serve(GinkgoT(), func(c toolstest.Call) (int, string) {
				if c.Answer == nil {
					return http.StatusOK, toolstest.Pending(tools.Request{ID: "pay-10", Kind: tools.KindApproval, Prompt: "Pay 10?"})
				}
				return http.StatusOK, "paid"
			})
			model := looptest.New(GinkgoT(),
				looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "dump", Arguments: `{"amount":10}`}),
				looptest.OpenAIText("nobody approved in time"))
			run := plainRun(ns, "pay", model.URL, ts.URL+"/pay")
			run.Spec.Suspension = &toolnexusv1alpha1.SuspensionPolicy{
				Timeout: &metav1.Duration{Duration: 5 * time.Second}, OnTimeout: onTimeout,
				Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice"}},
			}
			Expect(admin.Create(ctx, run)).To(Succeed())
			preq := openRequest(run)
			expiresAt, err := time.Parse(time.RFC3339, preq.Spec.Request.ExpiresAt)
			Expect(err).NotTo(HaveOccurred(), "the request carries the run's timeout")

			By("the manager stops; alice approves after the request expired")
			stopManager()
			<-managerDone
			stopped := true
			DeferCleanup(func() { // the specs after this one need a manager, even when this one fails
				if stopped {
					startManager()
				}
			})
			// answeredAt is stamped in whole seconds: a second and a half later it is past expiresAt.
			time.Sleep(time.Until(expiresAt.Add(1500 * time.Millisecond)))
			Eventually(func() error { // her client may not have discovered the API yet
				return alice.Status().Patch(ctx, preq.DeepCopy(), mergePatch(`{"status":{"answer":{"ok":true,"requestUID":"`+string(preq.UID)+`"}}}`))
			}, eventually).Should(MatchError(ContainSubstring(
				"this request expired at " + preq.Spec.Request.ExpiresAt + "; it can no longer be answered")))
			late := &toolnexusv1alpha1.PendingRequest{}
			Expect(admin.Get(ctx, client.ObjectKeyFromObject(preq), late)).To(Succeed())
			Expect(late.Status.Answer).To(BeNil(), "the API server stored nothing")

			By("the manager starts again and records the expiry")
			startManager()
			stopped = false
			Eventually(func() (toolnexusv1alpha1.RequestPhase, error) {
				err := admin.Get(ctx, client.ObjectKeyFromObject(preq), late)
				return late.Status.Phase, err
			}, eventually).Should(Equal(toolnexusv1alpha1.RequestPhaseExpired))
			Expect(late.Status.Answer).To(Equal(&toolnexusv1alpha1.Answer{OK: false, Reason: tools.ReasonExpired}))
			Expect(late.Status.AnsweredBy).To(Equal(toolnexusv1alpha1.ExpiredAnswerer))

			Eventually(succeeded(run), eventually).Should(Equal(want))
			for _, c := range ts.Calls() {
				Expect(c.Answer == nil || !c.Answer.OK).To(BeTrue(), "the tool was called with an ok answer: %+v", c.Answer)
			}
			Expect(ts.Calls()).NotTo(BeEmpty(), "the tool was called once, to suspend")
			if onTimeout == toolnexusv1alpha1.OnTimeoutDecline {
				Expect(model.Requests()).To(HaveLen(2))
				Expect(string(model.Requests()[1].Body)).To(ContainSubstring(`declined/expired: Pay 10?\nreason: expired`),
					"the model is told the call expired")
			} else {
				Expect(model.Requests()).To(HaveLen(1), "the run fails without asking the model again")
			}
		},
		Entry("onTimeout: Decline, the run goes on", toolnexusv1alpha1.OnTimeoutDecline, "True/"+toolnexusv1alpha1.ReasonCompleted),
		Entry("onTimeout: Fail, the run fails", toolnexusv1alpha1.OnTimeoutFail, "False/"+toolnexusv1alpha1.ReasonRequestExpired),
	)
})

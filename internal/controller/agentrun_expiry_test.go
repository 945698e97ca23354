package controller_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/testenv/operator"
)

// saveAfterExpiryFault fails the first write of a run's record that follows the manager's expiry
// answer: the reconcile that wrote the expiry cannot save what it decided.
type saveAfterExpiryFault struct {
	next          http.RoundTripper
	armed, failed atomic.Bool
}

func (f *saveAfterExpiryFault) RoundTrip(req *http.Request) (*http.Response, error) {
	path := req.URL.Path
	if req.Method == http.MethodPut && strings.Contains(path, "/agentrunrecords/") && f.armed.Load() && !f.failed.Swap(true) {
		return nil, errors.New("injected: the save after the expiry is lost")
	}
	expiry := false
	if req.Method == http.MethodPatch && strings.Contains(path, "/pendingrequests/") && strings.HasSuffix(path, "/status") && req.Body != nil {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		expiry = bytes.Contains(body, []byte(`"answeredBy":"`+toolnexusv1alpha1.ExpiredAnswerer+`"`))
	}
	resp, err := f.next.RoundTrip(req)
	if expiry && err == nil && resp.StatusCode < 300 {
		f.armed.Store(true)
	}
	return resp, err
}

var _ = Describe("onTimeout: Fail", Ordered, func() {
	It("fails the run even when the reconcile that wrote the expiry could not save it", func() {
		ns := newNamespace()
		stopManager()
		faulty, fault := rest.CopyConfig(cfg), &saveAfterExpiryFault{}
		faulty.Wrap(func(rt http.RoundTripper) http.RoundTripper { fault.next = rt; return fault })
		m := operator.New(GinkgoT(), faulty, func() controller.Options {
			return controller.Options{Registry: prometheus.NewRegistry(), MaxConcurrentReconciles: 2}
		})
		m.Start(GinkgoT())
		DeferCleanup(func() {
			Expect(m.Stop()).To(Succeed())
			startManager()
		})

		ts := approvalServer()
		model := looptest.New(GinkgoT(), looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}))
		run := newRun(ns, "expires-unsaved", model.URL, ts, "approve")
		run.Spec.Suspension = &toolnexusv1alpha1.SuspensionPolicy{Timeout: &metav1.Duration{Duration: time.Second}, OnTimeout: toolnexusv1alpha1.OnTimeoutFail}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseFailed))
		Expect(fault.failed.Load()).To(BeTrue(), "the save after the expiry was not the one that failed")
		Expect(reasonOf(run)).To(Equal(toolnexusv1alpha1.ReasonRequestExpired))
		Expect(requestNamed(run, reqs[0].Name).Status.AnsweredBy).To(Equal(toolnexusv1alpha1.ExpiredAnswerer))
		Expect(model.Requests()).To(HaveLen(1), "the model was told the call was declined and the run went on")
		Expect(ts.Calls()).To(HaveLen(1), "the tool ran again")
	})
})

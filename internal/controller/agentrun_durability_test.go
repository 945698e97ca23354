package controller_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// approvalServer suspends every first call with an approval and answers a retry with "approved".
func approvalServer() *toolstest.Server {
	return toolstest.Serve(GinkgoT(), func(c toolstest.Call) (int, string) {
		if c.Answer != nil {
			return 200, "approved"
		}
		return 200, toolstest.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "approve?"})
	})
}

var _ = Describe("AgentRun expiry", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("declines an expired request as system:expired and the run continues (onTimeout Decline)", func() {
		ts := approvalServer()
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}),
			looptest.OpenAIText("nobody answered"))
		run := newRun(ns, "expires", model.URL, ts, "approve")
		run.Spec.Suspension = &toolnexusv1alpha1.SuspensionPolicy{Timeout: &metav1.Duration{Duration: 2 * time.Second}, OnTimeout: toolnexusv1alpha1.OnTimeoutDecline}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		Expect(reqs[0].Spec.Request.ExpiresAt).NotTo(BeEmpty())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content", "declined/expired: approve?\nreason: expired")))
		p := requestNamed(run, reqs[0].Name)
		Expect(p.Status.Answer).To(Equal(&toolnexusv1alpha1.Answer{OK: false, Reason: "expired"}))
		Expect(p.Status.AnsweredBy).To(Equal(toolnexusv1alpha1.ExpiredAnswerer))
		Eventually(func() toolnexusv1alpha1.RequestPhase { return requestNamed(run, reqs[0].Name).Status.Phase }, eventually).
			Should(Equal(toolnexusv1alpha1.RequestPhaseExpired))
		Expect(ts.Calls()).To(HaveLen(1))
	})

	It("fails the run with RequestExpired when onTimeout is Fail", func() {
		ts := approvalServer()
		model := looptest.New(GinkgoT(), looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}))
		run := newRun(ns, "expires-fail", model.URL, ts, "approve")
		run.Spec.Suspension = &toolnexusv1alpha1.SuspensionPolicy{Timeout: &metav1.Duration{Duration: time.Second}, OnTimeout: toolnexusv1alpha1.OnTimeoutFail}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		waitSuspended(run, 1)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseFailed))
		Expect(reasonOf(run)).To(Equal(toolnexusv1alpha1.ReasonRequestExpired))
		Expect(model.Requests()).To(HaveLen(1))
	})

	It("tells the model when a PendingRequest is deleted by hand, instead of waiting forever", func() {
		ts := approvalServer()
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}),
			looptest.OpenAIText("the request went away"))
		run := newRun(ns, "deleted-request", model.URL, ts, "approve")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		Expect(k8sClient.Delete(ctx, &reqs[0])).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(lastToolMessages(model)).To(ConsistOf(HaveKeyWithValue("content",
			"declined/expired: approve?\nreason: the PendingRequest was deleted")))
	})
})

var _ = Describe("AgentRun durability", Ordered, func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("loses no parked run and no answer across a manager restart, and applies each answer once", func() {
		ts := approvalServer()
		var runs []*toolnexusv1alpha1.AgentRun
		for _, name := range []string{"parked-a", "parked-b", "parked-c"} {
			model := looptest.New(GinkgoT(),
				looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}),
				looptest.OpenAIText(name+" done"))
			run := newRun(ns, name, model.URL, ts, "approve")
			Expect(k8sClient.Create(ctx, run)).To(Succeed())
			runs = append(runs, run)
		}
		for _, run := range runs {
			waitSuspended(run, 1)
		}
		// One answer arrives while the manager is down; the others after it is back.
		stopManager()
		<-managerDone
		answer(&requestsOf(runs[0])[0], `{"ok":true}`)
		startManager()
		answer(&requestsOf(runs[1])[0], `{"ok":true}`)
		answer(&requestsOf(runs[2])[0], `{"ok":true}`)
		for _, run := range runs {
			Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
			Expect(getRun(run).Status.Text).To(Equal(run.Name + " done"))
			Expect(requestsOf(run)).To(HaveLen(1))
		}
		retries := 0
		for _, c := range ts.Calls() {
			if c.Answer != nil {
				retries++
			}
		}
		Expect(retries).To(Equal(3), "each answer is applied exactly once")
	})

	It("repeats a model turn that was in flight when the manager stopped", func() {
		var served atomic.Int32
		inFlight := make(chan struct{})
		model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if served.Add(1) == 1 {
				close(inFlight)
				<-r.Context().Done() // hang until the stopping manager gives up on the request
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, looptest.OpenAIText("made it").Body)
		}))
		DeferCleanup(model.Close)
		run := newRun(ns, "in-flight", model.URL+"/v1", nil)
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(inFlight, eventually).Should(BeClosed())
		// The record is written before the first step: the run has started while its first
		// model request is in flight, and a restart does not take it for a run whose record was lost.
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseRunning))
		Expect(getRun(run).Status.TranscriptRef).NotTo(BeNil())
		Expect(getRun(run).Status.StartTime).NotTo(BeNil())
		restartManager()
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("made it"))
		Expect(served.Load()).To(Equal(int32(2)))
	})

	It("reads the record of a run whose status lost its start before reporting on it, even while its Secret is missing", func() {
		ts := approvalServer()
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}),
			looptest.OpenAIText("kept"))
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llm"}, StringData: map[string]string{"apiKey": "k"}}
		Expect(k8sClient.Create(ctx, secret.DeepCopy())).To(Succeed())
		run := newRun(ns, "status-lost", model.URL, ts, "approve")
		run.Spec.Model.APIKeySecretRef = &toolnexusv1alpha1.SecretKeyReference{Name: "llm", Key: "apiKey"}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		req := waitSuspended(run, 1)[0]
		stopManager()
		<-managerDone
		// The run's status no longer says it started (a status patch that never landed, a restore
		// without status), and its Secret is gone: the new process takes the run for new, and must
		// not report a new run's state over the parked one's (its request cancelled, the run waiting
		// for a Secret to start over).
		lost := getRun(run)
		lost.Status = toolnexusv1alpha1.AgentRunStatus{}
		Expect(k8sClient.Status().Update(ctx, lost)).To(Succeed())
		Expect(k8sClient.Delete(ctx, secret)).To(Succeed())
		startManager()
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSuspended))
		Expect(requestNamed(run, req.Name).Status.Phase).To(Equal(toolnexusv1alpha1.RequestPhaseWaiting))

		answer(&req, `{"ok":true}`)
		Eventually(func() string { return reasonOf(run) }, eventually).Should(Equal(toolnexusv1alpha1.ReasonSecretNotFound))
		Expect(k8sClient.Create(ctx, secret.DeepCopy())).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("kept"))
		Expect(model.Requests()).To(HaveLen(2))
		Expect(ts.Calls()).To(HaveLen(2), "the call and its retry after the answer")
	})
})

var _ = Describe("kubectl wait", func() {
	It("waits for Suspended and then Succeeded", func() {
		ns := newNamespace()
		kubeconfig := adminKubeconfig()
		kubectl := func(args ...string) (string, error) {
			cmd := exec.Command(filepath.Join(env.BinaryAssetsDirectory, "kubectl"), append([]string{"--kubeconfig", kubeconfig, "-n", ns}, args...)...)
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		ts := approvalServer()
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}),
			looptest.OpenAIText("approved and done"))
		run := newRun(ns, "waited", model.URL, ts, "approve")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		out, err := kubectl("wait", "--for=condition=Suspended", "agentrun/waited", "--timeout=30s")
		Expect(err).NotTo(HaveOccurred(), out)
		out, err = kubectl("get", "ar")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(MatchRegexp(`NAME\s+PHASE\s+TURNS\s+PENDING\s+AGE\nwaited\s+Suspended\s+1\s+1\s+`))
		out, err = kubectl("get", "preq")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(MatchRegexp(`NAME\s+RUN\s+KIND\s+PHASE\s+PROMPT\s+AGE\nwaited-1-call-1\s+waited\s+approval\s+Waiting\s+approve\?`))
		out, err = kubectl("patch", "preq", "waited-1-call-1", "--subresource=status", "--type=merge", "-p", `{"status":{"answer":{"ok":true}}}`)
		Expect(err).NotTo(HaveOccurred(), out)
		out, err = kubectl("wait", "--for=condition=Succeeded", "agentrun/waited", "--timeout=30s")
		Expect(err).NotTo(HaveOccurred(), out)
		out, err = kubectl("wait", "--for=jsonpath={.status.phase}=Succeeded", "ar/waited", "--timeout=5s")
		Expect(err).NotTo(HaveOccurred(), out)
	})
})

// adminKubeconfig writes a kubeconfig for a cluster admin of the suite's API server.
func adminKubeconfig() string {
	path, err := testenv.WriteKubeconfig(env, testenv.Admin, GinkgoT().TempDir())
	Expect(err).NotTo(HaveOccurred())
	return path
}

var _ = Describe("A damaged transcript", func() {
	It("ends the run with TranscriptCorrupt instead of failing every reconcile", func() {
		ns := newNamespace()
		ts := approvalServer()
		model := looptest.New(GinkgoT(), looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}))
		run := newRun(ns, "damaged", model.URL, ts, "approve")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		// Only the manager can write records; the suite's client stands in for a bug or a disk fault.
		rec := &toolnexusv1alpha1.AgentRunRecord{}
		Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "damaged"}, rec)).To(Succeed())
		rec.Data = []byte("not gzip at all")
		Expect(k8sClient.Update(ctx, rec)).To(Succeed())
		answer(&reqs[0], `{"ok":true}`)
		Eventually(func() string { return reasonOf(run) }, eventually).Should(Equal(toolnexusv1alpha1.ReasonTranscriptCorrupt))
		Expect(getRun(run).Status.Phase).To(Equal(toolnexusv1alpha1.RunPhaseFailed))
		Expect(condition(run, toolnexusv1alpha1.ConditionSucceeded).Message).To(ContainSubstring("decoding the record AgentRunRecord damaged"))
		Expect(ts.Calls()).To(HaveLen(1), "nothing runs from a damaged record")
	})
})

var _ = Describe("A record written by another writer while a step is in flight", func() {
	It("does not save the step over it: the save conflicts and the step is taken again from a fresh read", func() {
		ns := newNamespace()
		release := make(chan struct{})
		var calls atomic.Int32
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) {
			if calls.Add(1) == 1 {
				<-release // the first call is in flight while the record changes
			}
			return 200, "done"
		})
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "work", Arguments: "{}"}),
			looptest.OpenAIText("first"), looptest.OpenAIText("again"))
		run := newRun(ns, "rewritten", model.URL, ts, "work")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(calls.Load, eventually).Should(Equal(int32(1)))

		// Only the manager can write records; the suite's client stands in for another writer.
		// The same state in other bytes: the gzip header names a file.
		rec := &toolnexusv1alpha1.AgentRunRecord{}
		Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "rewritten"}, rec)).To(Succeed())
		zr, err := gzip.NewReader(bytes.NewReader(rec.Data))
		Expect(err).NotTo(HaveOccurred())
		raw, err := io.ReadAll(zr)
		Expect(err).NotTo(HaveOccurred())
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.Name = "rewritten"
		_, err = zw.Write(raw)
		Expect(err).NotTo(HaveOccurred())
		Expect(zw.Close()).To(Succeed())
		Expect(buf.Bytes()).NotTo(Equal(rec.Data))
		rec.Data = buf.Bytes()
		Expect(k8sClient.Update(ctx, rec)).To(Succeed())
		close(release)

		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("again"), "the outcome of the step that started from the old record was not saved")
		got := ts.Calls()
		Expect(got).To(HaveLen(2))
		Expect(got[1].IdempotencyKey).To(Equal(got[0].IdempotencyKey), "the step ran again as the same call")
		Expect(model.Requests()).To(HaveLen(3))
	})
})

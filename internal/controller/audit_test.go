package controller_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/internal/testenv/fakehttp"
	"github.com/toolnexus/operator/internal/testenv/operator"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// auditedArguments are the arguments the model sends, keys unsorted and spaced: the digest is over
// their canonical form, auditedCanonical.
const (
	auditedArguments = `{ "qty": 2, "item": "h100-rack" }`
	auditedCanonical = `{"item":"h100-rack","qty":2}`
)

// auditSink is a loopback receiver of audit events. Those of its namespace it refuses (503)
// until it is told to accept, and it keeps every attempt at them and what it answered; every
// other namespace's it takes and forgets (the auditing manager audits the whole suite's requests).
type auditSink struct {
	URL       string
	ns        string
	accepting atomic.Bool

	mu        sync.Mutex
	attempts  []auditAttempt
	malformed []string
}

type auditAttempt struct {
	event    cloudevent.Event
	data     map[string]any
	body     string
	accepted bool
}

func newAuditSink(ns string, accepting bool) *auditSink {
	s := &auditSink{ns: ns}
	s.accepting.Store(accepting)
	srv := fakehttp.Serve(GinkgoT(), func(r fakehttp.Request) fakehttp.Reply {
		var e cloudevent.Event
		var d map[string]any
		if r.Method != http.MethodPost || r.Path != "/audit" || r.Header.Get("Content-Type") != "application/cloudevents+json" ||
			json.Unmarshal(r.Body, &e) != nil || e.Validate() != nil || e.DataAs(&d) != nil {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.malformed = append(s.malformed, r.Method+" "+r.Path+" "+string(r.Body))
			return fakehttp.Reply{Status: http.StatusBadRequest}
		}
		if d["namespace"] != s.ns {
			return fakehttp.Reply{Status: http.StatusAccepted}
		}
		accepted := s.accepting.Load()
		s.mu.Lock()
		s.attempts = append(s.attempts, auditAttempt{event: e, data: d, body: string(r.Body), accepted: accepted})
		s.mu.Unlock()
		if !accepted {
			return fakehttp.Reply{Status: http.StatusServiceUnavailable}
		}
		return fakehttp.Reply{Status: http.StatusAccepted}
	}, nil)
	s.URL = srv.URL + "/audit"
	return s
}

// received is every attempt at an event of the sink's namespace so far.
func (s *auditSink) received() []auditAttempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]auditAttempt(nil), s.attempts...)
}

// accepted is the events the sink took, in order.
func (s *auditSink) accepted() []auditAttempt {
	var out []auditAttempt
	for _, a := range s.received() {
		if a.accepted {
			out = append(out, a)
		}
	}
	return out
}

// acceptedIDs is the ids of the events the sink took, in order.
func (s *auditSink) acceptedIDs() []string {
	var out []string
	for _, a := range s.accepted() {
		out = append(out, a.event.ID())
	}
	return out
}

func (s *auditSink) attemptsAt(id string) int {
	n := 0
	for _, a := range s.received() {
		if a.event.ID() == id {
			n++
		}
	}
	return n
}

func (s *auditSink) noneMalformed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	Expect(s.malformed).To(BeEmpty(), "every audit event is a structured-mode CloudEvent POSTed to the sink's path")
}

// startAuditing replaces the suite's manager with one that delivers the audit trail to sinkURL,
// until the spec ends.
func startAuditing(sinkURL string) *operator.Manager {
	stopManager()
	m := operator.New(GinkgoT(), cfg, func() controller.Options {
		registry = prometheus.NewRegistry()
		return controller.Options{Registry: registry, MaxConcurrentReconciles: 4, MaxTranscriptBytes: 4 << 20,
			NotifyPolicy: notifyPolicy, AuditSinkURL: sinkURL}
	})
	m.Start(GinkgoT())
	DeferCleanup(func() {
		Expect(m.Stop()).To(Succeed())
		startManager()
	})
	return m
}

// auditAnswerer is alice, a certificate user who may answer the requests of ns, whose answers the
// API server stamps with her name there (config/policies' toolnexus-answer-stamp, bound to ns alone:
// the suite's other specs stamp answers themselves).
func auditAnswerer(ns string) client.Client {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test-audit-answerer"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{toolnexusv1alpha1.GroupVersion.Group}, Resources: []string{"pendingrequests"}, Verbs: []string{"get"}},
		{APIGroups: []string{toolnexusv1alpha1.GroupVersion.Group}, Resources: []string{"pendingrequests/status"}, Verbs: []string{"get", "patch"}},
	}}
	if err := k8sClient.Create(ctx, role); !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "alice-answers"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: testenv.Users("alice")})).To(Succeed())
	alice := testEnv.User(GinkgoT(), "alice")
	may := testenv.Access("patch", "pendingrequests/status")
	may.Namespace = ns
	testEnv.WaitAllowed(GinkgoT(), alice.User, may)

	objs, err := testenv.Kustomize(filepath.Join(testenv.RepoRoot(), "config", "policies"))
	Expect(err).NotTo(HaveOccurred())
	var stamp client.Object
	for _, o := range objs {
		if o.GetKind() == "MutatingAdmissionPolicy" && o.GetName() == "toolnexus-answer-stamp" {
			stamp = o
		}
	}
	Expect(stamp).NotTo(BeNil(), "config/policies holds the answer stamp")
	if err := k8sClient.Create(ctx, stamp); !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	binding := &admissionregistrationv1.MutatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "test-audit-stamp-" + ns},
		Spec: admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: stamp.GetName(),
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}}}
	Expect(k8sClient.Create(ctx, binding)).To(Succeed())
	DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, binding))).To(Succeed()) })
	return alice.Client
}

// approveAs approves preq as who, once the API server stamps who's name on answers in its
// namespace (a policy is enforced a moment after it is bound: a dry run shows when).
func approveAs(who client.Client, name string, preq *toolnexusv1alpha1.PendingRequest) {
	patch := client.RawPatch(types.MergePatchType, []byte(`{"status":{"answer":{"ok":true,"requestUID":"`+string(preq.UID)+`"}}}`))
	Eventually(func() (string, error) {
		probe := preq.DeepCopy()
		err := who.Status().Patch(ctx, probe, patch, client.DryRunAll)
		return probe.Status.AnsweredBy, err
	}, eventually).Should(Equal(name))
	Expect(who.Status().Patch(ctx, preq.DeepCopy(), patch)).To(Succeed())
}

// auditedRun is a run whose one call, buy with auditedArguments, is gated by an approval; approved,
// the tool runs once and the run ends.
func auditedRun(ns, name string) (*toolnexusv1alpha1.AgentRun, *toolstest.Server) {
	ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, "ordered" })
	model := looptest.New(GinkgoT(),
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "buy", Arguments: auditedArguments}),
		looptest.OpenAIText("bought"))
	run := newRun(ns, name, model.URL, ts, "buy")
	run.Spec.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"buy"}}}
	// This suite installs no requester stamp (test/admission shows it): the run names its requester.
	run.Spec.RequestedBy = "erin"
	return run, ts
}

// liveRequest reads p as the API server has it; nil once it is gone.
func liveRequest(p *toolnexusv1alpha1.PendingRequest) *toolnexusv1alpha1.PendingRequest {
	got := &toolnexusv1alpha1.PendingRequest{}
	err := k8sClient.Get(ctx, client.ObjectKeyFromObject(p), got)
	if apierrors.IsNotFound(err) {
		return nil
	}
	Expect(err).NotTo(HaveOccurred())
	return got
}

func finalizersOf(p *toolnexusv1alpha1.PendingRequest) func() []string {
	return func() []string {
		if live := liveRequest(p); live != nil {
			return live.Finalizers
		}
		return nil
	}
}

func auditedOf(p *toolnexusv1alpha1.PendingRequest) func() []string {
	return func() []string {
		if live := liveRequest(p); live != nil {
			return live.Status.Audited
		}
		return nil
	}
}

// expectAuditedCall checks what every event of preq's trail says of it: the request, the call
// (the tool and the digest of its canonical arguments, never the arguments) and who asked.
func expectAuditedCall(events []auditAttempt, preq *toolnexusv1alpha1.PendingRequest) {
	sum := sha256.Sum256([]byte(auditedCanonical))
	for _, a := range events {
		Expect(a.event.Source()).To(Equal("/namespaces/" + preq.Namespace + "/agentruns/" + preq.Spec.RunRef.Name))
		Expect(a.event.Subject()).To(Equal(preq.Name))
		Expect(a.data).To(And(
			HaveKeyWithValue("namespace", preq.Namespace), HaveKeyWithValue("run", preq.Spec.RunRef.Name),
			HaveKeyWithValue("request", map[string]any{"name": preq.Name, "uid": string(preq.UID), "kind": "approval"}),
			HaveKeyWithValue("tool", "buy"), HaveKeyWithValue("argumentsDigest", "sha256:"+hex.EncodeToString(sum[:])),
			HaveKeyWithValue("requestedBy", "erin")))
		Expect(a.body).NotTo(ContainSubstring("h100"), "an audit event carries the arguments' digest, never the arguments")
	}
}

var _ = Describe("The audit trail", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("keeps a deleted run's request until the sink took its requested, answered and executed events, across a restart", func() {
		sink := newAuditSink(ns, false)
		alice := auditAnswerer(ns)
		m := startAuditing(sink.URL)
		run, ts := auditedRun(ns, "audited")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		gate := waitSuspended(run, 1)[0]
		requested := string(gate.UID) + "/requested"

		By("the request is held by the audit finalizer; the refusing sink is asked again, with one id")
		Eventually(finalizersOf(&gate), eventually).Should(ContainElement(toolnexusv1alpha1.AuditFinalizer))
		Eventually(func() int { return sink.attemptsAt(requested) }, eventually).Should(BeNumerically(">=", 2))
		Expect(metricValue("toolnexus_audit_events_total", map[string]string{"type": "requested", "outcome": "retried"})).To(BeNumerically(">=", 2))

		By("alice approves; the call runs once and the run takes the answer in")
		approveAs(alice, "alice", &gate)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Eventually(func() string {
			c := meta.FindStatusCondition(liveRequest(&gate).Status.Conditions, toolnexusv1alpha1.ConditionResolved)
			if c == nil || c.Status != metav1.ConditionTrue {
				return ""
			}
			return c.Reason
		}, eventually).Should(Equal(toolnexusv1alpha1.ReasonAnswerConsumed))
		Expect(ts.Calls()).To(HaveLen(1))
		Expect(liveRequest(&gate).Status.AnsweredBy).To(Equal("alice"))

		By("the run is deleted; its request stays, Terminating, while the sink refuses")
		Expect(k8sClient.Delete(ctx, run)).To(Succeed())
		// envtest runs no garbage collector: delete the run's request as the collector would.
		Expect(k8sClient.Delete(ctx, &gate)).To(Succeed())
		Expect(liveRequest(&gate).DeletionTimestamp).NotTo(BeNil())
		Consistently(func() *toolnexusv1alpha1.PendingRequest { return liveRequest(&gate) }, "2s").ShouldNot(BeNil())

		By("a manager restart meanwhile loses nothing")
		m.Restart(GinkgoT())
		Consistently(func() *toolnexusv1alpha1.PendingRequest { return liveRequest(&gate) }, "1s").ShouldNot(BeNil())
		Expect(sink.accepted()).To(BeEmpty())
		Expect(liveRequest(&gate).Status.Audited).To(BeEmpty())

		By("the sink accepts: it gets the trail in order, and only then is the request gone")
		sink.accepting.Store(true)
		Eventually(func() *toolnexusv1alpha1.PendingRequest { return liveRequest(&gate) }, eventually).Should(BeNil())
		uid := string(gate.UID)
		Expect(sink.acceptedIDs()).To(Equal([]string{uid + "/requested", uid + "/answered", uid + "/executed"}))
		events := sink.accepted()
		Expect(events[0].event.Type()).To(Equal("dev.toolnexus.audit.requested"))
		Expect(events[1].event.Type()).To(Equal("dev.toolnexus.audit.answered"))
		Expect(events[1].data).To(And(HaveKeyWithValue("answeredBy", "alice"), HaveKeyWithValue("ok", true), HaveKey("answeredAt")))
		Expect(events[2].event.Type()).To(Equal("dev.toolnexus.audit.executed"))
		expectAuditedCall(events, &gate)
		for _, a := range sink.received() {
			Expect(a.event.ID()).To(BeElementOf(uid+"/requested", uid+"/answered", uid+"/executed"), "every attempt carries its event's id")
		}
		sink.noneMalformed()
	})

	It("does not send again what it delivered before a restart, and lets a resolved request go once its trail is delivered", func() {
		sink := newAuditSink(ns, true)
		alice := auditAnswerer(ns)
		m := startAuditing(sink.URL)
		run, _ := auditedRun(ns, "restarted")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		gate := waitSuspended(run, 1)[0]
		uid := string(gate.UID)

		Eventually(auditedOf(&gate), eventually).Should(Equal([]string{"requested"}))
		Expect(liveRequest(&gate).Finalizers).To(ContainElement(toolnexusv1alpha1.AuditFinalizer), "held while the request is open")
		m.Restart(GinkgoT())
		approveAs(alice, "alice", &gate)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))

		Eventually(auditedOf(&gate), eventually).Should(Equal([]string{"requested", "answered", "executed"}))
		Eventually(finalizersOf(&gate), eventually).ShouldNot(ContainElement(toolnexusv1alpha1.AuditFinalizer))
		Expect(liveRequest(&gate)).NotTo(BeNil(), "the request itself stays: only the audit's hold on it ends")
		Expect(sink.acceptedIDs()).To(Equal([]string{uid + "/requested", uid + "/answered", uid + "/executed"}),
			"the restarted manager does not send requested again")
		expectAuditedCall(sink.accepted(), &gate)
		Consistently(finalizersOf(&gate), "1s").ShouldNot(ContainElement(toolnexusv1alpha1.AuditFinalizer))
		sink.noneMalformed()
	})

	It("holds a run re-created under the same name until the old run's request has delivered its trail", func() {
		sink := newAuditSink(ns, false)
		startAuditing(sink.URL)
		run, _ := auditedRun(ns, "again")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		old := waitSuspended(run, 1)[0]
		Expect(k8sClient.Delete(ctx, run)).To(Succeed())
		// envtest runs no garbage collector: delete the run's request as the collector would.
		Expect(k8sClient.Delete(ctx, &old)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(run), &toolnexusv1alpha1.AgentRun{}))
		}, eventually).Should(BeTrue())

		By("the new run of the same name waits for the name, saying why, and opens nothing")
		again, ts := auditedRun(ns, "again")
		Expect(k8sClient.Create(ctx, again)).To(Succeed())
		Eventually(func() string { return reasonOf(again) }, eventually).Should(Equal(toolnexusv1alpha1.ReasonRequestNameInUse))
		Expect(liveRequest(&old).UID).To(Equal(old.UID), "the old request is still the one held for its audit")
		Expect(ts.Calls()).To(BeEmpty())

		By("once the trail is delivered the old request goes, and the new run opens its own")
		sink.accepting.Store(true)
		fresh := waitSuspended(again, 1)[0]
		Expect(fresh.UID).NotTo(Equal(old.UID))
		Expect(metav1.IsControlledBy(&fresh, getRun(again))).To(BeTrue())
		Expect(sink.acceptedIDs()).To(ContainElements(string(old.UID)+"/requested", string(old.UID)+"/cancelled"))
	})

	It("gives a gate that passed its call on to a later gate no executed: the call never ran", func() {
		sink := newAuditSink(ns, true)
		alice := auditAnswerer(ns)
		startAuditing(sink.URL)
		policy := &toolnexusv1alpha1.ApprovalPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "audit-" + ns},
			Spec: toolnexusv1alpha1.ApprovalPolicySpec{
				NamespaceSelector: &toolnexusv1alpha1.LabelSelector{MatchLabels: map[string]toolnexusv1alpha1.LabelValue{"kubernetes.io/metadata.name": toolnexusv1alpha1.LabelValue(ns)}},
				Tools:             []string{"buy"}, Approvers: toolnexusv1alpha1.Approvers{Users: []string{"alice"}},
			},
		}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, policy))).To(Succeed()) })
		run, ts := auditedRun(ns, "two-gates")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())

		By("the policy's gate comes first; approved, the call goes on to the run's own gate")
		first := waitSuspended(run, 1)[0]
		Expect(first.Spec.Policy).NotTo(BeNil())
		approveAs(alice, "alice", &first)
		var second toolnexusv1alpha1.PendingRequest
		Eventually(func() bool {
			for _, p := range requestsOf(run) {
				if p.Name != first.Name {
					second = p
					return true
				}
			}
			return false
		}, eventually).Should(BeTrue())
		Expect(second.Spec.Policy).To(BeNil(), "the run's own gate")
		Eventually(func() string {
			c := meta.FindStatusCondition(liveRequest(&first).Status.Conditions, toolnexusv1alpha1.ConditionResolved)
			if c == nil {
				return ""
			}
			return string(c.Status) + "/" + c.Reason
		}, eventually).Should(Equal("True/" + toolnexusv1alpha1.ReasonGatePassed))

		By("the run's gate declines: the tool never runs, and no request of the call says executed")
		answer(&second, `{"ok":false,"reason":"not today"}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(ts.Calls()).To(BeEmpty())
		Eventually(auditedOf(&second), eventually).Should(ContainElement("answered"))
		Eventually(auditedOf(&first), eventually).Should(ContainElement("answered"))
		Consistently(func() []string {
			return append(liveRequest(&first).Status.Audited, liveRequest(&second).Status.Audited...)
		}, "2s").
			ShouldNot(ContainElement("executed"))
		for _, id := range sink.acceptedIDs() {
			Expect(id).NotTo(HaveSuffix("/executed"))
		}
	})

	It("says a request deleted unanswered was cancelled", func() {
		sink := newAuditSink(ns, true)
		startAuditing(sink.URL)
		run, ts := auditedRun(ns, "dropped")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		gate := waitSuspended(run, 1)[0]
		Eventually(auditedOf(&gate), eventually).Should(Equal([]string{"requested"}))

		Expect(k8sClient.Delete(ctx, run)).To(Succeed())
		// envtest runs no garbage collector: delete the run's request as the collector would.
		Expect(k8sClient.Delete(ctx, &gate)).To(Succeed())
		Eventually(func() *toolnexusv1alpha1.PendingRequest { return liveRequest(&gate) }, eventually).Should(BeNil())
		uid := string(gate.UID)
		Expect(sink.acceptedIDs()).To(Equal([]string{uid + "/requested", uid + "/cancelled"}))
		cancelled := sink.accepted()[1]
		Expect(cancelled.event.Type()).To(Equal("dev.toolnexus.audit.cancelled"))
		Expect(cancelled.data).To(HaveKeyWithValue("why", "Deleted"))
		Expect(cancelled.data).NotTo(HaveKey("answeredBy"))
		expectAuditedCall(sink.accepted(), &gate)
		Expect(ts.Calls()).To(BeEmpty())
	})

	It("without --audit-sink-url, lets a request being deleted go, saying its events were not delivered", func() {
		preq := &toolnexusv1alpha1.PendingRequest{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "held", Finalizers: []string{toolnexusv1alpha1.AuditFinalizer}},
			Spec: toolnexusv1alpha1.PendingRequestSpec{
				RunRef:   toolnexusv1alpha1.RunReference{Name: "gone"},
				ToolCall: toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "buy", Arguments: auditedArguments},
				Request:  toolnexusv1alpha1.Request{ID: "approval:call_1", Kind: "approval"},
			},
		}
		Expect(k8sClient.Create(ctx, preq)).To(Succeed())
		Consistently(finalizersOf(preq), "1s").Should(ContainElement(toolnexusv1alpha1.AuditFinalizer), "a request not being deleted is left alone")
		Expect(k8sClient.Delete(ctx, preq)).To(Succeed())
		Eventually(func() *toolnexusv1alpha1.PendingRequest { return liveRequest(preq) }, eventually).Should(BeNil())
		Eventually(func() []string { return logLinesWith("audit events not delivered") }, eventually).Should(
			ContainElement(And(ContainSubstring(ns), ContainSubstring(`"held"`), ContainSubstring("requested"), ContainSubstring("cancelled"))))
		Expect(strings.Join(logLinesWith("audit events not delivered"), "\n")).NotTo(ContainSubstring("h100"), "the log names the events, not the arguments")
	})
})

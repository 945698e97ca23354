package controller_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// notifiedRun is a run whose one tool call is gated by an approval, so it parks on one request
// and, approved, calls the tool and ends.
func notifiedRun(ns, name string, sinks ...toolnexusv1alpha1.NotifySink) *toolnexusv1alpha1.AgentRun {
	ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, "ordered" })
	model := looptest.New(GinkgoT(),
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "buy", Arguments: `{"item":"gpu"}`}),
		looptest.OpenAIText("bought"))
	run := newRun(ns, name, model.URL, ts, "buy")
	run.Spec.Approvals = []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"buy"}}}
	run.Spec.Suspension = &toolnexusv1alpha1.SuspensionPolicy{
		Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice"}, Groups: []string{"buyers"}},
		Notify:    sinks,
	}
	return run
}

// receiver is a notification sink on loopback that answers with respond (the attempt number,
// 1-based, is n).
func receiver(respond func(n int64) looptest.Reply) *looptest.Server {
	var n atomic.Int64
	return looptest.Serve(GinkgoT(), func(looptest.Request) looptest.Reply { return respond(n.Add(1)) })
}

// patchRequestStatus writes a request's status as an answerer (or a test standing in for the
// API server's stamps) does.
func patchRequestStatus(p *toolnexusv1alpha1.PendingRequest, patch string) {
	Expect(k8sClient.Status().Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
}

func accept(int64) looptest.Reply { return looptest.Reply{Status: http.StatusAccepted} }

func notifiedOf(p *toolnexusv1alpha1.PendingRequest) func() *metav1.Condition {
	return func() *metav1.Condition {
		got := &toolnexusv1alpha1.PendingRequest{}
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
		return meta.FindStatusCondition(got.Status.Conditions, toolnexusv1alpha1.ConditionNotified)
	}
}

func notificationsOf(p *toolnexusv1alpha1.PendingRequest) []toolnexusv1alpha1.NotificationRecord {
	got := &toolnexusv1alpha1.PendingRequest{}
	Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
	return got.Status.Notifications
}

func conditionStatus(s metav1.ConditionStatus) OmegaMatcher {
	return And(Not(BeNil()), HaveField("Status", s))
}

// cloudEvents decodes every request a receiver got as a structured-mode CloudEvent, checking it
// with the SDK.
func cloudEvents(s *looptest.Server) []cloudevent.Event {
	var out []cloudevent.Event
	for _, r := range s.Requests() {
		Expect(r.Method).To(Equal(http.MethodPost))
		Expect(r.Header.Get("Content-Type")).To(Equal("application/cloudevents+json"))
		var e cloudevent.Event
		Expect(json.Unmarshal(r.Body, &e)).To(Succeed(), "%s", r.Body)
		Expect(e.Validate()).To(Succeed())
		out = append(out, e)
	}
	return out
}

// eventData decodes an event's data strictly: any field the notification does not promise fails.
func eventData(e cloudevent.Event) map[string]any {
	var d map[string]any
	Expect(e.DataAs(&d)).To(Succeed())
	Expect(d).To(HaveEach(Not(BeNil())))
	for k := range d {
		Expect(k).To(BeElementOf("namespace", "name", "uid", "run", "kind", "prompt", "url", "approvers", "toolCall", "ok", "reason", "answeredBy"))
	}
	return d
}

var _ = Describe("Notifications", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("sends a CloudEvent when a request opens and when it is answered, with the sink's headers", func() {
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "receiver", Namespace: ns},
			StringData: map[string]string{"token": "Bearer hunter2"}})).To(Succeed())
		sink := receiver(accept)
		run := notifiedRun(ns, "ce", toolnexusv1alpha1.NotifySink{Name: "ops", URL: sink.URL + "/events",
			Headers: []toolnexusv1alpha1.HTTPHeader{
				{Name: "Authorization", ValueFrom: &toolnexusv1alpha1.SecretValueSource{SecretKeyRef: toolnexusv1alpha1.SecretKeyReference{Name: "receiver", Key: "token"}}},
				{Name: "X-Team", Value: ptr.To("a")},
			}})
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		preq := waitSuspended(run, 1)[0]
		Expect(preq.Spec.Notify).To(ConsistOf(HaveField("Name", "ops")), "the run's sinks are copied into its request")

		By("the Opened event arrives, and Notified is True")
		Eventually(sink.Requests, eventually).Should(HaveLen(1))
		Eventually(notifiedOf(&preq), eventually).Should(conditionStatus(metav1.ConditionTrue))
		r := sink.Requests()[0]
		Expect(r.Path).To(Equal("/events"))
		Expect(r.Header.Get("Authorization")).To(Equal("Bearer hunter2"))
		Expect(r.Header.Get("X-Team")).To(Equal("a"))
		opened := cloudEvents(sink)[0]
		Expect(opened.SpecVersion()).To(Equal("1.0"))
		Expect(opened.Type()).To(Equal("dev.toolnexus.pendingrequest.opened"))
		Expect(opened.Source()).To(Equal("/namespaces/" + ns + "/agentruns/ce"))
		Expect(opened.Subject()).To(Equal(preq.Name))
		Expect(opened.ID()).To(Equal(string(preq.UID) + "/opened"))
		Expect(opened.DataContentType()).To(Equal("application/json"))
		Expect(opened.Time()).To(BeTemporally("~", preq.CreationTimestamp.Time, time.Second))
		Expect(eventData(opened)).To(Equal(map[string]any{
			"namespace": ns, "name": preq.Name, "uid": string(preq.UID), "run": "ce", "kind": "approval", "prompt": preq.Spec.Request.Prompt,
			"approvers": map[string]any{"users": []any{"alice"}, "groups": []any{"buyers"}},
			"toolCall":  map[string]any{"name": "buy", "arguments": `{"item":"gpu"}`},
		}))
		Expect(notificationsOf(&preq)).To(ConsistOf(And(HaveField("Sink", "ops"),
			HaveField("Event", toolnexusv1alpha1.NotifyOpened), HaveField("Outcome", toolnexusv1alpha1.NotificationDelivered))))

		By("answered, the Answered event says how and by whom, and the run ends")
		patchRequestStatus(&preq, `{"status":{"answer":{"ok":true},"answeredBy":"alice"}}`)
		Eventually(sink.Requests, eventually).Should(HaveLen(2))
		answered := cloudEvents(sink)[1]
		Expect(answered.Type()).To(Equal("dev.toolnexus.pendingrequest.answered"))
		Expect(answered.ID()).To(Equal(string(preq.UID) + "/answered"))
		Expect(eventData(answered)).To(And(HaveKeyWithValue("ok", true), HaveKeyWithValue("answeredBy", "alice"),
			HaveKeyWithValue("name", preq.Name), HaveKeyWithValue("uid", string(preq.UID)), Not(HaveKey("reason"))))
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Eventually(func() []toolnexusv1alpha1.NotificationRecord { return notificationsOf(&preq) }, eventually).Should(HaveLen(2))
		Eventually(notifiedOf(&preq), eventually).Should(conditionStatus(metav1.ConditionTrue))
		Expect(metricValue("toolnexus_notifications_total", map[string]string{"format": "cloudevents", "event": "answered", "outcome": "delivered"})).To(BeNumerically(">=", 1))
		Consistently(sink.Requests, time.Second).Should(HaveLen(2), "a delivered event is not sent again")
	})

	It("tells the sinks of the Agent a run runs, as the run snapshotted it", func() {
		sink := receiver(accept)
		ts := toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return 200, "ordered" })
		model := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "purchase", Arguments: `{"item":"gpu"}`}),
			looptest.OpenAIText("bought a gpu"))
		agent := newAgent(ns, "purchasing", model.URL, ts, "purchase")
		agent.Spec.Suspension = &toolnexusv1alpha1.SuspensionPolicy{Notify: []toolnexusv1alpha1.NotifySink{{Name: "buyers", URL: sink.URL}}}
		Expect(k8sClient.Create(ctx, agent)).To(Succeed())
		run := runOf(ns, "buy-gpu", "purchasing")
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		preq := waitSuspended(run, 1)[0]
		Expect(preq.Spec.Notify).To(ConsistOf(And(HaveField("Name", "buyers"), HaveField("URL", sink.URL))))
		Eventually(sink.Requests, eventually).Should(HaveLen(1))
		Expect(cloudEvents(sink)[0].Source()).To(Equal("/namespaces/" + ns + "/agentruns/buy-gpu"))
		Eventually(notifiedOf(&preq), eventually).Should(conditionStatus(metav1.ConditionTrue))
	})

	It("posts a Slack message with the answer commands to a webhook URL read from a Secret, never showing the URL", func() {
		sink := receiver(func(int64) looptest.Reply {
			return looptest.Reply{Body: "ok", Header: http.Header{"Content-Type": {"text/plain"}}}
		})
		webhook := sink.URL + "/services/T0/B0/s3cr3t-webhook-token"
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "slack", Namespace: ns},
			StringData: map[string]string{"url": webhook}})).To(Succeed())
		run := notifiedRun(ns, "chat", toolnexusv1alpha1.NotifySink{Name: "chat", Format: toolnexusv1alpha1.NotifyFormatSlack,
			URLFrom: &toolnexusv1alpha1.SecretValueSource{SecretKeyRef: toolnexusv1alpha1.SecretKeyReference{Name: "slack", Key: "url"}}})
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		preq := waitSuspended(run, 1)[0]
		Eventually(sink.Requests, eventually).Should(HaveLen(1))
		r := sink.Requests()[0]
		Expect(r.Path).To(Equal("/services/T0/B0/s3cr3t-webhook-token"))
		Expect(r.Header.Get("Content-Type")).To(Equal("application/json"))
		type slackText struct {
			Type, Text string
			// Verbatim keeps Slack from turning @here or a channel name in a prompt into a mention.
			Verbatim bool
		}
		var msg struct {
			Text   string `json:"text"`
			Blocks []struct {
				Type   string `json:"type"`
				Text   *slackText
				Fields []slackText
			} `json:"blocks"`
		}
		dec := json.NewDecoder(strings.NewReader(string(r.Body)))
		dec.DisallowUnknownFields()
		Expect(dec.Decode(&msg)).To(Succeed(), "%s", r.Body)
		Expect(msg.Text).To(Equal("Run " + ns + "/chat waits for an approval: " + preq.Spec.Request.Prompt))
		var shown []string
		for _, b := range msg.Blocks {
			Expect(b.Type).To(Equal("section"))
			if b.Text != nil {
				Expect(b.Text.Type).To(Equal("mrkdwn"))
				Expect(b.Text.Verbatim).To(BeTrue(), "%s", b.Text.Text)
				shown = append(shown, b.Text.Text)
			}
			for _, f := range b.Fields {
				Expect(f.Verbatim).To(BeTrue(), "%s", f.Text)
				shown = append(shown, f.Text)
			}
		}
		Expect(shown).To(ContainElements("*Kind*\napproval", "*Run*\n"+ns+"/chat", "*Request*\n"+preq.Name,
			"*Who may answer*\nuser alice, group buyers", "*Prompt*\n```"+preq.Spec.Request.Prompt+"```",
			"*Answer with*\n```kubectl toolnexus approve "+preq.Name+" -n "+ns+" --uid "+string(preq.UID)+
				"\nkubectl toolnexus decline "+preq.Name+" -n "+ns+" --uid "+string(preq.UID)+` --reason "..."`+"```"))
		Eventually(notifiedOf(&preq), eventually).Should(conditionStatus(metav1.ConditionTrue))

		By("the webhook URL is in no status, event or log")
		got := requestNamed(run, preq.Name)
		shownObj, err := yaml.Marshal(got)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(shownObj)).NotTo(ContainSubstring("s3cr3t"))
		var events eventsv1.EventList
		Expect(k8sClient.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
		Expect(events.Items).NotTo(BeEmpty())
		for _, e := range events.Items {
			Expect(e.Note).NotTo(ContainSubstring("s3cr3t"))
		}
		Expect(logLinesWith("s3cr3t")).To(BeEmpty())
		Expect(metricValue("toolnexus_notifications_total", map[string]string{"format": "slack", "event": "opened", "outcome": "delivered"})).To(BeNumerically(">=", 1))
	})

	It("retries a sink that fails, and Notified turns True once it takes the event", func() {
		sink := receiver(func(n int64) looptest.Reply {
			if n <= 3 {
				return looptest.Reply{Status: http.StatusServiceUnavailable}
			}
			return accept(n)
		})
		retriedBefore := metricValue("toolnexus_notifications_total", map[string]string{"event": "opened", "outcome": "retried"})
		run := notifiedRun(ns, "flaky", toolnexusv1alpha1.NotifySink{Name: "flaky", URL: sink.URL})
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		preq := waitSuspended(run, 1)[0]
		Eventually(notifiedOf(&preq), eventually).Should(conditionStatus(metav1.ConditionTrue))
		Expect(sink.Requests()).To(HaveLen(4))
		ids := map[string]bool{}
		for _, e := range cloudEvents(sink) {
			ids[e.ID()] = true
		}
		Expect(ids).To(Equal(map[string]bool{string(preq.UID) + "/opened": true}), "every attempt carries the same id")
		Expect(notificationsOf(&preq)).To(ConsistOf(And(HaveField("Outcome", toolnexusv1alpha1.NotificationDelivered), HaveField("Attempts", int32(4)))))
		Expect(metricValue("toolnexus_notifications_total", map[string]string{"event": "opened", "outcome": "retried"}) - retriedBefore).To(BeNumerically(">=", 3))
	})

	It("gives up at once on a 4xx, saying so in Notified", func() {
		sink := receiver(func(int64) looptest.Reply { return looptest.Reply{Status: http.StatusNotFound} })
		run := notifiedRun(ns, "gone", toolnexusv1alpha1.NotifySink{Name: "gone", URL: sink.URL})
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		preq := waitSuspended(run, 1)[0]
		Eventually(notifiedOf(&preq), eventually).Should(And(conditionStatus(metav1.ConditionFalse),
			HaveField("Reason", toolnexusv1alpha1.ReasonNotificationFailed),
			HaveField("Message", ContainSubstring("sink gone gave up on Opened after 1 attempts: the sink answered HTTP 404 Not Found"))))
		Expect(sink.Requests()).To(HaveLen(1))
		Eventually(func() []string {
			var events eventsv1.EventList
			Expect(k8sClient.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
			var notes []string
			for _, e := range events.Items {
				if e.Reason == "NotificationFailed" && e.Regarding.Name == preq.Name {
					notes = append(notes, e.Type+": "+e.Note)
				}
			}
			return notes
		}, eventually).Should(ConsistOf("Warning: Sink gone gave up on Opened after 1 attempts: the sink answered HTTP 404 Not Found"))
	})

	It("never holds the run: the run ends while its sink hangs", func() {
		var active, total atomic.Int64
		release := make(chan struct{})
		hung := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			total.Add(1)
			active.Add(1)
			defer active.Add(-1)
			select { // answers nothing until the attempt gives up (its timeout) or the test ends
			case <-r.Context().Done():
			case <-release:
			}
		}))
		DeferCleanup(func() { close(release); hung.Close() })
		run := notifiedRun(ns, "hung", toolnexusv1alpha1.NotifySink{Name: "hung", URL: hung.URL})
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		preq := waitSuspended(run, 1)[0]
		Eventually(active.Load, eventually).Should(Equal(int64(1)))
		started := time.Now()
		patchRequestStatus(&preq, `{"status":{"answer":{"ok":true}}}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(time.Since(started)).To(BeNumerically("<", notifyPolicy.Timeout), "the run did not wait for the attempt to time out")
		Expect([]int64{active.Load(), total.Load()}).To(Equal([]int64{1, 1}), "the run ended while the first attempt still hung")
		Expect(notifiedOf(&preq)()).To(conditionStatus(metav1.ConditionUnknown))
		Expect(notificationsOf(&preq)).To(BeEmpty())
	})

	It("sends .expired when a request expires, and a sink on [Answered] hears nothing of it", func() {
		all := receiver(accept)
		answeredOnly := receiver(accept)
		run := notifiedRun(ns, "late",
			toolnexusv1alpha1.NotifySink{Name: "all", URL: all.URL},
			toolnexusv1alpha1.NotifySink{Name: "answers", URL: answeredOnly.URL, On: []toolnexusv1alpha1.NotifyEvent{toolnexusv1alpha1.NotifyAnswered}})
		run.Spec.Suspension.Timeout = &metav1.Duration{Duration: 2 * time.Second}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		preq := waitSuspended(run, 1)[0]
		Eventually(all.Requests, eventually).Should(HaveLen(2))
		events := cloudEvents(all)
		Expect(events[0].Type()).To(Equal("dev.toolnexus.pendingrequest.opened"))
		Expect(events[1].Type()).To(Equal("dev.toolnexus.pendingrequest.expired"))
		Expect(events[1].ID()).To(Equal(string(preq.UID) + "/expired"))
		Expect(eventData(events[1])).To(And(HaveKeyWithValue("ok", false), HaveKeyWithValue("reason", "expired"),
			HaveKeyWithValue("answeredBy", toolnexusv1alpha1.ExpiredAnswerer)))
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Eventually(notifiedOf(&preq), eventually).Should(conditionStatus(metav1.ConditionTrue))
		Consistently(answeredOnly.Requests, time.Second).Should(BeEmpty())
	})

	It("sends a sink on [Answered] only the answer", func() {
		sink := receiver(accept)
		run := notifiedRun(ns, "answers", toolnexusv1alpha1.NotifySink{Name: "answers", URL: sink.URL,
			On: []toolnexusv1alpha1.NotifyEvent{toolnexusv1alpha1.NotifyAnswered}})
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		preq := waitSuspended(run, 1)[0]
		Eventually(notifiedOf(&preq), eventually).Should(conditionStatus(metav1.ConditionTrue))
		Expect(sink.Requests()).To(BeEmpty())
		patchRequestStatus(&preq, `{"status":{"answer":{"ok":false,"reason":"over budget"},"answeredBy":"alice"}}`)
		Eventually(sink.Requests, eventually).Should(HaveLen(1))
		e := cloudEvents(sink)[0]
		Expect(e.Type()).To(Equal("dev.toolnexus.pendingrequest.answered"))
		Expect(eventData(e)).To(And(HaveKeyWithValue("ok", false), HaveKeyWithValue("reason", "over budget")))
		Consistently(sink.Requests, time.Second).Should(HaveLen(1))
	})

	It("says which Secret a sink misses, and the rest goes on", func() {
		working := receiver(accept)
		run := notifiedRun(ns, "nosecret",
			toolnexusv1alpha1.NotifySink{Name: "chat", Format: toolnexusv1alpha1.NotifyFormatSlack,
				URLFrom: &toolnexusv1alpha1.SecretValueSource{SecretKeyRef: toolnexusv1alpha1.SecretKeyReference{Name: "missing-webhook", Key: "url"}}},
			toolnexusv1alpha1.NotifySink{Name: "ops", URL: working.URL})
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		preq := waitSuspended(run, 1)[0]
		Eventually(notifiedOf(&preq), eventually).Should(And(conditionStatus(metav1.ConditionFalse),
			HaveField("Reason", toolnexusv1alpha1.ReasonSecretNotFound),
			HaveField("Message", And(ContainSubstring("sink chat gave up on Opened"), ContainSubstring(`Secret "missing-webhook"`)))))
		Expect(working.Requests()).To(HaveLen(1))
		patchRequestStatus(&preq, `{"status":{"answer":{"ok":true}}}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Eventually(working.Requests, eventually).Should(HaveLen(2))
		Expect(notificationsOf(&preq)).To(ContainElement(And(HaveField("Sink", "chat"), HaveField("Outcome", toolnexusv1alpha1.NotificationFailed),
			HaveField("Reason", toolnexusv1alpha1.ReasonSecretNotFound))))
	})

	It("sends an Opened event that was not delivered before a restart after it", func() {
		release := make(chan struct{})
		var calls atomic.Int64
		sink := looptest.Serve(GinkgoT(), func(r looptest.Request) looptest.Reply {
			if calls.Add(1) == 1 {
				<-release // the first attempt is in flight when the manager stops
			}
			return accept(0)
		})
		run := notifiedRun(ns, "restart", toolnexusv1alpha1.NotifySink{Name: "ops", URL: sink.URL})
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		preq := waitSuspended(run, 1)[0]
		Eventually(calls.Load, eventually).Should(Equal(int64(1)))
		stopManager()
		<-managerDone
		close(release)
		Expect(notificationsOf(&preq)).To(BeEmpty())
		startManager()
		Eventually(notifiedOf(&preq), eventually).Should(conditionStatus(metav1.ConditionTrue))
		Expect(calls.Load()).To(BeNumerically(">=", 2))
		for _, e := range cloudEvents(sink) {
			Expect(e.ID()).To(Equal(string(preq.UID) + "/opened"))
		}
	})
})

package a2a_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/a2a"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// buyer is an Agent whose purchase tool needs an approval from approvers before it runs.
func buyer(ns, modelURL string, ts *toolstest.Server, approvers toolnexusv1alpha1.Approvers) {
	GinkgoHelper()
	Expect(admin.Create(ctx, &toolnexusv1alpha1.Agent{
		ObjectMeta: metav1.ObjectMeta{Name: "buyer", Namespace: ns},
		Spec: toolnexusv1alpha1.AgentSpec{
			Model: toolnexusv1alpha1.ModelSpec{Name: "m", BaseURL: modelURL},
			Tools: []toolnexusv1alpha1.ToolSpec{{Name: "purchase", Parameters: &apiextensionsv1.JSON{Raw: []byte(`{"type":"object"}`)},
				HTTP: &toolnexusv1alpha1.HTTPToolSpec{URL: ts.URL + "/purchase"}}},
			Approvals:  []toolnexusv1alpha1.ApprovalGate{{Tools: []string{"purchase"}}},
			Suspension: &toolnexusv1alpha1.SuspensionPolicy{Approvers: &approvers},
		},
	})).To(Succeed())
}

// purchaseModel asks for a purchase in each run it serves, and once the purchase tool answered,
// says "bought the gpu".
func purchaseModel() *looptest.Server {
	return looptest.Serve(GinkgoT(), func(r looptest.Request) looptest.Reply {
		chat, err := r.Chat()
		if err != nil {
			return looptest.OpenAIError(http.StatusBadRequest, err.Error())
		}
		for _, m := range chat.Messages {
			if m.Role == "tool" {
				return looptest.OpenAIText("bought the gpu")
			}
		}
		return looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "purchase", Arguments: `{"item":"gpu"}`})
	})
}

func toolServer() *toolstest.Server {
	return toolstest.Serve(GinkgoT(), func(toolstest.Call) (int, string) { return http.StatusOK, "purchased" })
}

func message(id, text string) a2a.Message {
	return a2a.Message{MessageID: id, Role: a2a.RoleUser, Parts: []a2a.Part{{Text: text}}}
}

func followUp(id, taskID, text string) a2a.Message {
	m := message(id, text)
	m.TaskID = taskID
	return m
}

// send sends msg and returns the task it answers with.
func send(c *a2a.Client, msg a2a.Message, immediately bool) *a2a.Task {
	GinkgoHelper()
	resp, err := c.SendMessage(ctx, a2a.SendMessageRequest{Message: msg,
		Configuration: &a2a.SendMessageConfiguration{ReturnImmediately: immediately}})
	Expect(err).NotTo(HaveOccurred())
	Expect(resp.Task).NotTo(BeNil())
	return resp.Task
}

// rpcError is the JSON-RPC error err carries.
func rpcError(err error) *a2a.Error {
	GinkgoHelper()
	var rpcErr *a2a.Error
	Expect(errors.As(err, &rpcErr)).To(BeTrue(), "want a JSON-RPC error, got %v", err)
	return rpcErr
}

func requestsOf(ns, run string) []toolnexusv1alpha1.PendingRequest {
	list := &toolnexusv1alpha1.PendingRequestList{}
	Expect(admin.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{toolnexusv1alpha1.RunLabel: run})).To(Succeed())
	return list.Items
}

func runOf(ns, name string) *toolnexusv1alpha1.AgentRun {
	run := &toolnexusv1alpha1.AgentRun{}
	Expect(admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, run)).To(Succeed())
	return run
}

// rawCall posts body to the endpoint with headers and returns the status and the body.
func rawCall(url, body string, headers map[string]string) (int, string) {
	GinkgoHelper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewBufferString(body))
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	return resp.StatusCode, string(raw)
}

var _ = Describe("An Agent served over A2A", func() {
	var ns string
	var ts *toolstest.Server

	BeforeEach(func() {
		ns, ts = newNamespace(), toolServer()
		buyer(ns, purchaseModel().URL, ts, toolnexusv1alpha1.Approvers{Groups: []string{"purchasing"}})
	})

	It("takes alice's message, asks for her approval, takes it and completes with the agent's text", func() {
		c := a2aClient(alice, ns, "buyer")
		card, err := c.Card(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(card.Name).To(Equal(ns + "/buyer"))
		Expect(card.SupportedInterfaces).To(ConsistOf(a2a.AgentInterface{URL: gw.Endpoint(ns, "buyer"),
			ProtocolBinding: a2a.ProtocolBindingJSONRPC, ProtocolVersion: "1.0"}))
		Expect(*card.Capabilities.Streaming).To(BeTrue())
		Expect(card.SecuritySchemes["kubernetes"].HTTPAuthSecurityScheme.Scheme).To(Equal("Bearer"))

		By("a blocking SendMessage answers once the task asks for input")
		task := send(c, message("buy-1", "buy a gpu"), false)
		Expect(task.Status.State).To(Equal(a2a.TaskStateInputRequired))
		Expect(task.Status.Message.Text()).To(Equal("Approve the call to purchase?"))
		asked := task.Status.Message.Requests()
		Expect(asked).To(HaveLen(1))
		Expect(asked[0].Kind).To(Equal("approval"))
		Expect(asked[0].Tool).To(Equal("purchase"))
		Expect(asked[0].Arguments).To(MatchJSON(`{"item":"gpu"}`))
		Expect(asked[0].UID).NotTo(BeEmpty())

		run := runOf(ns, task.ID)
		Expect(run.Spec.RequestedBy).To(Equal("alice"), "the run is alice's: the API server stamped the impersonated user")
		Expect(run.Spec.AgentRef.Name).To(Equal("buyer"))
		Expect(run.Spec.Prompt).To(Equal("buy a gpu"))
		Expect(run.Annotations).To(HaveKeyWithValue("toolnexus.dev/a2a-context-id", task.ContextID))

		By("the same message again is the same task")
		Expect(send(c, message("buy-1", "buy a gpu"), true).ID).To(Equal(task.ID))

		By("a follow-up message answers the request; the blocking send returns the completed task")
		done := send(c, followUp("buy-1-ok", task.ID, "approve"), false)
		Expect(done.Status.State).To(Equal(a2a.TaskStateCompleted))
		Expect(done.ArtifactText()).To(Equal("bought the gpu"))
		preqs := requestsOf(ns, task.ID)
		Expect(preqs).To(HaveLen(1))
		Expect(preqs[0].Status.AnsweredBy).To(Equal("alice"))
		Expect(preqs[0].Status.Answer.RequestUID).To(Equal(asked[0].UID))
		Expect(ts.Calls()).To(HaveLen(1))

		got, err := c.GetTask(ctx, task.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(got.Status.State).To(Equal(a2a.TaskStateCompleted))
		Expect(got.ArtifactText()).To(Equal("bought the gpu"))

		By("a completed task takes no more messages")
		_, err = c.SendMessage(ctx, a2a.SendMessageRequest{Message: followUp("buy-1-again", task.ID, "approve")})
		Expect(rpcError(err).Code).To(Equal(a2a.CodeUnsupportedOperation))
	})

	It("refuses bob's answer with the API server's message: he is no approver", func() {
		task := send(a2aClient(alice, ns, "buyer"), message("buy-2", "buy a gpu"), false)
		Expect(task.Status.State).To(Equal(a2a.TaskStateInputRequired))

		b := a2aClient(bob, ns, "buyer")
		seen, err := b.GetTask(ctx, task.ID)
		Expect(err).NotTo(HaveOccurred(), "bob may read the namespace's runs, so he sees the task")
		Expect(seen.Status.State).To(Equal(a2a.TaskStateInputRequired))
		_, err = b.SendMessage(ctx, a2a.SendMessageRequest{Message: followUp("bob-ok", task.ID, "approve")})
		refused := rpcError(err)
		Expect(refused.Code).To(Equal(a2a.CodeRefused))
		Expect(refused.Message).To(ContainSubstring("user bob may not answer this request: spec.approvers allows only"))

		preqs := requestsOf(ns, task.ID)
		Expect(preqs).To(HaveLen(1))
		Expect(preqs[0].Status.Answer).To(BeNil())
		Expect(ts.Calls()).To(BeEmpty())
		still, err := b.GetTask(ctx, task.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(still.Status.State).To(Equal(a2a.TaskStateInputRequired))
	})

	It("streams the task from its start to its result, lists only the caller's tasks, and cancels", func() {
		c := a2aClient(alice, ns, "buyer")
		events := make(chan a2a.StreamResponse, 64)
		var streamErr error
		var wg sync.WaitGroup
		streamCtx, cancel := context.WithTimeout(ctx, 2*eventually)
		DeferCleanup(cancel)
		wg.Go(func() {
			defer GinkgoRecover()
			streamErr = c.Stream(streamCtx, a2a.MethodSendStreamingMessage, a2a.SendMessageRequest{Message: message("buy-3", "buy a gpu")},
				func(ev a2a.StreamResponse) error { events <- ev; return nil })
			close(events)
		})
		var first a2a.StreamResponse
		Eventually(events, eventually).Should(Receive(&first))
		Expect(first.Task).NotTo(BeNil(), "a stream begins with the task")
		taskID := first.Task.ID
		for asking := false; !asking; {
			var ev a2a.StreamResponse
			Eventually(events, eventually).Should(Receive(&ev))
			Expect(ev.StatusUpdate).NotTo(BeNil(), "after the task, a stream carries status updates")
			Expect(ev.StatusUpdate.Status.State).To(BeElementOf(a2a.TaskStateWorking, a2a.TaskStateInputRequired))
			if asking = ev.StatusUpdate.Status.State == a2a.TaskStateInputRequired; asking {
				Expect(ev.StatusUpdate.Status.Message.Requests()).To(ConsistOf(HaveField("Kind", "approval")))
			}
		}
		Expect(send(c, followUp("buy-3-ok", taskID, "approve"), true).ID).To(Equal(taskID))
		var rest []a2a.StreamResponse
		for ended := time.After(eventually); ; {
			ev, open := a2a.StreamResponse{}, true
			select {
			case ev, open = <-events:
			case <-ended:
				Fail("the stream did not end with the task")
			}
			if !open {
				break
			}
			rest = append(rest, ev)
		}
		wg.Wait()
		Expect(streamErr).NotTo(HaveOccurred())
		Expect(rest).NotTo(BeEmpty())
		last := rest[len(rest)-1]
		Expect(last.StatusUpdate).NotTo(BeNil())
		Expect(last.StatusUpdate.Status.State).To(Equal(a2a.TaskStateCompleted), "the stream closes once the task ends")
		Expect(rest[len(rest)-2].ArtifactUpdate).NotTo(BeNil())
		Expect(rest[len(rest)-2].ArtifactUpdate.Artifact.Parts[0].Text).To(Equal("bought the gpu"))

		By("bob's task is his own")
		bobTask := send(a2aClient(bob, ns, "buyer"), message("bob-1", "buy a gpu"), false)
		Expect(bobTask.Status.State).To(Equal(a2a.TaskStateInputRequired))
		mine, err := c.ListTasks(ctx, a2a.ListTasksRequest{})
		Expect(err).NotTo(HaveOccurred())
		Expect(mine.Tasks).To(HaveLen(1))
		Expect(mine.Tasks[0].ID).To(Equal(taskID))
		Expect(mine.Tasks[0].Artifacts).To(BeEmpty(), "ListTasks leaves artifacts out unless asked")
		his, err := a2aClient(bob, ns, "buyer").ListTasks(ctx, a2a.ListTasksRequest{})
		Expect(err).NotTo(HaveOccurred())
		Expect(his.Tasks).To(HaveLen(1))
		Expect(his.Tasks[0].ID).To(Equal(bobTask.ID))
		Expect(his.NextPageToken).To(BeEmpty())

		By("bob cancels his task; a cancelled task cannot be cancelled again")
		canceled, err := a2aClient(bob, ns, "buyer").CancelTask(ctx, bobTask.ID)
		Expect(err).NotTo(HaveOccurred())
		Expect(canceled.Status.State).To(Equal(a2a.TaskStateCanceled))
		Expect(runOf(ns, bobTask.ID).Spec.Cancel).To(BeTrue())
		Eventually(func() string {
			c := meta.FindStatusCondition(runOf(ns, bobTask.ID).Status.Conditions, toolnexusv1alpha1.ConditionSucceeded)
			if c == nil {
				return ""
			}
			return string(c.Status) + "/" + c.Reason
		}, eventually).Should(Equal("False/Cancelled"))
		_, err = a2aClient(bob, ns, "buyer").CancelTask(ctx, bobTask.ID)
		Expect(rpcError(err).Code).To(Equal(a2a.CodeTaskNotCancelable))
	})
})

var _ = Describe("Who the gateway serves", func() {
	It("answers a request without a token, or with a bad one, with 401 and nothing else", func() {
		ns := newNamespace()
		buyer(ns, purchaseModel().URL, toolServer(), toolnexusv1alpha1.Approvers{Groups: []string{"purchasing"}})
		task := send(a2aClient(alice, ns, "buyer"), message("buy-4", "buy a gpu"), true)
		getTask := `{"jsonrpc":"2.0","id":"q1","method":"GetTask","params":{"id":"` + task.ID + `"}}`
		endpoint := gw.Endpoint(ns, "buyer")

		for _, headers := range []map[string]string{
			{a2a.VersionHeader: "1.0"},
			{a2a.VersionHeader: "1.0", "Authorization": "Bearer not-a-token-anyone-has"},
			{a2a.VersionHeader: "1.0", "Authorization": "Basic " + alice.token},
		} {
			status, body := rawCall(endpoint, getTask, headers)
			Expect(status).To(Equal(http.StatusUnauthorized))
			Expect(body).NotTo(ContainSubstring(task.ID))
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+a2a.WellKnownCardPath, nil)
		Expect(err).NotTo(HaveOccurred())
		resp, err := http.DefaultClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		resp.Body.Close()
		Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))
		Expect(resp.Header.Get("WWW-Authenticate")).To(HavePrefix("Bearer"))

		By("the JSON-RPC binding as the specification writes it, with alice's token")
		status, body := rawCall(endpoint, getTask, map[string]string{a2a.VersionHeader: "1.0", "Authorization": "Bearer " + alice.token})
		Expect(status).To(Equal(http.StatusOK))
		var answer map[string]any
		Expect(json.Unmarshal([]byte(body), &answer)).To(Succeed())
		Expect(answer).To(HaveKeyWithValue("jsonrpc", "2.0"))
		Expect(answer).To(HaveKeyWithValue("id", "q1"))
		Expect(answer).To(HaveKeyWithValue("result", HaveKeyWithValue("id", task.ID)))
		Expect(answer["result"]).To(HaveKeyWithValue("status", HaveKeyWithValue("state", BeElementOf("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_INPUT_REQUIRED"))))

		By("without A2A-Version the request is 0.3's, which this agent does not speak")
		_, body = rawCall(endpoint, getTask, map[string]string{"Authorization": "Bearer " + alice.token})
		Expect(body).To(ContainSubstring(`"code":-32009`))
	})

	It("never acts as a ServiceAccount, nor with a system: group", func() {
		ns := newNamespace()
		buyer(ns, purchaseModel().URL, toolServer(), toolnexusv1alpha1.Approvers{Groups: []string{"purchasing"}})
		task := send(a2aClient(alice, ns, "buyer"), message("buy-5", "buy a gpu"), true)

		By("a ServiceAccount's token is refused, even the manager's")
		manager := testEnv.Manager(GinkgoT())
		status, body := rawCall(gw.Endpoint(ns, "buyer"), `{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"`+task.ID+`"}}`,
			map[string]string{a2a.VersionHeader: "1.0", "Authorization": "Bearer " + manager.Config.BearerToken})
		Expect(status).To(Equal(http.StatusForbidden))
		Expect(body).To(ContainSubstring("does not act as system:serviceaccount:toolnexus-system:toolnexus-controller-manager"))

		By("mallory's token claims system:masters; the gateway acts as mallory alone, who may read nothing")
		m := a2aClient(mallory, ns, "buyer")
		_, err := m.GetTask(ctx, task.ID)
		Expect(rpcError(err).Code).To(Equal(a2a.CodeTaskNotFound))
		_, err = m.Card(ctx)
		var httpErr *a2a.HTTPError
		Expect(errors.As(err, &httpErr)).To(BeTrue())
		Expect(httpErr.StatusCode).To(Equal(http.StatusNotFound))
		_, err = m.SendMessage(ctx, a2a.SendMessageRequest{Message: message("m-1", "buy a gpu")})
		Expect(rpcError(err).Message).To(ContainSubstring("there is no Agent " + ns + "/buyer that you may read"))
	})
})

var _ = Describe("Two operators' worth of delegation in one process", func() {
	It("runs a tool that is an agent of another namespace, served over A2A: its request is answered here", func() {
		remote, local := newNamespace(), newNamespace()
		ts := toolServer()
		buyer(remote, purchaseModel().URL, ts, toolnexusv1alpha1.Approvers{Users: []string{relay.name}})
		Expect(admin.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "remote-buyer", Namespace: local},
			StringData: map[string]string{"authorization": "Bearer " + relay.token},
		})).To(Succeed())
		localModel := looptest.New(GinkgoT(),
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_a", Name: "buyer", Arguments: `{"message":"buy a gpu"}`}),
			looptest.OpenAIText("the buyer agent bought it"))
		run := &toolnexusv1alpha1.AgentRun{
			ObjectMeta: metav1.ObjectMeta{Name: "delegate", Namespace: local},
			Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "get me a gpu", AgentSpec: toolnexusv1alpha1.AgentSpec{
				Model: toolnexusv1alpha1.ModelSpec{Name: "m", BaseURL: localModel.URL},
				Tools: []toolnexusv1alpha1.ToolSpec{{Name: "buyer", Description: "The purchasing agent of the other team",
					A2A: &toolnexusv1alpha1.A2AToolSpec{URL: gw.Endpoint(remote, "buyer"), Headers: []toolnexusv1alpha1.HTTPHeader{{
						Name: "Authorization", ValueFrom: &toolnexusv1alpha1.SecretValueSource{
							SecretKeyRef: toolnexusv1alpha1.SecretKeyReference{Name: "remote-buyer", Key: "authorization"}}}}}}},
				Suspension: &toolnexusv1alpha1.SuspensionPolicy{Approvers: &toolnexusv1alpha1.Approvers{Users: []string{alice.name}}},
			}},
		}
		Expect(aliceKube.Create(ctx, run)).To(Succeed())

		By("the remote run waits for its approval, and the request surfaces in the local run")
		Eventually(func() []toolnexusv1alpha1.PendingRequest { return requestsOf(local, "delegate") }, eventually).
			Should(ConsistOf(HaveField("Spec.Request.Kind", "approval")))
		local1 := requestsOf(local, "delegate")[0]
		var data map[string]any
		Expect(json.Unmarshal(local1.Spec.Request.Data.Raw, &data)).To(Succeed())
		origin := data["a2a"].(map[string]any)
		Expect(origin).To(HaveKeyWithValue("tool", "purchase"))
		Expect(origin["arguments"]).To(MatchJSON(`{"item":"gpu"}`))
		Expect(local1.Spec.Request.Prompt).To(Equal("Approve the call to purchase?"))
		Expect(local1.Spec.Approvers.Users).To(ConsistOf("alice"))
		remoteRun := runOf(remote, origin["task"].(string))
		Expect(remoteRun.Spec.RequestedBy).To(Equal(relay.name))
		remoteReqs := requestsOf(remote, remoteRun.Name)
		Expect(remoteReqs).To(HaveLen(1))
		Expect(origin).To(HaveKeyWithValue("requestUID", string(remoteReqs[0].UID)))

		By("a manager restart while the call waits loses nothing")
		stopped := toolnexus.Done()
		Expect(toolnexus.Stop()).To(Succeed())
		<-stopped
		toolnexus.Start(GinkgoT())

		By("alice approves here, as she would any request; the answer is relayed as the tool's identity")
		answer := []byte(`{"status":{"answer":{"ok":true,"requestUID":"` + string(local1.UID) + `"}}}`)
		Expect(aliceKube.Status().Patch(ctx, &local1, client.RawPatch(types.MergePatchType, answer))).To(Succeed())
		Eventually(func() string {
			return requestsOf(remote, remoteRun.Name)[0].Status.AnsweredBy
		}, eventually).Should(Equal(relay.name))
		Eventually(func() string {
			c := meta.FindStatusCondition(runOf(local, "delegate").Status.Conditions, toolnexusv1alpha1.ConditionSucceeded)
			if c == nil {
				return ""
			}
			return string(c.Status) + "/" + c.Reason
		}, eventually).Should(Equal("True/Completed"))
		done := runOf(local, "delegate")
		Expect(done.Status.Text).To(Equal("the buyer agent bought it"))
		Expect(done.Status.ToolCalls).To(ContainElement(And(HaveField("Name", "buyer"), HaveField("Output", "bought the gpu"), HaveField("IsError", false))))
		Expect(ts.Calls()).To(HaveLen(1))
		Expect(runOf(remote, remoteRun.Name).Status.Phase).To(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
	})
})

package main_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os/exec"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	"github.com/onsi/gomega/gexec"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/runstore"
	"github.com/toolnexus/operator/internal/tools"
)

var approvers = &toolnexusv1alpha1.Approvers{Users: []string{"alice"}}

func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "plugin-"}}
	Expect(admin.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// newRequest creates a PendingRequest of kind for the run buy-gpu, as the controller would.
func newRequest(ns, kind string, approvers *toolnexusv1alpha1.Approvers) *toolnexusv1alpha1.PendingRequest {
	preq := &toolnexusv1alpha1.PendingRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "buy-gpu-1-call-", Namespace: ns,
			Labels: map[string]string{toolnexusv1alpha1.RunLabel: "buy-gpu"}},
		Spec: toolnexusv1alpha1.PendingRequestSpec{
			RunRef:    toolnexusv1alpha1.RunReference{Name: "buy-gpu"},
			ToolCall:  toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "approve_purchase", Arguments: `{"item":"gpu","amount":1200}`},
			Request:   toolnexusv1alpha1.Request{ID: "pnd-lx2k1-1", Kind: kind, Prompt: "Approve purchase of gpu?"},
			Approvers: approvers,
		},
	}
	if kind == "authorization" {
		preq.Spec.Request.URL = "https://auth.example.com/login"
	}
	ExpectWithOffset(1, admin.Create(ctx, preq)).To(Succeed())
	return preq
}

// stored reads a request back as the admin.
func stored(preq *toolnexusv1alpha1.PendingRequest) *toolnexusv1alpha1.PendingRequest {
	got := &toolnexusv1alpha1.PendingRequest{}
	ExpectWithOffset(1, admin.Get(ctx, client.ObjectKeyFromObject(preq), got)).To(Succeed())
	return got
}

// newRun creates an AgentRun buy-gpu with the given status, as the controller would write it.
func newRun(ns string, status toolnexusv1alpha1.AgentRunStatus) *toolnexusv1alpha1.AgentRun {
	run := &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Name: "buy-gpu", Namespace: ns},
		Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "buy a gpu", AgentSpec: toolnexusv1alpha1.AgentSpec{
			Model:        toolnexusv1alpha1.ModelSpec{Name: "gpt-4o-mini"},
			SystemPrompt: "You are a purchasing assistant.",
		}},
	}
	ExpectWithOffset(1, admin.Create(ctx, run)).To(Succeed())
	setRunStatus(run, status)
	return run
}

// setRunStatus writes the run's status through the status subresource, stamping the generation.
func setRunStatus(run *toolnexusv1alpha1.AgentRun, status toolnexusv1alpha1.AgentRunStatus) {
	status.ObservedGeneration = run.Generation
	fields := map[string]any{}
	data, err := json.Marshal(status)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	ExpectWithOffset(1, json.Unmarshal(data, &fields)).To(Succeed())
	if len(status.Pending) == 0 {
		fields["pending"] = nil // a merge patch removes what is null
	}
	raw, err := json.Marshal(map[string]any{"status": fields})
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	ExpectWithOffset(1, admin.Status().Patch(ctx, run, client.RawPatch(types.MergePatchType, raw))).To(Succeed())
}

func suspended(preq string) toolnexusv1alpha1.AgentRunStatus {
	return toolnexusv1alpha1.AgentRunStatus{
		Phase: toolnexusv1alpha1.RunPhaseSuspended, Result: "pending", Turns: 1, ToolCallCount: 1,
		Text: "Approve purchase of gpu?", PendingCount: 1,
		Pending: []toolnexusv1alpha1.PendingSummary{{Name: preq, Kind: "approval", Prompt: "Approve purchase of gpu?", ToolCallID: "call_1"}},
		Conditions: []metav1.Condition{
			{Type: toolnexusv1alpha1.ConditionSucceeded, Status: metav1.ConditionUnknown, Reason: toolnexusv1alpha1.ReasonWaitingForAnswer, Message: "Waiting", LastTransitionTime: metav1.Now()},
			{Type: toolnexusv1alpha1.ConditionSuspended, Status: metav1.ConditionTrue, Reason: toolnexusv1alpha1.ReasonOpenRequests, Message: "1 open", LastTransitionTime: metav1.Now()},
		},
	}
}

func succeeded() toolnexusv1alpha1.AgentRunStatus {
	return toolnexusv1alpha1.AgentRunStatus{
		Phase: toolnexusv1alpha1.RunPhaseSucceeded, Result: "done", Turns: 2, ToolCallCount: 1,
		Text: "Bought the gpu.",
		Conditions: []metav1.Condition{
			{Type: toolnexusv1alpha1.ConditionSucceeded, Status: metav1.ConditionTrue, Reason: toolnexusv1alpha1.ReasonCompleted, Message: "Done", LastTransitionTime: metav1.Now()},
			{Type: toolnexusv1alpha1.ConditionSuspended, Status: metav1.ConditionFalse, Reason: toolnexusv1alpha1.ReasonNoOpenRequests, Message: "None", LastTransitionTime: metav1.Now()},
		},
	}
}

// writeRecord stores v as the manager stores a part of run's record: gzipped JSON in an
// AgentRunRecord.
func writeRecord(run *toolnexusv1alpha1.AgentRun, name string, index int32, v any) {
	raw, err := json.Marshal(v)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, err = zw.Write(raw)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	ExpectWithOffset(1, zw.Close()).To(Succeed())
	part := toolnexusv1alpha1.RecordPartHead
	if index > 0 {
		part = toolnexusv1alpha1.RecordPartSegment
	}
	ExpectWithOffset(1, admin.Create(ctx, &toolnexusv1alpha1.AgentRunRecord{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: run.Namespace},
		Run:        toolnexusv1alpha1.RecordRunReference{Name: run.Name, UID: string(run.UID)},
		Part:       part, Index: index, Encoding: toolnexusv1alpha1.RecordEncoding, Data: gz.Bytes(),
	})).To(Succeed())
}

// list is what -o json prints for a list.
type list[T any] struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Items      []T    `json:"items"`
}

func names(items []toolnexusv1alpha1.PendingRequest) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.Name)
	}
	return out
}

var _ = Describe("kubectl toolnexus", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	Describe("pending", func() {
		It("lists only the open requests, as a table and as JSON", func() {
			open := newRequest(ns, "authorization", nil)
			answered := newRequest(ns, "approval", nil)
			_, _, err := kubectlToolnexus("alice", "-n", ns, "approve", answered.Name)
			Expect(err).NotTo(HaveOccurred())
			cancelled := newRequest(ns, "approval", nil)
			Expect(admin.Status().Patch(ctx, cancelled, client.RawPatch(types.MergePatchType, []byte(`{"status":{"phase":"Cancelled"}}`)))).To(Succeed())

			stdout, stderr, err := kubectlToolnexus("alice", "-n", ns, "pending", "-o", "json")
			Expect(err).NotTo(HaveOccurred(), stderr)
			var got list[toolnexusv1alpha1.PendingRequest]
			Expect(json.Unmarshal([]byte(stdout), &got)).To(Succeed())
			Expect(got.Kind).To(Equal("List"))
			Expect(names(got.Items)).To(Equal([]string{open.Name}))
			Expect(got.Items[0].Kind).To(Equal("PendingRequest"))
			Expect(got.Items[0].APIVersion).To(Equal("toolnexus.dev/v1alpha1"))

			stdout, _, err = kubectlToolnexus("alice", "-n", ns, "pending")
			Expect(err).NotTo(HaveOccurred())
			Expect(stdout).To(MatchRegexp(`^NAME\s+RUN\s+KIND\s+PROMPT\s+URL\s+AGE\n`))
			Expect(stdout).To(MatchRegexp(open.Name + `\s+buy-gpu\s+authorization\s+Approve purchase of gpu\?\s+https://auth.example.com/login\s+\d+s`))
			Expect(stdout).NotTo(ContainSubstring(answered.Name))
			Expect(stdout).NotTo(ContainSubstring(cancelled.Name))

			stdout, _, err = kubectlToolnexus("alice", "pending", "-A")
			Expect(err).NotTo(HaveOccurred())
			Expect(stdout).To(MatchRegexp(`^NAMESPACE\s+NAME\s+RUN`))
			Expect(stdout).To(MatchRegexp(ns + `\s+` + open.Name))

			stdout, _, err = kubectlToolnexus("alice", "pending", "-A", "-o", "yaml")
			Expect(err).NotTo(HaveOccurred())
			Expect(stdout).To(ContainSubstring("name: " + open.Name))
		})

		It("shows a sub-agent's request with the path from the run that started it", func() {
			preq := newRequest(ns, "approval", approvers)
			Expect(admin.Patch(ctx, preq, client.RawPatch(types.MergePatchType, []byte(
				`{"metadata":{"annotations":{"`+toolnexusv1alpha1.RunPathAnnotation+`":"lab-order/buy-gpu"}}}`)))).To(Succeed())
			stdout, _, err := kubectlToolnexus("alice", "-n", ns, "pending")
			Expect(err).NotTo(HaveOccurred())
			Expect(stdout).To(MatchRegexp(preq.Name + `\s+lab-order → buy-gpu\s+approval\s+`))
			stdout, _, err = kubectlToolnexus("alice", "-n", ns, "show", preq.Name)
			Expect(err).NotTo(HaveOccurred())
			Expect(stdout).To(ContainSubstring("Run:         buy-gpu\nDelegated:   lab-order → buy-gpu\n"))
		})

		It("says so when nothing is open", func() {
			stdout, stderr, err := kubectlToolnexus("alice", "-n", ns, "pending")
			Expect(err).NotTo(HaveOccurred())
			Expect(stdout).To(BeEmpty())
			Expect(stderr).To(Equal("No open PendingRequests found in " + ns + " namespace.\n"))
		})
	})

	Describe("show", func() {
		It("shows the request, the approvers, the tool call and the answer", func() {
			preq := newRequest(ns, "approval", approvers)
			stdout, stderr, err := kubectlToolnexus("alice", "-n", ns, "show", preq.Name)
			Expect(err).NotTo(HaveOccurred(), stderr)
			Expect(stdout).To(ContainSubstring("Run:         buy-gpu"))
			Expect(stdout).To(ContainSubstring("Phase:       Waiting"))
			Expect(stdout).To(ContainSubstring("  Kind:      approval"))
			Expect(stdout).To(ContainSubstring("  Prompt:    Approve purchase of gpu?"))
			Expect(stdout).To(ContainSubstring("  Users:     alice"))
			Expect(stdout).To(ContainSubstring("  Name:      approve_purchase"))
			Expect(stdout).To(ContainSubstring("  Arguments: {\n               \"amount\": 1200,\n               \"item\": \"gpu\"\n             }"))
			uid := string(stored(preq).UID)
			Expect(stdout).To(ContainSubstring("UID:         " + uid + "\n"))
			Expect(stdout).To(ContainSubstring("  none yet; answer this request (uid " + uid + ") with:\n" +
				"    kubectl toolnexus approve " + preq.Name + " -n " + ns + " --uid " + uid + "\n" +
				"    kubectl toolnexus decline " + preq.Name + " -n " + ns + " --uid " + uid + " --reason \"...\"\n"))

			_, stderr, err = kubectlToolnexus("alice", "-n", ns, "approve", preq.Name)
			Expect(err).NotTo(HaveOccurred(), stderr)
			stdout, _, err = kubectlToolnexus("alice", "-n", ns, "show", preq.Name)
			Expect(err).NotTo(HaveOccurred())
			Expect(stdout).To(ContainSubstring("  OK:        true"))
			Expect(stdout).To(ContainSubstring("  By:        alice"))

			stdout, _, err = kubectlToolnexus("alice", "-n", ns, "show", preq.Name, "-o", "json")
			Expect(err).NotTo(HaveOccurred())
			got := &toolnexusv1alpha1.PendingRequest{}
			Expect(json.Unmarshal([]byte(stdout), got)).To(Succeed())
			Expect(got.Kind).To(Equal("PendingRequest"))
			Expect(got.Spec.Request.ID).To(Equal("pnd-lx2k1-1"))
			Expect(got.Status.Answer).NotTo(BeNil())
			Expect(got.ManagedFields).To(BeEmpty())
		})

		It("shows the MCP revision each of the run's servers speaks", func() {
			run := newRun(ns, toolnexusv1alpha1.AgentRunStatus{Phase: toolnexusv1alpha1.RunPhaseSuspended, Conditions: []metav1.Condition{{
				Type: toolnexusv1alpha1.ConditionToolsReady, Status: metav1.ConditionTrue, Reason: toolnexusv1alpha1.ReasonToolsAvailable,
				Message: "Every MCP server answered: ci (MCP 2026-07-28), docs (MCP 2025-11-25)", LastTransitionTime: metav1.Now()}}})
			preq := newRequest(ns, "input", approvers)
			stdout, stderr, err := kubectlToolnexus("alice", "-n", ns, "show", preq.Name)
			Expect(err).NotTo(HaveOccurred(), stderr)
			Expect(stdout).To(ContainSubstring("\nMCP servers: Every MCP server answered: ci (MCP 2026-07-28), docs (MCP 2025-11-25)\n\nRequest\n"))

			// A request of an earlier run of the same name does not show this run's servers.
			other := newRequest(ns, "input", approvers)
			other.OwnerReferences = []metav1.OwnerReference{{APIVersion: toolnexusv1alpha1.GroupVersion.String(), Kind: "AgentRun",
				Name: run.Name, UID: "an-earlier-run", Controller: ptr.To(true)}}
			Expect(admin.Update(ctx, other)).To(Succeed())
			stdout, stderr, err = kubectlToolnexus("alice", "-n", ns, "show", other.Name)
			Expect(err).NotTo(HaveOccurred(), stderr)
			Expect(stdout).NotTo(ContainSubstring("MCP servers:"))
		})

		It("names what is missing", func() {
			_, stderr, err := kubectlToolnexus("alice", "-n", ns, "show", "nope")
			Expect(err).To(HaveOccurred())
			Expect(stderr).To(Equal("Error: pendingrequests.toolnexus.dev \"nope\" not found\n"))
		})
	})

	Describe("approve", func() {
		It("sets {ok: true} pinned to the request id and bound to its uid, as the user", func() {
			preq := newRequest(ns, "approval", approvers)
			stdout, stderr, err := kubectlToolnexus("alice", "-n", ns, "approve", preq.Name)
			Expect(err).NotTo(HaveOccurred(), stderr)
			Expect(stdout).To(Equal("pendingrequest.toolnexus.dev/" + preq.Name + " approved\n"))
			got := stored(preq)
			Expect(got.Status.Answer).To(Equal(&toolnexusv1alpha1.Answer{ID: "pnd-lx2k1-1", RequestUID: string(got.UID), OK: true}))
			Expect(got.Status.AnsweredBy).To(Equal("alice"))

			_, stderr, err = kubectlToolnexus("alice", "-n", ns, "approve", preq.Name)
			Expect(err).To(HaveOccurred())
			Expect(stderr).To(ContainSubstring(`pendingrequests.toolnexus.dev "` + preq.Name + `" is already answered (ok: true by`))
		})

		It("passes on the API server's refusal of a non-approver", func() {
			preq := newRequest(ns, "approval", approvers)
			_, stderr, err := kubectlToolnexus("bob", "-n", ns, "approve", preq.Name)
			Expect(err).To(HaveOccurred())
			Expect(stderr).To(HavePrefix("Error: the API server refused the answer: "))
			Expect(stderr).To(ContainSubstring("user bob may not answer this request: spec.approvers allows only users alice"))
			Expect(stored(preq).Status.Answer).To(BeNil())
		})

		It("passes on an RBAC refusal", func() {
			preq := newRequest(ns, "approval", nil)
			_, stderr, err := kubectlToolnexus("carol", "-n", ns, "approve", preq.Name)
			Expect(err).To(HaveOccurred())
			Expect(stderr).To(ContainSubstring(`pendingrequests.toolnexus.dev "` + preq.Name + `" is forbidden: User "carol" cannot get resource "pendingrequests"`))
		})

		It("lets anyone RBAC allows answer a request without approvers", func() {
			preq := newRequest(ns, "approval", nil)
			_, stderr, err := kubectlToolnexus("bob", "-n", ns, "approve", preq.Name)
			Expect(err).NotTo(HaveOccurred(), stderr)
			Expect(stored(preq).Status.Answer.OK).To(BeTrue())
		})

		It("follows the run to its next state with --wait", func() {
			preq := newRequest(ns, "approval", approvers)
			run := newRun(ns, suspended(preq.Name))
			cmd := exec.Command(plugin, "--kubeconfig", kubeconfigs["alice"], "-n", ns, "approve", preq.Name, "--wait", "--timeout", "1m")
			session, err := gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(session.Kill)
			Eventually(session.Out).Should(gbytes.Say("pendingrequest.toolnexus.dev/" + preq.Name + " approved\n"))
			Consistently(session).ShouldNot(gexec.Exit())
			setRunStatus(run, succeeded())
			Eventually(session).WithTimeout(30 * time.Second).Should(gexec.Exit(0))
			Expect(session.Out).To(gbytes.Say("agentrun.toolnexus.dev/buy-gpu Succeeded\n  Bought the gpu.\n"))
		})
	})

	Describe("decline", func() {
		It("sets {ok: false} with the reason", func() {
			preq := newRequest(ns, "approval", approvers)
			stdout, stderr, err := kubectlToolnexus("alice", "-n", ns, "decline", preq.Name, "--reason", "over budget")
			Expect(err).NotTo(HaveOccurred(), stderr)
			Expect(stdout).To(Equal("pendingrequest.toolnexus.dev/" + preq.Name + " declined\n"))
			Expect(stored(preq).Status.Answer).To(Equal(&toolnexusv1alpha1.Answer{ID: "pnd-lx2k1-1", RequestUID: string(preq.UID), OK: false, Reason: "over budget"}))

			other := newRequest(ns, "approval", nil)
			_, _, err = kubectlToolnexus("alice", "-n", ns, "decline", other.Name)
			Expect(err).NotTo(HaveOccurred())
			Expect(stored(other).Status.Answer.Reason).To(Equal("declined"))
		})
	})

	Describe("answer", func() {
		It("sets data.output from --output", func() {
			preq := newRequest(ns, "input", nil)
			stdout, stderr, err := kubectlToolnexus("alice", "-n", ns, "answer", preq.Name, "--output", "staging")
			Expect(err).NotTo(HaveOccurred(), stderr)
			Expect(stdout).To(Equal("pendingrequest.toolnexus.dev/" + preq.Name + " answered\n"))
			Expect(stored(preq).Status.Answer.Data.Raw).To(MatchJSON(`{"output":"staging"}`))
		})

		It("sets data from --data", func() {
			preq := newRequest(ns, "question", nil)
			_, stderr, err := kubectlToolnexus("alice", "-n", ns, "answer", preq.Name, "--data", `{"colour":"blue","size":["m","l"]}`)
			Expect(err).NotTo(HaveOccurred(), stderr)
			Expect(stored(preq).Status.Answer.Data.Raw).To(MatchJSON(`{"colour":"blue","size":["m","l"]}`))
		})

		It("refuses a bad command line before it writes", func() {
			preq := newRequest(ns, "input", nil)
			_, stderr, err := kubectlToolnexus("alice", "-n", ns, "answer", preq.Name)
			Expect(err).To(HaveOccurred())
			Expect(stderr).To(Equal("Error: give exactly one of --output TEXT or --data JSON\n"))
			_, stderr, err = kubectlToolnexus("alice", "-n", ns, "answer", preq.Name, "--data", `["a"]`)
			Expect(err).To(HaveOccurred())
			Expect(stderr).To(ContainSubstring("--data must be a JSON object"))
			Expect(stored(preq).Status.Answer).To(BeNil())
		})

		It("passes on the API server's rule that an input needs a result", func() {
			preq := newRequest(ns, "input", nil)
			_, stderr, err := kubectlToolnexus("alice", "-n", ns, "approve", preq.Name)
			Expect(err).To(HaveOccurred())
			Expect(stderr).To(ContainSubstring("an input request needs status.answer.data.output"))
		})
	})

	Describe("runs", func() {
		It("lists runs with phase, turns, open requests and text", func() {
			newRun(ns, suspended("buy-gpu-1-call-1"))
			stdout, stderr, err := kubectlToolnexus("alice", "-n", ns, "runs")
			Expect(err).NotTo(HaveOccurred(), stderr)
			Expect(stdout).To(MatchRegexp(`^NAME\s+PHASE\s+TURNS\s+PENDING\s+TEXT\s+AGE\n`))
			Expect(stdout).To(MatchRegexp(`buy-gpu\s+Suspended\s+1\s+1\s+Approve purchase of gpu\?\s+\d+s`))

			stdout, _, err = kubectlToolnexus("alice", "-n", ns, "runs", "-o", "json")
			Expect(err).NotTo(HaveOccurred())
			var got list[toolnexusv1alpha1.AgentRun]
			Expect(json.Unmarshal([]byte(stdout), &got)).To(Succeed())
			Expect(got.Items).To(HaveLen(1))
			Expect(got.Items[0].Kind).To(Equal("AgentRun"))
			Expect(got.Items[0].Status.Pending[0].Name).To(Equal("buy-gpu-1-call-1"))
		})
	})

	Describe("transcript", func() {
		It("prints every message, tool call and result, errors marked", func() {
			state := &loop.State{
				Messages: []loop.Message{
					{Role: loop.RoleUser, Content: "buy a gpu"},
					{Role: loop.RoleAssistant, Content: "Checking.", ToolCalls: []loop.MessageToolCall{
						{ID: "call_1", Name: "approve_purchase", Arguments: `{"item":"gpu"}`},
						{ID: "call_2", Name: "lookup_price", Arguments: `{"item":"gpu"}`},
					}},
					{Role: loop.RoleTool, ToolCallID: "call_1", Content: "declined/expired: Approve purchase of gpu?\nreason: over budget", IsError: true},
					{Role: loop.RoleTool, ToolCallID: "call_2", Content: "1200 EUR"},
					{Role: loop.RoleAssistant, Content: "The purchase was declined."},
				},
				Turn: 2, Model: "gpt-4o-mini", Status: loop.StatusDone, Text: "The purchase was declined.",
				Calls: []loop.Call{{ID: "call_3", Name: "notify", Args: "{}", Phase: loop.PhaseSuspended,
					Request: &tools.Request{ID: "r", Kind: "input", Prompt: "Who?"}}},
			}
			// As the controller stores it: the first messages sealed in a segment, the rest in the head.
			head := *state
			head.Messages = state.Messages[2:]
			run := newRun(ns, toolnexusv1alpha1.AgentRunStatus{Phase: toolnexusv1alpha1.RunPhaseRunning})
			writeRecord(run, "buy-gpu.seg-1", 1, runstore.Segment{Messages: state.Messages[:2]})
			writeRecord(run, "buy-gpu", 0, runstore.Head{State: &head,
				Segments: []runstore.SegmentRef{{Blob: runstore.Blob{Name: "buy-gpu.seg-1", Bytes: 100, RawBytes: 300}, Messages: 2}}})

			_, stderr, err := kubectlToolnexus("alice", "-n", ns, "transcript", "buy-gpu")
			Expect(err).To(HaveOccurred())
			Expect(stderr).To(ContainSubstring(`agentruns.toolnexus.dev "buy-gpu" has no transcript yet`))

			setRunStatus(run, toolnexusv1alpha1.AgentRunStatus{Phase: toolnexusv1alpha1.RunPhaseSucceeded,
				TranscriptRef: &toolnexusv1alpha1.TranscriptReference{Name: "buy-gpu"}})
			// alice only answers; vic, a viewer, reads the transcript.
			stdout, stderr, err := kubectlToolnexus("alice", "-n", ns, "transcript", "buy-gpu")
			Expect(err).To(HaveOccurred())
			Expect(stderr).To(ContainSubstring(`agentrunrecords.toolnexus.dev "buy-gpu" is forbidden`))
			Expect(stdout).To(BeEmpty())

			stdout, stderr, err = kubectlToolnexus("vic", "-n", ns, "transcript", "buy-gpu")
			Expect(err).NotTo(HaveOccurred(), stderr)
			Expect(stdout).To(Equal(`AgentRun ` + ns + `/buy-gpu: Succeeded, 2 turns, model gpt-4o-mini

[system]
  You are a purchasing assistant.

[user]
  buy a gpu

[assistant]
  Checking.
  -> call approve_purchase call_1
     {
       "item": "gpu"
     }
  -> call lookup_price call_2
     {
       "item": "gpu"
     }

[tool approve_purchase call_1] (result, ERROR)
  declined/expired: Approve purchase of gpu?
  reason: over budget

[tool lookup_price call_2] (result)
  1200 EUR

[assistant]
  The purchase was declined.

[calls of turn 2 in progress]
  notify call_3: suspended (input: Who?)

[end] done
`))

			stdout, _, err = kubectlToolnexus("vic", "-n", ns, "transcript", "buy-gpu", "-o", "json")
			Expect(err).NotTo(HaveOccurred())
			got := &loop.State{}
			Expect(json.Unmarshal([]byte(stdout), got)).To(Succeed())
			Expect(got).To(Equal(state))
		})
	})

	Describe("wait", func() {
		It("waits until the run is Suspended, then prints the phase", func() {
			run := newRun(ns, toolnexusv1alpha1.AgentRunStatus{Phase: toolnexusv1alpha1.RunPhaseRunning, Turns: 1})
			session, err := gexec.Start(exec.Command(plugin, "--kubeconfig", kubeconfigs["alice"], "-n", ns, "wait", "buy-gpu"), GinkgoWriter, GinkgoWriter)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(session.Kill)
			Consistently(session).ShouldNot(gexec.Exit())
			setRunStatus(run, suspended("buy-gpu-1-call-1"))
			Eventually(session).WithTimeout(30 * time.Second).Should(gexec.Exit(0))
			Expect(session.Out).To(gbytes.Say("agentrun.toolnexus.dev/buy-gpu Suspended\n  waiting on buy-gpu-1-call-1 \\(approval\\): Approve purchase of gpu\\?\n"))

			stdout, _, err := kubectlToolnexus("alice", "-n", ns, "wait", "buy-gpu", "-o", "json")
			Expect(err).NotTo(HaveOccurred())
			got := &toolnexusv1alpha1.AgentRun{}
			Expect(json.Unmarshal([]byte(stdout), got)).To(Succeed())
			Expect(got.Status.Phase).To(Equal(toolnexusv1alpha1.RunPhaseSuspended))
		})

		It("gives up after --timeout", func() {
			newRun(ns, toolnexusv1alpha1.AgentRunStatus{Phase: toolnexusv1alpha1.RunPhaseRunning})
			_, stderr, err := kubectlToolnexus("alice", "-n", ns, "wait", "buy-gpu", "--timeout", "1s")
			Expect(err).To(HaveOccurred())
			Expect(stderr).To(Equal("Error: timed out waiting for agentruns.toolnexus.dev \"buy-gpu\" to suspend or finish\n"))
		})
	})

	Describe("run", func() {
		It("creates a run of the Agent as a run author and, with --wait, follows it past a suspension to its end", func() {
			session, err := gexec.Start(exec.Command(plugin, "--kubeconfig", kubeconfigs["erin"], "-n", ns,
				"run", "purchasing", "buy a gpu", "--wait"), GinkgoWriter, GinkgoWriter)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(session.Kill)
			Eventually(session.Out).WithTimeout(30 * time.Second).Should(gbytes.Say(`agentrun.toolnexus.dev/(purchasing-[a-z0-9]{5}) created\n`))
			var runs toolnexusv1alpha1.AgentRunList
			Expect(admin.List(ctx, &runs, client.InNamespace(ns))).To(Succeed())
			Expect(runs.Items).To(HaveLen(1))
			run := &runs.Items[0]
			Expect(run.Spec.AgentRef).To(Equal(&toolnexusv1alpha1.AgentReference{Name: "purchasing"}))
			Expect(run.Spec.Prompt).To(Equal("buy a gpu"))
			Expect(run.Spec.Model.Name).To(BeEmpty())

			setRunStatus(run, suspended(run.Name+"-1-call-1"))
			Consistently(session).ShouldNot(gexec.Exit(), "a suspension is not the end of the run")
			setRunStatus(run, succeeded())
			Eventually(session).WithTimeout(30 * time.Second).Should(gexec.Exit(0))
			Expect(session.Out).To(gbytes.Say("agentrun.toolnexus.dev/" + run.Name + " Succeeded\n"))
		})

		It("creates a run without waiting, and is refused for a person who may not create runs", func() {
			stdout, _, err := kubectlToolnexus("erin", "-n", ns, "run", "purchasing", "buy a gpu", "--max-turns", "3")
			Expect(err).NotTo(HaveOccurred())
			Expect(stdout).To(MatchRegexp(`^agentrun.toolnexus.dev/purchasing-[a-z0-9]{5} created\n$`))
			var runs toolnexusv1alpha1.AgentRunList
			Expect(admin.List(ctx, &runs, client.InNamespace(ns))).To(Succeed())
			Expect(runs.Items).To(ConsistOf(HaveField("Spec.MaxTurns", int32(3))))

			_, stderr, err := kubectlToolnexus("vic", "-n", ns, "run", "purchasing", "buy a gpu")
			Expect(err).To(HaveOccurred())
			Expect(stderr).To(ContainSubstring("forbidden"))
		})
	})

	Describe("wait (timeout)", func() {
		It("gives up after --timeout, whatever the run", func() {
			newRun(ns, toolnexusv1alpha1.AgentRunStatus{Phase: toolnexusv1alpha1.RunPhaseRunning})
			_, stderr, err := kubectlToolnexus("alice", "-n", ns, "wait", "buy-gpu", "--timeout", "1s")
			Expect(err).To(HaveOccurred())
			Expect(stderr).To(Equal("Error: timed out waiting for agentruns.toolnexus.dev \"buy-gpu\" to suspend or finish\n"))
		})
	})
})

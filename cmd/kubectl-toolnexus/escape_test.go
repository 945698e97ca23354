package main_test

import (
	"encoding/json"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/runstore"
)

// hostile is what a model or a tool may write to an approver's terminal: SGR 8 hides what
// follows, OSC 52 writes the clipboard, CR overprints the line, an 8-bit CSI, and a bidi override
// that shows 0001 for 1000.
const hostile = "pay \x1b[8mhidden\x1b[0m \x1b]52;c;cm0gLXJmIC8=\x07 \r\u009b8m \u202e0001\u202c \u2066x\u2069"

// rawControls lists the sequences of hostile found raw in out.
func rawControls(out string) []string {
	var found []string
	for _, b := range []string{"\x1b", "\x07", "\r", "\u009b", "\u202e", "\u202c", "\u2066", "\u2069"} {
		if strings.Contains(out, b) {
			found = append(found, b)
		}
	}
	return found
}

var _ = Describe("What a model or a tool wrote", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("reaches the terminal escaped in show, pending, runs, wait and transcript, and reads back unchanged as JSON and YAML", func() {
		preq := &toolnexusv1alpha1.PendingRequest{
			ObjectMeta: metav1.ObjectMeta{Name: "buy-gpu-1-call-1", Namespace: ns},
			Spec: toolnexusv1alpha1.PendingRequestSpec{
				RunRef: toolnexusv1alpha1.RunReference{Name: "buy-gpu"},
				// Arguments that are no JSON are shown as they are: escaped all the same.
				ToolCall: toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "approve\u202e_purchase", Arguments: `{"amount":"` + hostile + `"`},
				Request: toolnexusv1alpha1.Request{ID: "pnd-1", Kind: "approval", Prompt: hostile + "\nsecond line",
					URL: "https://login.example.com/\x1b]52;c;eA==\x07", ExpiresAt: "2030-01-01T00:00:00Z"},
				Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice\u202e"}},
			},
		}
		Expect(admin.Create(ctx, preq)).To(Succeed())

		// The output of each command, stdout and stderr, as the person's terminal receives it.
		outputs := map[string]string{}
		run := func(user string, args ...string) {
			stdout, stderr, err := kubectlToolnexus(user, append([]string{"-n", ns}, args...)...)
			ExpectWithOffset(1, err).NotTo(HaveOccurred(), stderr)
			outputs[args[0]] = stdout + stderr
		}
		run("alice", "show", preq.Name)
		run("alice", "pending")

		By("a run whose transcript, text and condition quote the model and the tools")
		state := &loop.State{
			Messages: []loop.Message{
				{Role: loop.RoleUser, Content: hostile},
				{Role: loop.RoleAssistant, Content: hostile, ToolCalls: []loop.MessageToolCall{
					{ID: "call_1", Name: "approve_purchase", Arguments: `{"amount":"` + hostile + `"}`}}},
				{Role: loop.RoleTool, ToolCallID: "call_1", Content: hostile, IsError: true},
				{Role: loop.RoleAssistant, Content: hostile},
			},
			Turn: 2, Model: "gpt\x1b[8m", Status: loop.StatusDone, Text: hostile,
		}
		r := newRun(ns, toolnexusv1alpha1.AgentRunStatus{Phase: toolnexusv1alpha1.RunPhaseRunning})
		writeRecord(r, "buy-gpu", 0, runstore.Head{State: state})
		status := succeeded()
		status.Text = hostile
		status.TranscriptRef = &toolnexusv1alpha1.TranscriptReference{Name: "buy-gpu"}
		setRunStatus(r, status)
		run("vic", "runs")
		run("vic", "wait", "buy-gpu")
		// transcript is read by a viewer: alice only answers.
		run("vic", "transcript", "buy-gpu")

		for name, out := range outputs {
			Expect(rawControls(out)).To(BeEmpty(), "%s prints raw controls:\n%q", name, out)
		}
		Expect(outputs["show"]).To(ContainSubstring(`pay \x1b[8mhidden\x1b[0m \x1b]52;c;cm0gLXJmIC8=\x07 \r\u009b8m \u202e0001\u202c`))
		Expect(outputs["show"]).To(ContainSubstring("\n             second line\n"), "the prompt keeps its lines")
		Expect(outputs["pending"]).To(MatchRegexp(`buy-gpu-1-call-1\s+buy-gpu\s+approval\s+pay \\x1b\[8mhidden`))
		Expect(outputs["runs"]).To(ContainSubstring(`pay \x1b[8mhidden`))
		Expect(outputs["wait"]).To(ContainSubstring(`pay \x1b[8mhidden`))
		Expect(strings.Count(outputs["transcript"], `\u202e0001`)).To(BeNumerically(">=", 5))

		By("-o json and -o yaml escape the same characters, and read back as they were stored")
		for _, format := range []string{"json", "yaml"} {
			stdout, stderr, err := kubectlToolnexus("alice", "-n", ns, "show", preq.Name, "-o", format)
			Expect(err).NotTo(HaveOccurred(), stderr)
			Expect(rawControls(stdout)).To(BeEmpty(), "-o %s prints raw controls:\n%q", format, stdout)
			raw := []byte(stdout)
			if format == "yaml" {
				raw, err = yaml.YAMLToJSON(raw)
				Expect(err).NotTo(HaveOccurred(), stdout)
			}
			got := &toolnexusv1alpha1.PendingRequest{}
			Expect(json.Unmarshal(raw, got)).To(Succeed())
			Expect(got.Spec).To(Equal(preq.Spec), "-o %s", format)

			stdout, stderr, err = kubectlToolnexus("vic", "-n", ns, "transcript", "buy-gpu", "-o", format)
			Expect(err).NotTo(HaveOccurred(), stderr)
			Expect(rawControls(stdout)).To(BeEmpty(), "transcript -o %s prints raw controls:\n%q", format, stdout)
		}
	})
})

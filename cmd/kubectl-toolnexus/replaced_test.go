package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

// payRequest creates the request an approval gate of the run pay opens for its first call, named
// as the controller names it: the same name whenever the run is created again.
func payRequest(ns string, arguments string) *toolnexusv1alpha1.PendingRequest {
	preq := &toolnexusv1alpha1.PendingRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "pay-1-call-0-0", Namespace: ns, Labels: map[string]string{toolnexusv1alpha1.RunLabel: "pay"}},
		Spec: toolnexusv1alpha1.PendingRequestSpec{
			RunRef:    toolnexusv1alpha1.RunReference{Name: "pay"},
			ToolCall:  toolnexusv1alpha1.ToolCall{ID: "call-0", Name: "purchase", Arguments: arguments},
			Request:   toolnexusv1alpha1.Request{ID: "toolguard:call-0", Kind: "approval", Prompt: "Approve purchase?"},
			Approvers: approvers,
		},
	}
	ExpectWithOffset(1, admin.Create(ctx, preq)).To(Succeed())
	return preq
}

// answerCommands are the commands show printed to answer the request, one a line.
func answerCommands(shown string) []string {
	var commands []string
	for _, line := range strings.Split(shown, "\n") {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "kubectl toolnexus ") {
			commands = append(commands, line)
		}
	}
	return commands
}

// pasted runs command line as user pastes it into a shell: the shell parses it, the real kubectl
// finds kubectl-toolnexus on PATH, and the user's kubeconfig comes from KUBECONFIG.
func pasted(user, line string) (string, error) {
	assets, err := testenv.Assets()
	Expect(err).NotTo(HaveOccurred())
	cmd := exec.Command("sh", "-c", line)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfigs[user],
		"PATH="+filepath.Dir(plugin)+string(os.PathListSeparator)+assets+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

var _ = Describe("An answer bound to the request its answerer saw", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("is refused for a request deleted and created again under its name, and given to the one shown", func() {
		old := payRequest(ns, `{"amount":10}`)
		shown, stderr, err := kubectlToolnexus("alice", "-n", ns, "show", old.Name)
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(shown).To(ContainSubstring(`"amount": 10`))
		commands := answerCommands(shown)
		Expect(commands).To(HaveLen(2))
		for _, c := range commands {
			Expect(c).To(ContainSubstring(" -n " + ns + " --uid " + string(old.UID)))
		}

		By("the run's author deletes the run and creates it again; the model now asks for more")
		Expect(admin.Delete(ctx, old)).To(Succeed())
		again := payRequest(ns, `{"amount":100000}`)
		Expect(again.UID).NotTo(Equal(old.UID))

		By("alice pastes the commands show printed for the old request")
		replaced := "PendingRequest pay-1-call-0-0 was replaced since you saw it; review it with `kubectl toolnexus show pay-1-call-0-0 -n " + ns + "` and answer again"
		for _, c := range commands {
			out, err := pasted("alice", c)
			Expect(err).To(HaveOccurred(), "%s answered the new request:\n%s", c, out)
			Expect(out).To(ContainSubstring(replaced))
		}
		Expect(stored(again).Status.Answer).To(BeNil())

		By("alice reviews the new request and pastes the command show prints for it")
		shown, stderr, err = kubectlToolnexus("alice", "-n", ns, "show", again.Name)
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(shown).To(ContainSubstring(`"amount": 100000`))
		commands = answerCommands(shown)
		Expect(commands).NotTo(BeEmpty())
		Expect(commands[0]).To(HavePrefix("kubectl toolnexus approve "))
		out, err := pasted("alice", commands[0])
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(Equal("pendingrequest.toolnexus.dev/pay-1-call-0-0 approved\n"))
		got := stored(again)
		Expect(got.Status.Answer).To(Equal(&toolnexusv1alpha1.Answer{ID: "toolguard:call-0", RequestUID: string(again.UID), OK: true}))
		Expect(got.Status.AnsweredBy).To(Equal("alice"))
	})

	It("says a request deleted since it was shown is gone", func() {
		old := payRequest(ns, `{"amount":10}`)
		shown, _, err := kubectlToolnexus("alice", "-n", ns, "show", old.Name)
		Expect(err).NotTo(HaveOccurred())
		Expect(admin.Delete(ctx, old)).To(Succeed())
		out, err := pasted("alice", answerCommands(shown)[0])
		Expect(err).To(HaveOccurred())
		Expect(out).To(ContainSubstring("PendingRequest pay-1-call-0-0 was deleted since you saw it (uid " + string(old.UID) + ")"))
	})

	It("binds an answer given without --uid to the request as the plugin reads it", func() {
		preq := payRequest(ns, `{"amount":10}`)
		_, stderr, err := kubectlToolnexus("alice", "-n", ns, "decline", preq.Name, "--reason", "no")
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(stored(preq).Status.Answer).To(Equal(&toolnexusv1alpha1.Answer{ID: "toolguard:call-0", RequestUID: string(preq.UID), Reason: "no"}))
	})
})

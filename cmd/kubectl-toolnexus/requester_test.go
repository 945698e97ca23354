package main_test

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

var _ = Describe("Who requested a run", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("is the person who ran kubectl toolnexus run, stamped by the API server", func() {
		// The policies are enforced a moment after they are created: a run created before is unstamped.
		Eventually(func() (string, error) {
			stdout, stderr, err := kubectlToolnexus("erin", "-n", ns, "run", "purchasing", "buy a gpu")
			if err != nil {
				return stderr, err
			}
			run := &toolnexusv1alpha1.AgentRun{}
			name := strings.TrimSuffix(strings.TrimPrefix(stdout, "agentrun.toolnexus.dev/"), " created\n")
			err = admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, run)
			return run.Spec.RequestedBy, err
		}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Equal("erin"))
	})

	It("is shown by show, escaped like everything else", func() {
		for requester, want := range map[string]string{
			"erin":                              "Requested by: erin\n",
			"system:serviceaccount:ops:nightly": "Requested by: system:serviceaccount:ops:nightly\n",
		} {
			preq := &toolnexusv1alpha1.PendingRequest{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "buy-gpu-1-call-", Namespace: ns},
				Spec: toolnexusv1alpha1.PendingRequestSpec{
					RunRef:      toolnexusv1alpha1.RunReference{Name: "buy-gpu"},
					ToolCall:    toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "approve_purchase", Arguments: `{}`},
					Request:     toolnexusv1alpha1.Request{ID: "pnd-1", Kind: "approval", Prompt: "Approve?"},
					RequestedBy: requester,
				},
			}
			Expect(admin.Create(ctx, preq)).To(Succeed())
			stdout, stderr, err := kubectlToolnexus("alice", "-n", ns, "show", preq.Name)
			Expect(err).NotTo(HaveOccurred(), stderr)
			Expect(stdout).To(ContainSubstring("Run:         buy-gpu\n" + want))
		}

		By("a user name that holds terminal controls reaches the terminal escaped")
		preq := &toolnexusv1alpha1.PendingRequest{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "buy-gpu-1-call-", Namespace: ns},
			Spec: toolnexusv1alpha1.PendingRequestSpec{
				RunRef:      toolnexusv1alpha1.RunReference{Name: "buy-gpu"},
				ToolCall:    toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "approve_purchase", Arguments: `{}`},
				Request:     toolnexusv1alpha1.Request{ID: "pnd-1", Kind: "approval", Prompt: "Approve?"},
				RequestedBy: "mallory" + hostile,
			},
		}
		Expect(admin.Create(ctx, preq)).To(Succeed())
		stdout, stderr, err := kubectlToolnexus("alice", "-n", ns, "show", preq.Name)
		Expect(err).NotTo(HaveOccurred(), stderr)
		Expect(stdout).To(ContainSubstring("Requested by: mallory"))
		Expect(rawControls(stdout)).To(BeEmpty())
	})
})

package inbox_test

import (
	"context"
	"net/http"
	"os/exec"
	"strings"

	"github.com/chromedp/chromedp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// buttons are the values of the buttons of the page's forms, the answers it offers.
func buttons(browser context.Context) []string {
	GinkgoHelper()
	values, err := chromedp.Run(browser, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll("form[method=post] button"), b => b.value)`))
	Expect(err).NotTo(HaveOccurred())
	return values
}

var _ = Describe("The inbox's quorum", func() {
	It("adds alice's entry to a request that needs two approvals, shows 1 of 2 (alice) live, and never offers a direct answer", func() {
		ns := newNamespace()
		preq := &toolnexusv1alpha1.PendingRequest{
			ObjectMeta: metav1.ObjectMeta{Name: "deploy-prod-1-call-1", Namespace: ns},
			Spec: toolnexusv1alpha1.PendingRequestSpec{
				RunRef:    toolnexusv1alpha1.RunReference{Name: "deploy-prod"},
				ToolCall:  toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "delete_database", Arguments: `{"name":"orders"}`},
				Request:   toolnexusv1alpha1.Request{ID: "policy:prod-changes:call_1", Kind: "approval", Prompt: `Approve delete_database with {"name":"orders"}?`},
				Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice", "carol"}},
				Policy:    &toolnexusv1alpha1.PolicyReference{Name: "prod-changes", Generation: 1},
				Required:  2,
			},
		}
		Expect(admin.Create(ctx, preq)).To(Succeed())

		browser := openRequestPage("alice", preq, 1100, 800)
		Expect(text(browser, ".facts")()).To(And(ContainSubstring("prod-changes"), MatchRegexp(`Approvals needed\s+2`)))
		// The live part of the page is replaced as its stream sends it: read it when it is there.
		Eventually(text(browser, ".approvals"), eventually).Should(ContainSubstring("0 of 2; waiting for 2 more"))
		Expect(text(browser, "#actions")()).To(ContainSubstring("This request needs 2 approvals"))
		Expect(buttons(browser)).To(Equal([]string{"approve", "decline"}), "Approve and Decline add an entry; nothing answers directly")

		By("alice approves: her entry, not an answer")
		Expect(load(browser, chromedp.Click(chromedp.CSS(`button[value=approve]`)))).To(BeEquivalentTo(http.StatusOK))
		Eventually(text(browser, ".approvals"), eventually).Should(ContainSubstring("1 of 2 (alice); waiting for 1 more"))
		Eventually(text(browser, ".mine"), eventually).Should(Equal("You (alice) approved this request."))
		Expect(buttons(browser)).To(BeEmpty(), "alice has decided: the page offers her nothing more")
		got := &toolnexusv1alpha1.PendingRequest{}
		Expect(admin.Get(ctx, client.ObjectKeyFromObject(preq), got)).To(Succeed())
		Expect(got.Status.Approvals).To(HaveLen(1))
		Expect(got.Status.Approvals[0].User).To(Equal("alice"))
		Expect(got.Status.Approvals[0].OK).To(BeTrue())
		Expect(got.Status.Answer).To(BeNil(), "the manager answers a request that needs several approvals, nobody else")
		screenshot(browser, "inbox-quorum")

		By("the list shows the progress and the policy")
		Expect(load(browser, chromedp.Click(chromedp.CSS(".back a")))).To(BeEquivalentTo(http.StatusOK))
		card := `li.card[data-request="` + ns + "/" + preq.Name + `"]`
		Eventually(text(browser, card), eventually).Should(And(ContainSubstring("1 of 2 (alice)"), ContainSubstring("prod-changes")))

		By("carol approves with the plugin: alice's page shows it live")
		Expect(load(browser, chromedp.Click(chromedp.CSS(card+" a")))).To(BeEquivalentTo(http.StatusOK))
		out, err := exec.Command(plugin, "--kubeconfig", kubeconfigs["carol"], "-n", ns, "approve", preq.Name, "--uid", string(got.UID)).CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		Expect(strings.TrimSpace(string(out))).To(HaveSuffix("approved: 2 of 2 (alice, carol); the quorum is complete: the manager records the answer"))
		Eventually(text(browser, ".approvals"), eventually).Should(ContainSubstring("2 of 2 (alice, carol)"))
		Expect(admin.Get(ctx, client.ObjectKeyFromObject(preq), got)).To(Succeed())
		Expect(got.Status.Approvals).To(HaveLen(2), "carol's entry joined alice's")
	})
})

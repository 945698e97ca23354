// Package inbox_test drives `kubectl toolnexus inbox` with a real headless Chromium against a real
// API server: pkg/toolnexustest, the kit people who build on the operator use, installs
// config/rbac and config/policies and runs the manager in-process as its ServiceAccount, and
// scripts the model and the tool servers; the inbox runs as the built plugin with a person's
// kubeconfig, and the browser clicks through its pages as that person would.
//
// Chromium is Debian's chromium package (make test-unit installs it). Without it the suite fails.
// INBOX_SCREENSHOTS=docs/images (a directory, relative to the repository root) saves the pages the
// README shows.
package inbox_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
	browsertest "github.com/toolnexus/operator/internal/testenv/browser"
	"github.com/toolnexus/operator/pkg/toolnexustest"
)

const eventually = 30 * time.Second

var (
	env *toolnexustest.Env
	ctx = context.Background()
	// admin is the control plane's administrator.
	admin client.Client
	// plugin is the built kubectl-toolnexus; kubeconfigs are alice's (an answerer, the runs'
	// approver), bob's (an answerer RBAC allows, but no approver) and carol's (an answerer, the
	// second approver of a request that needs two).
	plugin      string
	kubeconfigs = map[string]string{}
)

func TestInbox(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "kubectl toolnexus inbox (envtest, headless Chromium)")
}

var _ = BeforeSuite(func() {
	var err error
	dir := GinkgoT().TempDir()
	By("building kubectl-toolnexus")
	_, err = testenv.Build(dir, "./cmd/kubectl-toolnexus")
	Expect(err).NotTo(HaveOccurred())
	plugin = filepath.Join(dir, "kubectl-toolnexus")

	By("installing config/rbac and config/policies, and running the manager")
	env = toolnexustest.Start(GinkgoT(), toolnexustest.Options{Logs: GinkgoWriter})
	admin = env.Admin
	By("granting alice, bob and carol the answerer's and the viewer's roles")
	for _, name := range []string{"alice", "bob", "carol"} {
		user := env.User(GinkgoT(), name)
		kubeconfigs[name] = user.Kubeconfig
		// Both answer (answerer) and read transcripts (viewer, which the built-in view aggregates).
		env.Grant(GinkgoT(), toolnexustest.RoleAnswerer, user)
		env.Grant(GinkgoT(), toolnexustest.RoleViewer, user)
	}

	// The policies are enforced, and discovery serves the CRDs to new clients, a moment after
	// they are created: wait until the plugin, as each person, meets both.
	By("waiting until bob is refused and alice's answer is stamped")
	ns := newNamespace()
	// bob first: once his answer is refused the rules are enforced, and they accept alice's answer
	// only with the answeredBy stamp.
	for _, probe := range [][2]string{{"bob", "user bob may not answer this request"}, {"alice", "approved"}} {
		user, want := probe[0], probe[1]
		Eventually(func() (string, error) {
			preq := &toolnexusv1alpha1.PendingRequest{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: ns},
				Spec: toolnexusv1alpha1.PendingRequestSpec{
					RunRef:    toolnexusv1alpha1.RunReference{Name: "probe"},
					ToolCall:  toolnexusv1alpha1.ToolCall{ID: "call_1", Name: "probe", Arguments: "{}"},
					Request:   toolnexusv1alpha1.Request{ID: "probe", Kind: "approval", Prompt: "Probe?"},
					Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice"}},
				},
			}
			if err := admin.Create(ctx, preq); err != nil {
				return "", err
			}
			out, _ := exec.Command(plugin, "--kubeconfig", kubeconfigs[user], "-n", ns, "approve", preq.Name).CombinedOutput()
			return string(out), nil
		}).WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(ContainSubstring(want), user)
	}
})

func newNamespace() string {
	return env.Namespace(GinkgoT(), "inbox-")
}

// startInbox runs `kubectl toolnexus -n ns inbox` as user until the spec ends and returns the URL
// it printed.
func startInbox(user, ns string) string {
	cmd := exec.Command(plugin, "--kubeconfig", kubeconfigs[user], "-n", ns, "inbox")
	cmd.Stderr = GinkgoWriter
	stdout, err := cmd.StdoutPipe()
	Expect(err).NotTo(HaveOccurred())
	Expect(cmd.Start()).To(Succeed())
	DeferCleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- strings.TrimSpace(line)
	}()
	var url string
	Eventually(lines, eventually).Should(Receive(&url))
	Expect(url).To(MatchRegexp(`^http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]{43}$`))
	return url
}

// newBrowser starts a headless Chromium for the spec with a window of width x height.
func newBrowser(width, height int) context.Context {
	browser, stop := browsertest.Start(ctx, GinkgoT(), chromedp.WindowSize(width, height))
	DeferCleanup(stop)
	Expect(chromedp.Do(browser)).To(Succeed(), "starting chromium")
	return browser
}

// run performs browser actions, bounded in time.
func run(browser context.Context, actions ...chromedp.Action[chromedp.Void]) {
	GinkgoHelper()
	c, cancel := context.WithTimeout(browser, eventually)
	defer cancel()
	Expect(chromedp.Do(c, actions...)).To(Succeed())
}

// load runs actions that load a page (a link, a form), waits for it and returns its HTTP status;
// the text of a page that is not 200 goes to the spec's output.
func load(browser context.Context, actions ...chromedp.Action[chromedp.Void]) int64 {
	GinkgoHelper()
	c, cancel := context.WithTimeout(browser, eventually)
	defer cancel()
	resp, err := chromedp.RunResponse(c, actions...)
	Expect(err).NotTo(HaveOccurred())
	if resp.Status != 200 {
		body, _ := chromedp.Run(c, chromedp.Text(chromedp.CSS("body")))
		GinkgoWriter.Printf("%s: %d %s\n", resp.URL, resp.Status, body)
	}
	return resp.Status
}

// text reads the text of the first element sel matches, for Eventually.
func text(browser context.Context, sel string) func() (string, error) {
	return func() (string, error) {
		c, cancel := context.WithTimeout(browser, 5*time.Second)
		defer cancel()
		return chromedp.Run(c, chromedp.Text(chromedp.CSS(sel)))
	}
}

// screenshot saves the page as name.png in $INBOX_SCREENSHOTS, when it is set.
func screenshot(browser context.Context, name string) {
	GinkgoHelper()
	dir := os.Getenv("INBOX_SCREENSHOTS")
	if dir == "" {
		return
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(testenv.RepoRoot(), dir)
	}
	c, cancel := context.WithTimeout(browser, eventually)
	defer cancel()
	png, err := chromedp.Run(c, chromedp.FullScreenshot(100))
	Expect(err).NotTo(HaveOccurred())
	Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
	Expect(os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644)).To(Succeed())
}

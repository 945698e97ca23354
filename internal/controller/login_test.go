package controller_test

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller/login"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/internal/testenv/oauthtest"
	"github.com/toolnexus/operator/internal/tools"
)

// callsUntilAnswered is a model that calls tool once, then says what the tool returned.
func callsUntilAnswered(tool string) *looptest.Server {
	return looptest.Serve(GinkgoT(), func(r looptest.Request) looptest.Reply {
		req, err := r.Chat()
		if err != nil {
			return looptest.OpenAIError(http.StatusBadRequest, err.Error())
		}
		last := req.Messages[len(req.Messages)-1]
		if last.Role == "tool" {
			return looptest.OpenAIText("the tool said: " + last.Text())
		}
		return looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: tool, Arguments: `{}`})
	})
}

// signedInRun is a run of requester whose only tool is the HTTP tool at toolURL, signed in with
// the authorization server's client, or, with mcp, the MCP server at toolURL.
func signedInRun(ns, name, requester, modelURL, toolURL string, as *oauthtest.AuthServer, mcp bool) *toolnexusv1alpha1.AgentRun {
	auth := &toolnexusv1alpha1.ToolAuth{OAuth: &toolnexusv1alpha1.OAuthSpec{ClientID: as.ClientID}}
	run := &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "who am I?", RequestedBy: requester, AgentSpec: toolnexusv1alpha1.AgentSpec{
			Model: toolnexusv1alpha1.ModelSpec{Name: "m", BaseURL: modelURL},
		}},
	}
	if mcp {
		run.Spec.MCPServers = []toolnexusv1alpha1.MCPServerSpec{{Name: "who", URL: toolURL, Tools: []string{oauthtest.WhoamiTool}, Auth: auth}}
	} else {
		run.Spec.Tools = []toolnexusv1alpha1.ToolSpec{{Name: "who_whoami", HTTP: &toolnexusv1alpha1.HTTPToolSpec{URL: toolURL, Auth: auth}}}
	}
	return run
}

// loginRequest waits for run to park on the operator's login and returns its request.
func loginRequest(run *toolnexusv1alpha1.AgentRun, as *oauthtest.AuthServer) toolnexusv1alpha1.PendingRequest {
	GinkgoHelper()
	reqs := waitSuspended(run, 1)
	r := reqs[0].Spec.Request
	Expect(r.Kind).To(Equal(tools.KindAuthorization))
	Expect(r.ID).To(HavePrefix(tools.LoginIDPrefix))
	Expect(r.URL).To(HavePrefix(as.AuthorizationEndpoint()), "the request's url is the real authorize URL")
	return reqs[0]
}

// signIn follows preq's link in a browser as user, and returns the page the browser ends on.
func signIn(preq toolnexusv1alpha1.PendingRequest, as *oauthtest.AuthServer, user string) (finalURL, page string) {
	GinkgoHelper()
	c, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	finalURL, page, err := oauthtest.Login(c, GinkgoT(), preq.Spec.Request.URL, user, as.Password(GinkgoT(), user))
	Expect(err).NotTo(HaveOccurred())
	Expect(finalURL).To(HavePrefix(redirectURL()), "the authorization server sent the browser to the manager's callback")
	return finalURL, page
}

// grantSecrets are the login store's grants for ns.
func grantSecrets(ns string) []corev1.Secret {
	var list corev1.SecretList
	Expect(k8sClient.List(ctx, &list, client.InNamespace(testenv.ManagerNamespace),
		client.MatchingLabels{login.KindLabel: "grant", login.NamespaceLabel: ns})).To(Succeed())
	return list.Items
}

func callback(rawURL string) (int, string) {
	GinkgoHelper()
	resp, err := http.Get(rawURL)
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	return resp.StatusCode, string(body)
}

var _ = Describe("Logins the operator completes", Ordered, func() {
	var as *oauthtest.AuthServer
	BeforeAll(func() {
		as = oauthtest.StartAuthServer(GinkgoT(), oauthtest.AuthServerOptions{RedirectURIs: []string{redirectURL()}, Iss: oauthtest.IssSent})
	})

	It("parks an MCP call on a login, finishes it from the browser with no patch, and sends the token only to its resource", func() {
		ns := newNamespace()
		res := oauthtest.StartMCPResource(GinkgoT(), as, oauthtest.ResourceOptions{})
		model := callsUntilAnswered("who_whoami")
		run := signedInRun(ns, "mcp", "erin", model.URL, res.URL, as, true)
		Expect(k8sClient.Create(ctx, run)).To(Succeed())

		preq := loginRequest(run, as)
		finalURL, page := signIn(preq, as, "alice")
		auths := as.Authorizations()
		Expect(auths).NotTo(BeEmpty())
		last := auths[len(auths)-1]
		Expect(last.CodeChallengeMethod).To(Equal("S256"))
		Expect(last.Resources).To(Equal([]string{res.URL}), "the resource indicator names the MCP server (RFC 8707)")
		Expect(last.RedirectURI).To(Equal(redirectURL()))
		Expect(page).To(ContainSubstring("You are signed in. Run " + ns + "/mcp goes on"))
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("the tool said: alice"))

		answered := requestNamed(run, preq.Name)
		Expect(answered.Status.AnsweredBy).To(Equal(toolnexusv1alpha1.OAuthAnswerer))
		Expect(answered.Status.Answer.OK).To(BeTrue())
		Expect(answered.Status.Answer.RequestUID).To(Equal(string(answered.UID)))
		Expect(res.Tokens()).NotTo(BeEmpty())
		for _, tok := range res.Tokens() {
			Expect(tok.Subject).To(Equal("alice"))
			Expect(tok.Issuer).To(Equal(as.Issuer))
			Expect(tok.Audience).To(ContainElement(res.URL))
		}
		Expect(grantSecrets(ns)).To(HaveLen(1))

		By("refusing the same callback again: the state is single use")
		status, body := callback(finalURL)
		Expect(status).To(Equal(http.StatusBadRequest))
		Expect(body).To(ContainSubstring("unknown or was used already"))
	})

	It("parks an HTTP tool's call on a login, and a second run of the same requester needs none", func() {
		ns := newNamespace()
		res := oauthtest.StartHTTPResource(GinkgoT(), as, oauthtest.ResourceOptions{})
		model := callsUntilAnswered("who_whoami")
		first := signedInRun(ns, "first", "erin", model.URL, res.URL, as, false)
		Expect(k8sClient.Create(ctx, first)).To(Succeed())
		signIn(loginRequest(first, as), as, "bob")
		Eventually(phaseOf(first), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(first).Status.Text).To(Equal("the tool said: bob"))

		second := signedInRun(ns, "second", "erin", model.URL, res.URL, as, false)
		Expect(k8sClient.Create(ctx, second)).To(Succeed())
		Eventually(phaseOf(second), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(second).Status.Text).To(Equal("the tool said: bob"))
		Expect(requestsOf(second)).To(BeEmpty(), "the stored login was used")

		By("asking another requester to sign in")
		third := signedInRun(ns, "third", "frank", model.URL, res.URL, as, false)
		Expect(k8sClient.Create(ctx, third)).To(Succeed())
		loginRequest(third, as)
		Expect(grantSecrets(ns)).To(HaveLen(1), "frank has no login yet")

		By("keeping the tokens out of status, events, requests, records, spans and logs")
		var secrets []string
		for _, tok := range res.Tokens() {
			secrets = append(secrets, tok.Raw)
		}
		secrets = append(secrets, as.Issued()...)
		Expect(secrets).NotTo(BeEmpty())
		for _, run := range []*toolnexusv1alpha1.AgentRun{first, second, third} {
			for _, hay := range haystackOf(run) {
				for _, secret := range secrets {
					Expect(hay).NotTo(ContainSubstring(secret), "a token leaked")
					Expect(hay).NotTo(ContainSubstring(base64.StdEncoding.EncodeToString([]byte(secret))), "a token leaked, base64-encoded")
				}
			}
		}
	})

	It("signs a confidential client in with its secret, never shown, and forgets a login whose Secret is deleted", func() {
		conf := oauthtest.StartAuthServer(GinkgoT(), oauthtest.AuthServerOptions{RedirectURIs: []string{redirectURL()}, Confidential: true})
		ns := newNamespace()
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "cal-oauth", Namespace: ns},
			StringData: map[string]string{"secret": conf.Secret}})).To(Succeed())
		res := oauthtest.StartHTTPResource(GinkgoT(), conf, oauthtest.ResourceOptions{})
		model := callsUntilAnswered("who_whoami")
		confidential := func(name string) *toolnexusv1alpha1.AgentRun {
			run := signedInRun(ns, name, "erin", model.URL, res.URL, conf, false)
			run.Spec.Tools[0].HTTP.Auth.OAuth.ClientSecretRef = &toolnexusv1alpha1.SecretKeyReference{Name: "cal-oauth", Key: "secret"}
			return run
		}
		first := confidential("first")
		Expect(k8sClient.Create(ctx, first)).To(Succeed())
		signIn(loginRequest(first, conf), conf, "alice")
		Eventually(phaseOf(first), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(first).Status.Text).To(Equal("the tool said: alice"))
		for _, hay := range haystackOf(first) {
			for _, secret := range conf.Issued() {
				Expect(hay).NotTo(ContainSubstring(secret), "a token or the client secret leaked")
			}
		}

		grants := grantSecrets(ns)
		Expect(grants).To(HaveLen(1))
		Expect(grants[0].Annotations).To(HaveKeyWithValue(login.ScopeAnnotation, "Requester erin"))
		Expect(k8sClient.Delete(ctx, &grants[0])).To(Succeed())
		second := confidential("second")
		Expect(k8sClient.Create(ctx, second)).To(Succeed())
		loginRequest(second, conf)
	})

	It("refuses a callback with a wrong state or another issuer, storing nothing and leaving the request open", func() {
		ns := newNamespace()
		res := oauthtest.StartHTTPResource(GinkgoT(), as, oauthtest.ResourceOptions{})
		model := callsUntilAnswered("who_whoami")
		run := signedInRun(ns, "refused", "erin", model.URL, res.URL, as, false)
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		preq := loginRequest(run, as)

		status, body := callback(redirectURL() + "?state=forged&code=whatever")
		Expect(status).To(Equal(http.StatusBadRequest))
		Expect(body).To(ContainSubstring("unknown or was used already"))

		as.SetIss(oauthtest.IssMismatched)
		_, page := signIn(preq, as, "alice")
		as.SetIss(oauthtest.IssSent)
		Expect(page).To(ContainSubstring("names the issuer"))
		Expect(page).To(ContainSubstring("RFC 9207"))
		Expect(grantSecrets(ns)).To(BeEmpty())
		Consistently(func() *toolnexusv1alpha1.Answer { return requestNamed(run, preq.Name).Status.Answer }, time.Second).Should(BeNil())

		By("completing with the same link once the issuer is right: a refused callback does not use the link up")
		signIn(preq, as, "alice")
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
	})

	It("tells the model when the resource's metadata names an authorization server it may not reach", func() {
		ns := newNamespace()
		// The harness only serves this document; nothing dials the address: the MCP SDK's
		// discovery refuses an authorization server that is neither HTTPS nor loopback.
		res := oauthtest.StartHTTPResource(GinkgoT(), as, oauthtest.ResourceOptions{AuthorizationServers: []string{"http://169.254.169.254"}})
		model := callsUntilAnswered("who_whoami")
		run := signedInRun(ns, "linklocal", "erin", model.URL, res.URL, as, false)
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(ContainSubstring("signing in"))
		Expect(getRun(run).Status.Text).To(ContainSubstring("169.254.169.254"))
		Expect(requestsOf(run)).To(BeEmpty())
	})

	It("refuses an authorization server whose metadata redirects to another origin", func() {
		ns := newNamespace()
		elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, as.Issuer+r.URL.Path, http.StatusFound)
		}))
		DeferCleanup(elsewhere.Close)
		res := oauthtest.StartHTTPResource(GinkgoT(), as, oauthtest.ResourceOptions{AuthorizationServers: []string{elsewhere.URL}})
		model := callsUntilAnswered("who_whoami")
		run := signedInRun(ns, "redirected", "erin", model.URL, res.URL, as, false)
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(ContainSubstring("signing in"))
		Expect(requestsOf(run)).To(BeEmpty())
	})
})

var _ = Describe("A login's tokens expire", Ordered, func() {
	It("refreshes an expired token without a person, and parks on a new login once the refresh is refused", func() {
		// Access tokens of two seconds are always within the manager's refresh margin.
		as := oauthtest.StartAuthServer(GinkgoT(), oauthtest.AuthServerOptions{RedirectURIs: []string{redirectURL()},
			AccessTokenLifetime: 2 * time.Second})
		ns := newNamespace()
		res := oauthtest.StartHTTPResource(GinkgoT(), as, oauthtest.ResourceOptions{})
		model := callsUntilAnswered("who_whoami")
		first := signedInRun(ns, "first", "erin", model.URL, res.URL, as, false)
		Expect(k8sClient.Create(ctx, first)).To(Succeed())
		signIn(loginRequest(first, as), as, "alice")
		Eventually(phaseOf(first), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))

		refreshed := as.Grants(oidc.GrantTypeRefreshToken).OK
		second := signedInRun(ns, "second", "erin", model.URL, res.URL, as, false)
		Expect(k8sClient.Create(ctx, second)).To(Succeed())
		Eventually(phaseOf(second), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(requestsOf(second)).To(BeEmpty())
		Expect(as.Grants(oidc.GrantTypeRefreshToken).OK).To(BeNumerically(">", refreshed), "the token was refreshed")

		Expect(as.RevokeRefresh("alice")).To(BeNumerically(">", 0))
		third := signedInRun(ns, "third", "erin", model.URL, res.URL, as, false)
		Expect(k8sClient.Create(ctx, third)).To(Succeed())
		loginRequest(third, as)
		Expect(grantSecrets(ns)).To(BeEmpty(), "the refused refresh forgot the login")
	})
})

package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/internal/tools"
)

func TestLoopbackAddress(t *testing.T) {
	for address, want := range map[string]string{
		"127.0.0.1:0":    "127.0.0.1:0",
		"localhost:8400": "127.0.0.1:8400",
		"[::1]:8400":     "[::1]:8400",
		"127.0.0.2:80":   "127.0.0.2:80",
		"0.0.0.0:8400":   "",
		":8400":          "",
		"10.0.0.1:8400":  "",
		"example.com:80": "",
		"127.0.0.1":      "",
	} {
		got, err := loopbackAddress(address)
		if want == "" {
			if err == nil {
				t.Errorf("loopbackAddress(%q) = %q, want an error", address, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("loopbackAddress(%q) = %q, %v; want %q", address, got, err, want)
		}
	}
}

// guarded serves a handler that answers "ok" behind the guard of an inbox bound to 127.0.0.1:8400.
func guarded() (*guard, *int) {
	reached := new(int)
	return &guard{host: "127.0.0.1:8400", token: "s3cret", next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*reached++
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})}, reached
}

func TestGuard(t *testing.T) {
	cookie := &http.Cookie{Name: "toolnexus_inbox_8400", Value: "s3cret"}
	form := "action=approve"
	for _, tc := range []struct {
		name           string
		method, target string
		host, origin   string
		cookie         *http.Cookie
		body           string
		want           int
	}{
		{name: "the page with the cookie", method: "GET", target: "/", host: "127.0.0.1:8400", cookie: cookie, want: 200},
		{name: "no token", method: "GET", target: "/", host: "127.0.0.1:8400", want: 403},
		{name: "a wrong cookie", method: "GET", target: "/", host: "127.0.0.1:8400", cookie: &http.Cookie{Name: "toolnexus_inbox_8400", Value: "guess"}, want: 403},
		{name: "the cookie of another port's inbox", method: "GET", target: "/", host: "127.0.0.1:8400", cookie: &http.Cookie{Name: "toolnexus_inbox_8401", Value: "s3cret"}, want: 403},
		{name: "a wrong token in the URL", method: "GET", target: "/?token=guess", host: "127.0.0.1:8400", want: 403},
		{name: "DNS rebinding: another name for 127.0.0.1", method: "GET", target: "/?token=s3cret", host: "attacker.example:8400", cookie: cookie, want: 421},
		{name: "localhost is not the bound address", method: "GET", target: "/", host: "localhost:8400", cookie: cookie, want: 421},
		{name: "another port", method: "GET", target: "/", host: "127.0.0.1:8401", cookie: cookie, want: 421},
		{name: "an answer from the inbox's page", method: "POST", target: "/requests/ns/r", host: "127.0.0.1:8400", origin: "http://127.0.0.1:8400", cookie: cookie, body: form, want: 200},
		{name: "CSRF: an answer from another site", method: "POST", target: "/requests/ns/r", host: "127.0.0.1:8400", origin: "http://attacker.example", cookie: cookie, body: form, want: 403},
		{name: "an answer without Origin", method: "POST", target: "/requests/ns/r", host: "127.0.0.1:8400", cookie: cookie, body: form, want: 403},
		{name: "an answer with Origin but no token", method: "POST", target: "/requests/ns/r", host: "127.0.0.1:8400", origin: "http://127.0.0.1:8400", body: form, want: 403},
		{name: "a token in the URL does not answer", method: "POST", target: "/requests/ns/r?token=s3cret", host: "127.0.0.1:8400", origin: "http://127.0.0.1:8400", body: form, want: 403},
		{name: "an oversized body", method: "POST", target: "/requests/ns/r", host: "127.0.0.1:8400", origin: "http://127.0.0.1:8400", cookie: cookie, body: "reason=" + strings.Repeat("x", maxInboxBody), want: 413},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, reached := guarded()
			r := httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body))
			r.Host = tc.host
			if tc.origin != "" {
				r.Header.Set("Origin", tc.origin)
			}
			if tc.cookie != nil {
				r.AddCookie(tc.cookie)
			}
			if tc.body != "" {
				r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			}
			w := httptest.NewRecorder()
			g.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.want, w.Body)
			}
			if (tc.want == 200) != (*reached == 1) {
				t.Errorf("the handler was reached %d times with status %d", *reached, w.Code)
			}
			for _, h := range []string{"Content-Security-Policy", "X-Frame-Options", "Referrer-Policy"} {
				if w.Header().Get(h) == "" {
					t.Errorf("response without %s", h)
				}
			}
		})
	}
}

// The token in the printed URL becomes a cookie the page's scripts cannot read and other sites
// never send, and leaves the address bar.
func TestGuardMovesTheTokenIntoACookie(t *testing.T) {
	g, reached := guarded()
	r := httptest.NewRequest("GET", "/requests/ns/r?token=s3cret&x=1", nil)
	r.Host = "127.0.0.1:8400"
	w := httptest.NewRecorder()
	g.ServeHTTP(w, r)
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/requests/ns/r?x=1" || *reached != 0 {
		t.Fatalf("status %d, Location %q, reached %d", w.Code, w.Header().Get("Location"), *reached)
	}
	cookies := w.Result().Cookies()
	if len(cookies) != 1 {
		t.Fatalf("cookies %v", cookies)
	}
	c := cookies[0]
	if c.Name != "toolnexus_inbox_8400" || c.Value != "s3cret" || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" {
		t.Errorf("cookie %+v: want toolnexus_inbox_8400=s3cret, HttpOnly, SameSite=Strict, Path=/", c)
	}
}

func request(kind, data string) *toolnexusv1alpha1.PendingRequest {
	pr := &toolnexusv1alpha1.PendingRequest{}
	pr.Spec.Request.Kind = kind
	if data != "" {
		pr.Spec.Request.Data = &apiextensionsv1.JSON{Raw: []byte(data)}
	}
	return pr
}

const deploySchema = `{"schema":{"type":"object","properties":{
	"env":{"type":"string","title":"Environment","enum":["staging","production"],"enumNames":["Staging","Production"]},
	"replicas":{"type":"integer","minimum":1,"maximum":10},
	"ratio":{"type":"number"},
	"notify":{"type":"boolean","default":true},
	"owner":{"type":"string","format":"email","description":"Who to tell"},
	"tier":{"type":"string","oneOf":[{"const":"gold","title":"Gold"},{"const":"free"}]}},
	"required":["env","replicas"]}}`

func TestFormFields(t *testing.T) {
	fields, err := formFields(dataOf(request("input", deploySchema)).Schema)
	if err != nil {
		t.Fatal(err)
	}
	want := []formField{
		{Name: "env", Label: "Environment", Type: "string", Input: "select", Required: true,
			Options: []formOption{{"staging", "Staging"}, {"production", "Production"}}},
		{Name: "replicas", Label: "replicas", Type: "integer", Input: "number", Required: true, Min: "1", Max: "10"},
		{Name: "ratio", Label: "ratio", Type: "number", Input: "number"},
		{Name: "notify", Label: "notify", Type: "boolean", Input: "checkbox", Default: "true"},
		{Name: "owner", Label: "owner", Description: "Who to tell", Type: "string", Input: "email"},
		{Name: "tier", Label: "tier", Type: "string", Input: "select", Options: []formOption{{"gold", "Gold"}, {"free", "free"}}},
	}
	if diff := cmp.Diff(want, fields); diff != "" {
		t.Errorf("fields (-want +got):\n%s", diff)
	}
	for _, schema := range []string{
		`{"type":"object","properties":{"tags":{"type":"array","items":{"type":"string"}}}}`,
		`{"type":"object","properties":{}}`,
		`{"type":"string"}`,
	} {
		if _, err := formFields([]byte(schema)); err == nil {
			t.Errorf("formFields(%s): want an error, the form cannot show it", schema)
		}
	}
}

func TestAnswerFromForm(t *testing.T) {
	questions := `{"questions":[{"question":"Pick a color?","options":["red","green"]},{"question":"Sizes?","options":["S","M","L"],"multiple":true},{"question":"Why?"}]}`
	for _, tc := range []struct {
		name    string
		pr      *toolnexusv1alpha1.PendingRequest
		form    url.Values
		want    string // the answer as JSON
		wantErr string
	}{
		{name: "approve", pr: request("approval", ""), form: url.Values{"action": {"approve"}}, want: `{"ok":true}`},
		{name: "signed in", pr: request("authorization", ""), form: url.Values{"action": {"signed-in"}}, want: `{"ok":true}`},
		{name: "decline with a reason", pr: request("approval", ""), form: url.Values{"action": {"decline"}, "reason": {" over budget "}}, want: `{"ok":false,"reason":"over budget"}`},
		{name: "decline without a reason", pr: request("approval", ""), form: url.Values{"action": {"decline"}, "reason": {""}}, want: `{"ok":false,"reason":"declined"}`},
		{name: "text input", pr: request("input", ""), form: url.Values{"action": {"output"}, "output": {"staging"}}, want: `{"ok":true,"data":{"output":"staging"}}`},
		{name: "form", pr: request("input", deploySchema),
			form: url.Values{"action": {"form"}, "f.env": {"staging"}, "f.replicas": {"3"}, "f.ratio": {"0.5"}, "f.notify": {"true"}, "f.owner": {""}},
			want: `{"ok":true,"data":{"env":"staging","notify":true,"ratio":0.5,"replicas":3}}`},
		{name: "form: an unchecked box is false", pr: request("input", deploySchema),
			form: url.Values{"action": {"form"}, "f.env": {"production"}, "f.replicas": {"1"}},
			want: `{"ok":true,"data":{"env":"production","notify":false,"replicas":1}}`},
		{name: "form: required fields missing", pr: request("input", deploySchema), form: url.Values{"action": {"form"}},
			wantErr: "Environment is required; replicas is required"},
		{name: "form: wrong types and choices", pr: request("input", deploySchema),
			form:    url.Values{"action": {"form"}, "f.env": {"prod"}, "f.replicas": {"2.5"}, "f.ratio": {"half"}},
			wantErr: "Environment must be one of the choices; replicas must be a whole number; ratio must be a number"},
		{name: "questions", pr: request("question", questions),
			form: url.Values{"action": {"question"}, "q.0": {"red"}, "q.1": {"S", "L"}, "q.2": {"because"}},
			want: `{"ok":true,"data":{"answers":[{"answer":"red","question":"Pick a color?"},{"answer":["S","L"],"question":"Sizes?"},{"answer":"because","question":"Why?"}]}}`},
		{name: "a question left out", pr: request("question", questions), form: url.Values{"action": {"question"}, "q.0": {"red"}, "q.2": {"x"}},
			wantErr: `answer every question: "Sizes?" has no answer`},
		{name: "JSON data", pr: request("tool_call", ""), form: url.Values{"action": {"data"}, "data": {`{"results":[]}`}}, want: `{"ok":true,"data":{"results":[]}}`},
		{name: "JSON data that is no object", pr: request("tool_call", ""), form: url.Values{"action": {"data"}, "data": {`[1]`}}, wantErr: "the data must be a JSON object"},
		{name: "an unknown action", pr: request("approval", ""), form: url.Values{"action": {"delete"}}, wantErr: `unknown action "delete"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ans, err := answerFromForm(tc.pr, tc.form)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			raw, err := json.Marshal(ans)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(raw); got != tc.want {
				t.Errorf("answer %s, want %s", got, tc.want)
			}
		})
	}
}

// What a request holds comes from a model or a tool server: the page shows it as text, and a
// sign-in link that is no web address does not run.
func TestRequestPageEscapes(t *testing.T) {
	pr := request("authorization", "")
	pr.Name, pr.Namespace = "r", "ns"
	pr.Spec.Request.Prompt = `<script>alert("prompt")</script>`
	pr.Spec.Request.URL = `javascript:alert("url")`
	v := requestView{Key: client.ObjectKey{Namespace: "ns", Name: "r"}, Request: pr, Open: true, Offer: true}
	var b strings.Builder
	if err := inboxTemplates.ExecuteTemplate(&b, "request.html", v); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, bad := range []string{`<script>alert`, `href="javascript:`} {
		if strings.Contains(page, bad) {
			t.Errorf("the page holds %s", bad)
		}
	}
	for _, want := range []string{`&lt;script&gt;alert(&#34;prompt&#34;)&lt;/script&gt;`, `href="#ZgotmplZ"`, `value="signed-in"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the page does not hold %s", want)
		}
	}
}

// A login the operator completes: the page shows the link and whose login it becomes, offers
// only to decline, and once the operator answered says the sign-in completed.
func TestRequestPageOfALogin(t *testing.T) {
	pr := request("authorization", `{"issuer":"https://as.example.com","tokenScope":"Requester erin"}`)
	pr.Name, pr.Namespace = "r", "ns"
	pr.Spec.Request.ID, pr.Spec.Request.URL = tools.LoginIDPrefix+"3f2a", "https://as.example.com/authorize?state=s"
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	render := func(pr *toolnexusv1alpha1.PendingRequest) string {
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pr).WithStatusSubresource(pr).Build()
		in := newInbox(&options{client: c}, c, "")
		var b strings.Builder
		if err := inboxTemplates.ExecuteTemplate(&b, "request.html", in.requestView(t.Context(), client.ObjectKeyFromObject(pr), "")); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	page := render(pr)
	for _, want := range []string{`href="https://as.example.com/authorize?state=s"`, "The operator completes this request itself", "(Requester erin)", `value="decline"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the login's page does not hold %s", want)
		}
	}
	if strings.Contains(page, `value="signed-in"`) {
		t.Error("the login's page offers \"I have signed in\": only signing in answers it")
	}

	done := pr.DeepCopy()
	done.Status.Answer = &toolnexusv1alpha1.Answer{ID: pr.Spec.Request.ID, OK: true}
	done.Status.AnsweredBy = toolnexusv1alpha1.OAuthAnswerer
	if page := render(done); !strings.Contains(page, "Sign-in completed") {
		t.Errorf("the answered login's page does not say the sign-in completed:\n%s", page)
	}
}

// A page is read like a terminal: a bidi override in a prompt, a tool's name or a question
// reorders what the approver reads, and a control is shown, not passed on.
func TestRequestPageShowsControlsAndBidiEscaped(t *testing.T) {
	pr := request("question", `{"questions":[{"question":"Pay \u202e0001?","header":"\u2066h","options":["yes \u202e","no"]}]}`)
	pr.Name, pr.Namespace = "r", "ns"
	pr.Spec.Request.Prompt = "Approve \x1b[8mhidden\x1b[0m \u202e0001 \u009b"
	pr.Spec.ToolCall.Name = "pay\u202e"
	pr.Spec.ToolCall.Arguments = `{"amount":"\u202e0001"}`
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pr).Build()
	in := newInbox(&options{client: c}, c, "")
	v := in.requestView(t.Context(), client.ObjectKeyFromObject(pr), "")
	if v.Request == nil {
		t.Fatalf("the request is missing: %s", v.Missing)
	}
	var b strings.Builder
	if err := inboxTemplates.ExecuteTemplate(&b, "request.html", v); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	// The option is sent back as the tool offered it; everything the page shows is escaped.
	page = strings.Replace(page, `value="yes `+"\u202e"+`"`, `value="yes"`, 1)
	for _, bad := range []string{"\x1b", "\u202e", "\u2066", "\u009b"} {
		if strings.Contains(page, bad) {
			t.Errorf("the page holds %q raw", bad)
		}
	}
	for _, want := range []string{`Approve \x1b[8mhidden\x1b[0m \u202e0001 \u009b`, `pay\u202e`, `Pay \u202e0001?`, `yes \u202e`, `&#34;\u202e0001&#34;`} {
		if !strings.Contains(page, want) {
			t.Errorf("the page does not show %s", want)
		}
	}
}

// An inbox started with -n serves the requests of that namespace only, whatever the URL says.
func TestInboxKeepsToItsNamespace(t *testing.T) {
	h := newInbox(&options{}, nil, "team-a").routes()
	for _, r := range []*http.Request{
		httptest.NewRequest("GET", "/requests/team-b/r", nil),
		httptest.NewRequest("GET", "/requests/team-b/r/events", nil),
		httptest.NewRequest("POST", "/requests/team-b/r", strings.NewReader("action=approve")),
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusNotFound || !strings.Contains(w.Body.String(), "namespace team-a only") {
			t.Errorf("%s %s: status %d %q, want 404", r.Method, r.URL, w.Code, w.Body)
		}
	}
}

// A request's live page hears of any run of its namespace until a render has named its run (a run
// that ends while the first render reads it must not go unseen), then only of its own run.
func TestRequestFilter(t *testing.T) {
	f := &requestFilter{key: client.ObjectKey{Namespace: "team", Name: "buy-1-call-1"}}
	run := func(ns, name string) client.Object {
		r := &toolnexusv1alpha1.AgentRun{}
		r.Namespace, r.Name = ns, name
		return r
	}
	request := func(ns, name string) client.Object {
		p := &toolnexusv1alpha1.PendingRequest{}
		p.Namespace, p.Name = ns, name
		return p
	}
	check := func(when string, obj client.Object, want bool) {
		t.Helper()
		if got := f.wants(obj); got != want {
			t.Errorf("%s: wants %s/%s = %v, want %v", when, obj.GetNamespace(), obj.GetName(), got, want)
		}
	}
	check("before the first render", run("team", "buy"), true)
	check("before the first render", run("other", "buy"), false)
	check("before the first render", request("team", "buy-1-call-1"), true)
	check("before the first render", request("team", "sell-1-call-1"), false)
	f.named("buy")
	check("once named", run("team", "buy"), true)
	check("once named", run("team", "sell"), false)
}

// A page answers the request it showed: a request of the same name opened since (its run deleted
// and created again) is not answered by a form of the old page.
func TestAnswerNeedsTheRequestThePageShowed(t *testing.T) {
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	pr := request("approval", "")
	pr.Namespace, pr.Name, pr.UID = "team", "buy-1-call-1", "the-new-one"
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pr).WithStatusSubresource(pr).Build()
	h := newInbox(&options{client: c}, c, "").routes()
	post := func(uid string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/requests/team/buy-1-call-1", strings.NewReader("action=approve&uid="+uid))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	answer := func() *toolnexusv1alpha1.Answer {
		got := &toolnexusv1alpha1.PendingRequest{}
		if err := c.Get(t.Context(), client.ObjectKeyFromObject(pr), got); err != nil {
			t.Fatal(err)
		}
		return got.Status.Answer
	}
	if w := post("the-old-one"); w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "another request of this name") {
		t.Fatalf("answering from the old page: %d %q, want 409", w.Code, w.Body)
	}
	if a := answer(); a != nil {
		t.Fatalf("the new request was answered from the old page: %+v", a)
	}
	if w := post("the-new-one"); w.Code != http.StatusSeeOther {
		t.Fatalf("answering from its own page: %d %q, want 303", w.Code, w.Body)
	}
	// The patch binds the answer to the object the page showed, for the API server to check too.
	if a := answer(); a == nil || !a.OK || a.RequestUID != "the-new-one" {
		t.Fatalf("the request's answer is %+v, want ok: true bound to uid the-new-one", a)
	}
}

// A request of a run a sub-agent call created is shown with the path from the root run, in the
// list and on its page.
func TestInboxShowsASubAgentsPath(t *testing.T) {
	pr := request("approval", "")
	pr.Name, pr.Namespace = "r", "ns"
	pr.Annotations = map[string]string{toolnexusv1alpha1.RunPathAnnotation: "lab-order/buy-gpu"}
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pr).Build()
	in := newInbox(&options{client: c}, c, "")
	if row := in.row(pr); row.Run != "lab-order → buy-gpu" {
		t.Errorf("the list shows the run as %q, want the path from the root", row.Run)
	}
	v := in.requestView(t.Context(), client.ObjectKeyFromObject(pr), "")
	var b strings.Builder
	if err := inboxTemplates.ExecuteTemplate(&b, "request.html", v); err != nil {
		t.Fatal(err)
	}
	if page := b.String(); !strings.Contains(page, "<dt>Run</dt><dd>lab-order → buy-gpu</dd>") {
		t.Errorf("the page does not show the path:\n%s", page)
	}
}

package main

import (
	"context"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/notify"
	"github.com/toolnexus/operator/internal/tools"
)

// requestRow is what the list shows of an open request, as text that shows what it holds: a
// bidi override in a prompt or arguments would reorder the page as it does a terminal, so the
// fields are escaped as the plugin's printers escape them (html/template then escapes HTML).
type requestRow struct {
	Namespace, Name, Run, Kind, Prompt, Tool, Arguments, Approvers, Age, Expires, Href string
	// Approvals is the progress of a request that needs several ("1 of 2 (alice)"), else empty;
	// Policy names the ApprovalPolicy whose gate the request is.
	Approvals, Policy string
}

// maxListRows bounds the list: it is rendered again on every change of a request.
const maxListRows = 200

// list is what the list shows: the open requests (at most maxListRows, More says how many are
// left out), or the error that kept it from reading them.
func (in *inbox) list(ctx context.Context) map[string]any {
	list := &toolnexusv1alpha1.PendingRequestList{}
	if err := in.objects.List(ctx, list, client.InNamespace(in.namespace)); err != nil {
		return map[string]any{"Error": err.Error()}
	}
	open := openRequests(list.Items)
	more := max(0, len(open)-maxListRows)
	rows := make([]requestRow, len(open)-more)
	for i := range rows {
		rows[i] = in.row(open[i])
	}
	return map[string]any{"Rows": rows, "More": more}
}

func (in *inbox) row(pr *toolnexusv1alpha1.PendingRequest) requestRow {
	now := in.now()
	l := notify.PrintableLine
	var approvals, policy string
	if needsQuorum(pr) {
		approvals = tallyOf(pr).String()
	}
	if p := pr.Spec.Policy; p != nil {
		policy = l(p.Name)
	}
	return requestRow{
		Approvals: approvals, Policy: policy,
		Namespace: pr.Namespace, Name: pr.Name, Run: l(runShown(pr)), Kind: l(pr.Spec.Request.Kind),
		Prompt: l(oneLine(pr.Spec.Request.Prompt, 200)), Tool: l(pr.Spec.ToolCall.Name), Arguments: l(oneLine(pr.Spec.ToolCall.Arguments, 120)),
		Approvers: l(approversText(pr.Spec.Approvers)), Age: age(pr.CreationTimestamp, now),
		Expires: l(expiresText(pr.Spec.Request.ExpiresAt, now)),
		Href:    "/requests/" + pr.Namespace + "/" + pr.Name,
	}
}

// approversText says who may answer, as the API server's rules decide it.
func approversText(a *toolnexusv1alpha1.Approvers) string {
	if a == nil || len(a.Users)+len(a.Groups) == 0 {
		return "anyone RBAC allows to answer"
	}
	who := append([]string{}, a.Users...)
	for _, g := range a.Groups {
		who = append(who, "group "+g)
	}
	return strings.Join(who, ", ")
}

func expiresText(at string, now time.Time) string {
	if at == "" {
		return "never"
	}
	t, err := time.Parse(time.RFC3339, at)
	if err != nil {
		return at
	}
	if !t.After(now) {
		return "now"
	}
	return "in " + duration.HumanDuration(t.Sub(now))
}

// requestView is what a request's page shows.
type requestView struct {
	Key     client.ObjectKey
	Error   string // what went wrong with the last action, as the API server said it
	Missing string // why the request cannot be shown

	Request   *toolnexusv1alpha1.PendingRequest
	Row       requestRow
	Arguments string
	Data      string
	Open      bool
	// Offer is whether the page offers to answer: the request is open and, when it needs
	// several approvals, neither the user's entry nor the others' decide it yet.
	Offer      bool
	Answer     string
	AnsweredBy string
	AnsweredAt string
	// Login is set for a login the operator completes itself once the person signs in (SPEC
	// §12), and SignedIn once it did.
	Login, SignedIn bool
	LoginScope      string

	// Quorum is set for a request that needs several approvals: Progress says how far it is,
	// Entries are the approvers' entries, Mine the user's own, said in a sentence.
	Quorum   bool
	Progress string
	Entries  []entryView
	Mine     string

	Fields    []formField // the form of an MCP elicitation
	FormError string      // why the schema is offered as JSON instead
	Questions []tools.Question

	Run          *toolnexusv1alpha1.AgentRun
	RunPhase     string
	RunReason    string
	Transcript   string
	RunReadError string
}

// requestView reads the request, its run and the run's transcript from the API server.
func (in *inbox) requestView(ctx context.Context, key client.ObjectKey, errMsg string) requestView {
	v := requestView{Key: key, Error: errMsg}
	pr := &toolnexusv1alpha1.PendingRequest{}
	if err := in.o.client.Get(ctx, key, pr); err != nil {
		v.Missing = err.Error()
		return v
	}
	v.Request, v.Row, v.Open = pr, in.row(pr), isOpen(pr)
	v.Offer = v.Open
	if needsQuorum(pr) {
		in.quorumView(ctx, &v)
	}
	v.Arguments = notify.Printable(prettyJSON(pr.Spec.ToolCall.Arguments, ""))
	if d := pr.Spec.Request.Data; d != nil && len(d.Raw) > 0 && string(d.Raw) != "{}" {
		v.Data = notify.Printable(prettyJSON(string(d.Raw), ""))
	}
	v.Login = operatorLogin(pr)
	v.SignedIn = v.Login && pr.Status.AnsweredBy == toolnexusv1alpha1.OAuthAnswerer && pr.Status.Answer != nil && pr.Status.Answer.OK
	if a := pr.Status.Answer; a != nil {
		v.Answer, v.AnsweredBy = notify.PrintableLine(describeAnswer(a)), notify.PrintableLine(orUnknown(pr.Status.AnsweredBy))
		if pr.Status.AnsweredAt != nil {
			v.AnsweredAt = pr.Status.AnsweredAt.UTC().Format(time.RFC3339)
		}
	}
	data := dataOf(pr)
	if v.Login {
		v.LoginScope = notify.PrintableLine(data.TokenScope)
	}
	if len(data.Schema) > 0 {
		var err error
		if v.Fields, err = formFields(data.Schema); err != nil {
			v.FormError = err.Error()
		}
	}
	v.Questions = data.Questions

	run := &toolnexusv1alpha1.AgentRun{}
	if err := in.o.client.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: pr.Spec.RunRef.Name}, run); err != nil {
		v.RunReadError = err.Error()
		return v
	}
	v.Run, v.RunPhase = run, runPhase(run)
	if c := meta.FindStatusCondition(run.Status.Conditions, toolnexusv1alpha1.ConditionSucceeded); c != nil && c.Status == metav1.ConditionFalse {
		v.RunReason = notify.Printable(c.Reason + ": " + c.Message)
	}
	st, err := in.o.loadTranscript(ctx, run)
	if err != nil {
		v.RunReadError = err.Error()
		return v
	}
	var b strings.Builder
	if err := printTranscript(&b, run, st); err != nil {
		v.RunReadError = err.Error()
	}
	v.Transcript = notify.Printable(b.String())
	return v
}

// entryView is one approver's entry as the page shows it.
type entryView struct{ User, Verb, At, Reason string }

// quorumView fills in what the page shows of a request that needs several approvals: the
// progress, the entries, and whether the user has decided; the page offers Approve and Decline
// only while the user may still add an entry that counts.
func (in *inbox) quorumView(ctx context.Context, v *requestView) {
	pr := v.Request
	t := tallyOf(pr)
	v.Quorum, v.Progress = true, t.String()
	if v.Open {
		v.Progress = t.summary()
	}
	for _, e := range pr.Status.Approvals {
		ev := entryView{User: notify.PrintableLine(e.User), Verb: entryVerb(e), Reason: notify.PrintableLine(e.Reason)}
		if e.At != nil {
			ev.At = e.At.UTC().Format(time.RFC3339)
		}
		v.Entries = append(v.Entries, ev)
	}
	// Who the user is decides only what is offered: the API server checks the entry it is sent.
	if user, err := in.o.username(ctx); err == nil {
		if mine := entryOf(pr, user); mine != nil {
			v.Mine = notify.PrintableLine("You (" + user + ") " + entryVerb(*mine) + " this request.")
		}
	}
	v.Offer = v.Open && v.Mine == "" && !t.decided()
}

package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/notify"
	"github.com/toolnexus/operator/internal/tools"
)

// isOpen reports whether a request still waits for an answer.
func isOpen(pr *toolnexusv1alpha1.PendingRequest) bool {
	return pr.Status.Answer == nil && pr.Status.Phase != toolnexusv1alpha1.RequestPhaseCancelled
}

// runShown is the run a request belongs to, as a person reads it: for a run a sub-agent call
// created, the path from the root run, root → child, since the root is what they started.
func runShown(pr *toolnexusv1alpha1.PendingRequest) string {
	if path := pr.RunPath(); len(path) > 1 {
		return notify.PathText(path)
	}
	return pr.Spec.RunRef.Name
}

// openRequests are the open ones of items, by namespace and then oldest first.
func openRequests(items []toolnexusv1alpha1.PendingRequest) []*toolnexusv1alpha1.PendingRequest {
	var open []*toolnexusv1alpha1.PendingRequest
	for i := range items {
		if isOpen(&items[i]) {
			open = append(open, &items[i])
		}
	}
	sort.SliceStable(open, func(i, j int) bool {
		if open[i].Namespace != open[j].Namespace {
			return open[i].Namespace < open[j].Namespace
		}
		return open[i].CreationTimestamp.Before(&open[j].CreationTimestamp)
	})
	return open
}

func newPendingCommand(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pending",
		Short: "List the PendingRequests that wait for an answer",
		Long: `List the open PendingRequests: those without status.answer that were not cancelled.
Answered, expired and cancelled requests are left out; kubectl get preq lists them all. Review one
with kubectl toolnexus show NAME before answering it: it shows the tool call and its arguments, and
prints the commands that answer that request and no other one opened under its name later.
A request of a run that a sub-agent call created shows, as its RUN, the path from the run that
started it all: root → child.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.runPending(cmd.Context())
		},
	}
	o.addListFlags(cmd)
	return cmd
}

func (o *options) runPending(ctx context.Context) error {
	list := &toolnexusv1alpha1.PendingRequestList{}
	if err := o.client.List(ctx, list, client.InNamespace(o.listNamespace())); err != nil {
		return err
	}
	open := openRequests(list.Items)
	if o.output != "" {
		objs := make([]client.Object, len(open))
		for i, pr := range open {
			objs[i] = pr
		}
		return o.printList(objs)
	}
	if len(open) == 0 {
		if o.allNamespaces {
			fmt.Fprintln(o.errOut, "No open PendingRequests found.")
		} else {
			fmt.Fprintf(o.errOut, "No open PendingRequests found in %s namespace.\n", o.namespace)
		}
		return nil
	}
	header := []string{"NAME", "RUN", "KIND", "PROMPT", "URL", "AGE"}
	// Requests that need several approvals add their progress and policy; a list without one
	// keeps the columns it always had.
	quorum := slices.ContainsFunc(open, needsQuorum)
	if quorum {
		header = slices.Insert(header, 3, "APPROVALS", "POLICY")
	}
	if o.allNamespaces {
		header = append([]string{"NAMESPACE"}, header...)
	}
	t := newTable(o.out, header...)
	now := time.Now()
	for _, pr := range open {
		url := pr.Spec.Request.URL
		if url == "" {
			url = "<none>"
		}
		row := []string{pr.Name, runShown(pr), pr.Spec.Request.Kind, oneLine(pr.Spec.Request.Prompt, 60), url, age(pr.CreationTimestamp, now)}
		if quorum {
			approvals, policy := "<none>", "<none>"
			if needsQuorum(pr) {
				approvals = tallyOf(pr).String()
			}
			if p := pr.Spec.Policy; p != nil {
				policy = p.Name
			}
			row = slices.Insert(row, 3, approvals, policy)
		}
		if o.allNamespaces {
			row = append([]string{pr.Namespace}, row...)
		}
		t.row(row...)
	}
	return t.flush()
}

func newShowCommand(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "show NAME",
		Short: "Show a PendingRequest: what it asks, who may answer, the tool call, and the answer",
		Long: `Show a PendingRequest: what it asks, who may answer, the tool call with its arguments, and
the answer. An open request is shown with its uid and the commands that answer it, bound to that
uid: pasted, they answer the request shown here and are refused for one opened under the same
name since.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.runShow(cmd.Context(), args[0])
		},
	}
	o.addOutputFlag(cmd)
	return cmd
}

func (o *options) runShow(ctx context.Context, name string) error {
	pr := &toolnexusv1alpha1.PendingRequest{}
	if err := o.client.Get(ctx, client.ObjectKey{Namespace: o.namespace, Name: name}, pr); err != nil {
		return err
	}
	if o.output != "" {
		return o.printObject(pr)
	}
	var b strings.Builder
	field := func(label, value string) {
		if value != "" {
			fmt.Fprintf(&b, "%-12s %s\n", label+":", value)
		}
	}
	req := pr.Spec.Request
	field("Name", pr.Name)
	field("Namespace", pr.Namespace)
	field("UID", string(pr.UID))
	field("Run", pr.Spec.RunRef.Name)
	if path := pr.RunPath(); len(path) > 1 {
		field("Delegated", notify.PathText(path))
	}
	field("Requested by", pr.Spec.RequestedBy)
	if p := pr.Spec.Policy; p != nil {
		field("Policy", fmt.Sprintf("%s (generation %d)", p.Name, p.Generation))
	}
	field("Phase", phaseOf(pr))
	field("Age", age(pr.CreationTimestamp, time.Now()))
	field("MCP servers", o.mcpServersOf(ctx, pr))
	b.WriteString("\nRequest\n")
	field("  ID", req.ID)
	field("  Kind", req.Kind)
	field("  Prompt", indentLines(req.Prompt, 13))
	field("  URL", req.URL)
	field("  Expires", req.ExpiresAt)
	if req.Data != nil && len(req.Data.Raw) > 0 {
		field("  Data", prettyJSON(string(req.Data.Raw), strings.Repeat(" ", 13)))
	}
	b.WriteString("\nApprovers\n")
	if a := pr.Spec.Approvers; a != nil && len(a.Users)+len(a.Groups) > 0 {
		field("  Users", strings.Join(a.Users, ", "))
		field("  Groups", strings.Join(a.Groups, ", "))
	} else {
		b.WriteString("  anyone RBAC allows to patch pendingrequests/status\n")
	}
	if needsQuorum(pr) {
		showApprovals(&b, pr, field)
	}
	b.WriteString("\nTool call\n")
	field("  Name", pr.Spec.ToolCall.Name)
	field("  ID", pr.Spec.ToolCall.ID)
	field("  Arguments", prettyJSON(pr.Spec.ToolCall.Arguments, strings.Repeat(" ", 13)))
	b.WriteString("\nAnswer\n")
	if ans := pr.Status.Answer; ans != nil {
		field("  OK", fmt.Sprint(ans.OK))
		if ans.Data != nil && len(ans.Data.Raw) > 0 {
			field("  Data", prettyJSON(string(ans.Data.Raw), strings.Repeat(" ", 13)))
		}
		field("  Reason", ans.Reason)
		field("  For UID", ans.RequestUID)
		field("  By", pr.Status.AnsweredBy)
		if pr.Status.AnsweredAt != nil {
			field("  At", pr.Status.AnsweredAt.UTC().Format(time.RFC3339))
		}
	} else if isOpen(pr) {
		// The commands carry the uid shown above: pasted, they answer this request and no other
		// one opened under its name since.
		commands := notify.Commands(req.Kind, pr.Namespace, pr.Name, string(pr.UID))
		switch {
		case needsQuorum(pr):
			commands = notify.QuorumCommands(pr.Namespace, pr.Name, string(pr.UID))
			fmt.Fprintf(&b, "  none yet; the manager records it once %d approve or one declines.\n", pr.Spec.Required)
			b.WriteString("  Add your entry, approving or declining this request (uid " + string(pr.UID) + "), with:\n")
		case operatorLogin(pr):
			commands = commands[len(commands)-1:]
			b.WriteString("  none yet; the operator answers it once someone signs in at the URL above (the login is whoever\n" +
				"  signs in, for the token scope in Data). Or decline this request (uid " + string(pr.UID) + ") with:\n")
		default:
			b.WriteString("  none yet; answer this request (uid " + string(pr.UID) + ") with:\n")
		}
		for _, c := range commands {
			b.WriteString("    " + c + "\n")
		}
	} else {
		b.WriteString("  none\n")
	}
	_, err := fmt.Fprint(o.out, b.String())
	return err
}

// mcpServersOf is what the request's run says of its MCP servers: which answered when its tools
// were last built and the MCP revision each speaks, which decides how a server's tool asks for
// input (ToolsReady). "" when the run has no MCP server or cannot be read (it is gone, or the
// user may read requests but not runs), or is another run of the same name: the request is shown
// all the same.
func (o *options) mcpServersOf(ctx context.Context, pr *toolnexusv1alpha1.PendingRequest) string {
	run := &toolnexusv1alpha1.AgentRun{}
	if err := o.client.Get(ctx, client.ObjectKey{Namespace: pr.Namespace, Name: pr.Spec.RunRef.Name}, run); err != nil {
		return ""
	}
	if owner := metav1.GetControllerOf(pr); owner != nil && owner.UID != run.UID {
		return ""
	}
	if c := meta.FindStatusCondition(run.Status.Conditions, toolnexusv1alpha1.ConditionToolsReady); c != nil {
		return c.Message
	}
	return ""
}

// showApprovals writes the Approvals section of a request that needs several: how many, the
// progress, and every entry, one a line.
func showApprovals(b *strings.Builder, pr *toolnexusv1alpha1.PendingRequest, field func(label, value string)) {
	t := tallyOf(pr)
	b.WriteString("\nApprovals\n")
	field("  Required", fmt.Sprint(pr.Spec.Required))
	progress := t.String()
	if isOpen(pr) {
		progress = t.summary()
	}
	field("  Progress", progress)
	for _, e := range pr.Status.Approvals {
		// A user or a reason is one line: what follows on the next one is the plugin's.
		fmt.Fprintf(b, "  - %s %s", notify.PrintableLine(e.User), entryVerb(e))
		if e.At != nil {
			b.WriteString(" at " + e.At.UTC().Format(time.RFC3339))
		}
		if e.Reason != "" {
			b.WriteString(": " + notify.PrintableLine(e.Reason))
		}
		b.WriteString("\n")
	}
}

func phaseOf(pr *toolnexusv1alpha1.PendingRequest) string {
	if pr.Status.Phase != "" {
		return string(pr.Status.Phase)
	}
	if pr.Status.Answer != nil {
		return string(toolnexusv1alpha1.RequestPhaseAnswered)
	}
	return string(toolnexusv1alpha1.RequestPhaseWaiting)
}

// indentLines indents every line of s after the first by n spaces, to continue a field.
func indentLines(s string, n int) string {
	return strings.ReplaceAll(s, "\n", "\n"+strings.Repeat(" ", n))
}

// operatorLogin reports whether pr is a login the operator completes itself (SPEC §12): signing in
// answers it, nobody else does but to decline.
func operatorLogin(pr *toolnexusv1alpha1.PendingRequest) bool {
	return pr.Spec.Request.Kind == tools.KindAuthorization && strings.HasPrefix(pr.Spec.Request.ID, tools.LoginIDPrefix)
}

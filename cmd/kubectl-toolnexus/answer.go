package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// fieldManager names the plugin in metadata.managedFields of what it writes.
const fieldManager = "kubectl-toolnexus"

// answerFlags are the flags of approve, decline and answer.
type answerFlags struct {
	uid     string
	wait    bool
	timeout time.Duration
}

// boundAnswerHelp is what approve, decline and answer say about --uid.
const boundAnswerHelp = `
The answer is bound to one PendingRequest object, not to its name (status.answer.requestUID):
a run deleted and created again under its name opens a new request of the same name, maybe
with other arguments, and an answer bound to the old one is refused. With --uid UID, the
metadata.uid of the request you reviewed (kubectl toolnexus show prints it, and the commands
that answer it; so do the Slack messages, the CloudEvents and the inbox), the answer is given
only if the request is still that one; otherwise nothing is written and the command fails
saying the request was replaced. Without --uid, the answer binds to the request as this
command reads it: one replaced between that read and the write is refused, but nothing ties
the answer to what you reviewed earlier, so paste the command show printed.`

func (f *answerFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.uid, "uid", "", "The metadata.uid of the request you reviewed; refused if the request was replaced since (show prints it).")
	cmd.Flags().BoolVar(&f.wait, "wait", false, "Then follow the run until it suspends again or finishes, and print its phase.")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 10*time.Minute, "How long --wait waits; 0 waits forever.")
}

// quorumHelp is what approve and decline say about requests that need several approvals.
const quorumHelp = `
A request that needs several approvals (spec.required above 1, set by an ApprovalPolicy) is
not answered by anyone directly: the command adds your own entry to its status.approvals
instead, {user: you, ok, reason}, and prints the progress, e.g. "approved: 1 of 2 (alice);
waiting for 1 more". Once enough approvers have approved, or one has declined, the manager
records the answer. Your entry cannot be changed once given, and it is bound to the request
you reviewed as an answer is (below): it is added to that object only.
`

func newApproveCommand(o *options) *cobra.Command {
	f := &answerFlags{}
	var reason string
	cmd := &cobra.Command{
		Use:   "approve NAME",
		Short: "Approve a PendingRequest (answer ok: true, or your approval of one that needs several)",
		Long: `Approve a PendingRequest: its answer becomes {"ok": true}. The run re-executes the suspended
tool call once with the answer attached. Requests of kind input, question and tool_call need a
result: use answer instead.
` + quorumHelp + boundAnswerHelp,
		Example: `  kubectl toolnexus show buy-gpu-1-call-1
  kubectl toolnexus approve buy-gpu-1-call-1 --uid 0b5c7a4e-2f0d-4b8e-9f57-1a2b3c4d5e6f`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.runAnswer(cmd.Context(), args[0], toolnexusv1alpha1.Answer{OK: true, Reason: reason}, "approved", f)
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "Why, recorded with your approval of a request that needs several (an answer carries none).")
	f.add(cmd)
	return cmd
}

func newDeclineCommand(o *options) *cobra.Command {
	f := &answerFlags{}
	var reason string
	cmd := &cobra.Command{
		Use:   "decline NAME",
		Short: "Decline a PendingRequest (answer ok: false); the model is told",
		Long: `Decline a PendingRequest: its answer becomes {"ok": false, "reason": REASON}. The tool call is
not executed; the model is told it was declined, with the reason.
` + quorumHelp + boundAnswerHelp,
		Example: `  kubectl toolnexus decline buy-gpu-1-call-1 --uid 0b5c7a4e-2f0d-4b8e-9f57-1a2b3c4d5e6f --reason "over budget"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.runAnswer(cmd.Context(), args[0], toolnexusv1alpha1.Answer{OK: false, Reason: reason}, "declined", f)
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "declined", "Why; the model sees it after \"reason: \".")
	f.add(cmd)
	return cmd
}

func newAnswerCommand(o *options) *cobra.Command {
	f := &answerFlags{}
	var output, data string
	cmd := &cobra.Command{
		Use:   "answer NAME (--output TEXT | --data JSON)",
		Short: "Answer a PendingRequest with a result (ok: true and data)",
		Long: `Answer a PendingRequest with a result the tool can use:
  --output TEXT  sets data.output, what an input request needs;
  --data JSON    sets data to a JSON object: the fields of a form (an input request with a
                 schema), the answers of a question, or the results of a tool_call request.
` + boundAnswerHelp,
		Example: `  kubectl toolnexus answer deploy-1-call-1 --uid 0b5c7a4e-2f0d-4b8e-9f57-1a2b3c4d5e6f --output staging
  kubectl toolnexus answer survey-1-call-1 --uid 7d1f3b2a-9c4e-4f6a-8b2d-3e5f7a9c1b4d --data '{"output":"blue"}'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ans := toolnexusv1alpha1.Answer{OK: true}
			switch {
			case cmd.Flags().Changed("output") == cmd.Flags().Changed("data"):
				return fmt.Errorf("give exactly one of --output TEXT or --data JSON")
			case cmd.Flags().Changed("output"):
				raw, _ := json.Marshal(map[string]string{"output": output})
				ans.Data = jsonValue(raw)
			default:
				var err error
				if ans, err = dataAnswer(data); err != nil {
					return fmt.Errorf("--data %w", err)
				}
			}
			return o.runAnswer(cmd.Context(), args[0], ans, "answered", f)
		},
	}
	cmd.Flags().StringVar(&output, "output", "", "The answer text (data.output).")
	cmd.Flags().StringVar(&data, "data", "", "The answer's data, a JSON object.")
	f.add(cmd)
	return cmd
}

// dataAnswer is the answer {ok: true, data: raw}; raw must be a JSON object.
func dataAnswer(raw string) (toolnexusv1alpha1.Answer, error) {
	var obj map[string]any
	if err := json.Unmarshal([]byte(raw), &obj); err != nil || obj == nil {
		return toolnexusv1alpha1.Answer{}, fmt.Errorf(`must be a JSON object, e.g. {"output":"staging"}: %v`, err)
	}
	return toolnexusv1alpha1.Answer{OK: true, Data: jsonValue([]byte(raw))}, nil
}

// runAnswer answers the request, prints what it did and, with --wait, follows the run. A request
// that needs several approvals is given the caller's entry instead (approve and decline only).
func (o *options) runAnswer(ctx context.Context, name string, ans toolnexusv1alpha1.Answer, verb string, f *answerFlags) error {
	pr := &toolnexusv1alpha1.PendingRequest{}
	if err := o.client.Get(ctx, client.ObjectKey{Namespace: o.namespace, Name: name}, pr); err != nil {
		if apierrors.IsNotFound(err) && f.uid != "" {
			return fmt.Errorf("PendingRequest %s was deleted since you saw it (uid %s): %w", name, f.uid, err)
		}
		return err
	}
	if f.uid != "" && string(pr.UID) != f.uid {
		return replaced(pr)
	}
	switch {
	case needsQuorum(pr) && ans.Data != nil:
		return quorumOnly(pr)
	case needsQuorum(pr):
		if err := o.runApproval(ctx, pr, ans); err != nil {
			return err
		}
	case ans.OK && ans.Reason != "":
		return fmt.Errorf("--reason: an approval carries no reason (the API server refuses ok: true with one); " +
			"it explains an approver's entry on a request that needs several approvals")
	default:
		if err := o.sendAnswer(ctx, pr, ans); err != nil {
			return err
		}
		fmt.Fprintf(o.out, "pendingrequest.toolnexus.dev/%s %s\n", name, verb)
	}
	if !f.wait {
		return nil
	}
	run, err := o.waitForRun(ctx, pr.Spec.RunRef.Name, f.timeout, func(run *toolnexusv1alpha1.AgentRun) bool {
		return settled(run) && !listsPending(run, name)
	})
	if err != nil {
		return err
	}
	return o.printRunState(run)
}

// runApproval adds the caller's entry to a request that needs several approvals and prints the
// progress: "approved: 1 of 2 (alice); waiting for 1 more". An entry of the caller's already
// there is said so, and is no error when it is the same decision.
func (o *options) runApproval(ctx context.Context, pr *toolnexusv1alpha1.PendingRequest, ans toolnexusv1alpha1.Answer) error {
	stored, err := o.sendApproval(ctx, pr, ans.OK, ans.Reason)
	var decided *decidedError
	switch {
	case errors.As(err, &decided) && decided.entry.OK == ans.OK:
		fmt.Fprintf(o.out, "pendingrequest.toolnexus.dev/%s: you (%s) already %s it; %s\n",
			pr.Name, decided.entry.User, entryVerb(decided.entry), tallyOf(decided.pr).summary())
		return nil
	case err != nil:
		return err
	}
	t := tallyOf(stored)
	if t.decline != nil {
		fmt.Fprintf(o.out, "pendingrequest.toolnexus.dev/%s %s\n", pr.Name, t.summary())
	} else {
		fmt.Fprintf(o.out, "pendingrequest.toolnexus.dev/%s approved: %s\n", pr.Name, t.summary())
	}
	return nil
}

// maxAnswerConflicts bounds how often sendAnswer reads the request again because the manager
// wrote it (a condition, the notification record) between the read and the answer.
const maxAnswerConflicts = 5

// errReplacedByAPIServer is what the API server's admission policy says when an answer's
// requestUID is not the request's metadata.uid.
const errReplacedByAPIServer = "was deleted and replaced"

// sendAnswer sets the request's status.answer with a merge patch of the status subresource, the
// patch `kubectl patch preq NAME --subresource=status --type=merge` sends, bound to pr, the
// request as read: answer.requestUID is its uid (the API server refuses the answer for any other
// request of the name), and the patch carries the resourceVersion read, so that the API server
// applies it only to the object read. A conflict means the object changed since: it is read
// again, and answered if it is still pr's request and still open. The API server stamps
// answeredBy and answeredAt and enforces who may answer; its refusal is returned as it gave it.
func (o *options) sendAnswer(ctx context.Context, pr *toolnexusv1alpha1.PendingRequest, ans toolnexusv1alpha1.Answer) error {
	uid := pr.UID
	for conflicts := 0; ; conflicts++ {
		if err := stillOpen(pr, uid); err != nil {
			return err
		}
		// The id pins the answer to the suspension, the uid to the object.
		ans.ID, ans.RequestUID = pr.Spec.Request.ID, string(uid)
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": pr.ResourceVersion},
			"status":   map[string]any{"answer": ans},
		})
		if err != nil {
			return err
		}
		err = o.client.Status().Patch(ctx, pr, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(fieldManager))
		switch {
		case err == nil:
			return nil
		case apierrors.IsConflict(err) && conflicts < maxAnswerConflicts:
			if pr, err = o.reread(ctx, client.ObjectKeyFromObject(pr), uid); err != nil {
				return err
			}
		case apierrors.IsNotFound(err):
			return err
		case strings.Contains(err.Error(), errReplacedByAPIServer):
			return replaced(pr)
		default:
			return fmt.Errorf("the API server refused the answer: %w", err)
		}
	}
}

// stillOpen refuses to answer pr, or add an entry to it, unless it is the request of uid and
// still waits for an answer.
func stillOpen(pr *toolnexusv1alpha1.PendingRequest, uid types.UID) error {
	if pr.UID != uid {
		return replaced(pr)
	}
	if prev := pr.Status.Answer; prev != nil {
		return fmt.Errorf("pendingrequests.toolnexus.dev %q is already answered (%s by %s); an answer cannot be changed",
			pr.Name, describeAnswer(prev), orUnknown(pr.Status.AnsweredBy))
	}
	if pr.Status.Phase == toolnexusv1alpha1.RequestPhaseCancelled {
		return fmt.Errorf("pendingrequests.toolnexus.dev %q was cancelled; there is nothing to answer", pr.Name)
	}
	return nil
}

// reread reads the request of key again after a conflict; one deleted since is named with the
// uid that was seen.
func (o *options) reread(ctx context.Context, key client.ObjectKey, uid types.UID) (*toolnexusv1alpha1.PendingRequest, error) {
	pr := &toolnexusv1alpha1.PendingRequest{}
	if err := o.client.Get(ctx, key, pr); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("PendingRequest %s was deleted since you saw it (uid %s): %w", key.Name, uid, err)
		}
		return nil, err
	}
	return pr, nil
}

// replacedError refuses an answer bound to another object than the request now named so.
type replacedError struct{ name, namespace string }

func (e *replacedError) Error() string {
	return fmt.Sprintf("PendingRequest %s was replaced since you saw it; review it with `kubectl toolnexus show %s -n %s` and answer again",
		e.name, e.name, e.namespace)
}

func replaced(pr *toolnexusv1alpha1.PendingRequest) error {
	return &replacedError{name: pr.Name, namespace: pr.Namespace}
}

func describeAnswer(a *toolnexusv1alpha1.Answer) string {
	if a.OK {
		return "ok: true"
	}
	if a.Reason != "" {
		return "ok: false, reason: " + a.Reason
	}
	return "ok: false"
}

func orUnknown(s string) string {
	if s == "" {
		return "<unknown>"
	}
	return s
}

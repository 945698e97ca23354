package main

import (
	"context"
	"encoding/json"
	"fmt"
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
	wait    bool
	timeout time.Duration
}

func (f *answerFlags) add(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.wait, "wait", false, "Then follow the run until it suspends again or finishes, and print its phase.")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 10*time.Minute, "How long --wait waits; 0 waits forever.")
}

func newApproveCommand(o *options) *cobra.Command {
	f := &answerFlags{}
	cmd := &cobra.Command{
		Use:   "approve NAME",
		Short: "Approve a PendingRequest (answer ok: true), e.g. an approval or a completed login",
		Long: `Approve a PendingRequest: its answer becomes {"ok": true}. The run re-executes the suspended
tool call once with the answer attached. Requests of kind input, question and tool_call need a
result: use answer instead.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.runAnswer(cmd.Context(), args[0], toolnexusv1alpha1.Answer{OK: true}, "approved", f)
		},
	}
	f.add(cmd)
	return cmd
}

func newDeclineCommand(o *options) *cobra.Command {
	f := &answerFlags{}
	var reason string
	cmd := &cobra.Command{
		Use:   "decline NAME",
		Short: "Decline a PendingRequest (answer ok: false); the model is told",
		Args:  cobra.ExactArgs(1),
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
                 schema), the answers of a question, or the results of a tool_call request.`,
		Example: `  kubectl toolnexus answer deploy-1-call-1 --output staging
  kubectl toolnexus answer survey-1-call-1 --data '{"output":"blue"}'`,
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

// runAnswer answers the request, prints what it did and, with --wait, follows the run.
func (o *options) runAnswer(ctx context.Context, name string, ans toolnexusv1alpha1.Answer, verb string, f *answerFlags) error {
	pr := &toolnexusv1alpha1.PendingRequest{}
	if err := o.client.Get(ctx, client.ObjectKey{Namespace: o.namespace, Name: name}, pr); err != nil {
		return err
	}
	if err := o.sendAnswer(ctx, pr, ans); err != nil {
		return err
	}
	fmt.Fprintf(o.out, "pendingrequest.toolnexus.dev/%s %s\n", name, verb)
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

// sendAnswer sets the request's status.answer with a merge patch of the status subresource, the
// patch `kubectl patch preq NAME --subresource=status --type=merge` sends. The API server stamps
// answeredBy and answeredAt and enforces who may answer; its refusal is returned as it gave it.
func (o *options) sendAnswer(ctx context.Context, pr *toolnexusv1alpha1.PendingRequest, ans toolnexusv1alpha1.Answer) error {
	if prev := pr.Status.Answer; prev != nil {
		return fmt.Errorf("pendingrequests.toolnexus.dev %q is already answered (%s by %s); an answer cannot be changed",
			pr.Name, describeAnswer(prev), orUnknown(pr.Status.AnsweredBy))
	}
	if pr.Status.Phase == toolnexusv1alpha1.RequestPhaseCancelled {
		return fmt.Errorf("pendingrequests.toolnexus.dev %q was cancelled; there is nothing to answer", pr.Name)
	}
	// The id pins the answer to this request: the API server refuses it for any other.
	ans.ID = pr.Spec.Request.ID
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"answer": ans}})
	if err != nil {
		return err
	}
	if err := o.client.Status().Patch(ctx, pr, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(fieldManager)); err != nil {
		if apierrors.IsNotFound(err) {
			return err
		}
		return fmt.Errorf("the API server refused the answer: %w", err)
	}
	return nil
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

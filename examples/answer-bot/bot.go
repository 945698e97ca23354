// Package answerbot is a small answering bot built on the Toolnexus operator: it reads the open
// PendingRequests its user may answer and answers the approvals a Rule decides, approving a
// purchase up to an amount and declining larger ones with a reason the model is told. Requests no
// rule decides are left to people.
//
// It is an example of building on the operator with its API types alone; its tests
// (bot_test.go) run it against the real operator with package toolnexustest.
package answerbot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// Decision is what a Rule makes of a tool call waiting for approval.
type Decision struct {
	// Decided is false when the rule leaves the call to someone else.
	Decided bool
	Approve bool
	// Reason is told to the model when the call is declined.
	Reason string
}

// Rule decides a tool call waiting for approval.
type Rule func(toolnexusv1alpha1.ToolCall) Decision

// MaxAmount approves calls of tool whose arguments' amount is at most limit and declines the
// others, naming the amount and the limit; it leaves calls of other tools alone.
func MaxAmount(tool string, limit float64) Rule {
	return func(call toolnexusv1alpha1.ToolCall) Decision {
		if call.Name != tool {
			return Decision{}
		}
		var args struct {
			Amount *float64 `json:"amount"`
		}
		if err := json.Unmarshal([]byte(call.Arguments), &args); err != nil || args.Amount == nil {
			return Decision{Decided: true, Reason: fmt.Sprintf("declined: %s needs a numeric amount to be approved automatically", tool)}
		}
		if *args.Amount > limit {
			return Decision{Decided: true, Reason: fmt.Sprintf("declined: amount %g is over the limit of %g", *args.Amount, limit)}
		}
		return Decision{Decided: true, Approve: true}
	}
}

// Bot answers the approvals Rule decides, as the user of Client.
type Bot struct {
	Client client.Client
	// Namespace the bot watches; empty is every namespace (its user then needs a ClusterRoleBinding).
	Namespace string
	Rule      Rule
}

// Sweep answers every open approval request the rule decides and returns how many it answered. A
// request it may not answer (it is not an approver, or a person answered first) is reported in the
// error, and the others are answered all the same.
func (b *Bot) Sweep(ctx context.Context) (int, error) {
	var list toolnexusv1alpha1.PendingRequestList
	if err := b.Client.List(ctx, &list, client.InNamespace(b.Namespace)); err != nil {
		return 0, fmt.Errorf("listing PendingRequests: %w", err)
	}
	answered := 0
	var errs []error
	for i := range list.Items {
		preq := &list.Items[i]
		if preq.Status.Answer != nil || preq.Status.Phase == toolnexusv1alpha1.RequestPhaseExpired ||
			preq.Status.Phase == toolnexusv1alpha1.RequestPhaseCancelled || preq.Spec.Request.Kind != "approval" {
			continue
		}
		d := b.Rule(preq.Spec.ToolCall)
		if !d.Decided {
			continue
		}
		if err := b.answer(ctx, preq, d); err != nil {
			errs = append(errs, err)
			continue
		}
		answered++
	}
	return answered, errors.Join(errs...)
}

// answer sets the request's answer, bound to the object the bot read (answer.requestUID): a
// request deleted and re-created under the same name with other arguments is not approved by a
// decision about the old one.
func (b *Bot) answer(ctx context.Context, preq *toolnexusv1alpha1.PendingRequest, d Decision) error {
	answer := toolnexusv1alpha1.Answer{ID: preq.Spec.Request.ID, RequestUID: string(preq.UID), OK: d.Approve}
	if !d.Approve {
		answer.Reason = d.Reason
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"answer": answer}})
	if err != nil {
		return err
	}
	if err := b.Client.Status().Patch(ctx, preq, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("answering PendingRequest %s/%s: %w", preq.Namespace, preq.Name, err)
	}
	return nil
}

// Run sweeps every interval until ctx ends, and reports each sweep's error to onError (nil
// ignores them): a request refused once is tried again at the next sweep, until it is answered.
func (b *Bot) Run(ctx context.Context, interval time.Duration, onError func(error)) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		if _, err := b.Sweep(ctx); err != nil && onError != nil && ctx.Err() == nil {
			onError(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

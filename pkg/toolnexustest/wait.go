package toolnexustest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// WaitTimeout bounds every wait of the kit, whatever the deadline of its context: long enough for
// a run's step on a busy machine, short enough that a run which never gets there fails the test
// instead of hanging it.
const WaitTimeout = time.Minute

const pollInterval = 100 * time.Millisecond

// WaitForRequest waits until run has an open PendingRequest (created for this run, by its UID, and
// not answered, expired or cancelled) and returns it, as the administrator reads it.
func (e *Env) WaitForRequest(ctx context.Context, run *toolnexusv1alpha1.AgentRun) (*toolnexusv1alpha1.PendingRequest, error) {
	return WaitForRequest(ctx, e.Admin, run)
}

// WaitForRequest is Env.WaitForRequest reading as c, for a suite that installs and runs the
// operator its own way (a Helm chart, a GitOps tool) and has no Env.
func WaitForRequest(ctx context.Context, c client.Client, run *toolnexusv1alpha1.AgentRun) (*toolnexusv1alpha1.PendingRequest, error) {
	var open *toolnexusv1alpha1.PendingRequest
	seen := 0
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		var list toolnexusv1alpha1.PendingRequestList
		if err := c.List(ctx, &list, client.InNamespace(run.Namespace),
			client.MatchingLabels{toolnexusv1alpha1.RunLabel: run.Name}); err != nil {
			return false, err
		}
		seen = len(list.Items)
		for i := range list.Items {
			if p := &list.Items[i]; ownedBy(p, run.UID) && isOpen(p) {
				open = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no open PendingRequest of AgentRun %s/%s within %s (%d of its requests seen, none open): %w",
			run.Namespace, run.Name, WaitTimeout, seen, err)
	}
	return open, nil
}

func ownedBy(p *toolnexusv1alpha1.PendingRequest, uid types.UID) bool {
	for _, ref := range p.OwnerReferences {
		if ref.UID == uid {
			return true
		}
	}
	return false
}

func isOpen(p *toolnexusv1alpha1.PendingRequest) bool {
	return p.Status.Answer == nil && p.Status.Phase != toolnexusv1alpha1.RequestPhaseExpired &&
		p.Status.Phase != toolnexusv1alpha1.RequestPhaseCancelled
}

// WaitForPhase waits until run's status.phase is phase and returns the run as then read. A run that
// ends in another phase (Succeeded, Incomplete, Failed) is an error naming it and why it ended.
func (e *Env) WaitForPhase(ctx context.Context, run *toolnexusv1alpha1.AgentRun, phase toolnexusv1alpha1.RunPhase) (*toolnexusv1alpha1.AgentRun, error) {
	return WaitForPhase(ctx, e.Admin, run, phase)
}

// WaitForPhase is Env.WaitForPhase reading as c, for a suite without an Env.
func WaitForPhase(ctx context.Context, c client.Client, run *toolnexusv1alpha1.AgentRun, phase toolnexusv1alpha1.RunPhase) (*toolnexusv1alpha1.AgentRun, error) {
	got := &toolnexusv1alpha1.AgentRun{}
	var ended error
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(run), got); err != nil {
			return false, err
		}
		if got.Status.Phase == phase {
			return true, nil
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, toolnexusv1alpha1.ConditionSucceeded); c != nil && c.Status != "Unknown" {
			ended = fmt.Errorf("AgentRun %s/%s ended %s (%s: %s), not %s", run.Namespace, run.Name, got.Status.Phase, c.Reason, c.Message, phase)
			return false, ended
		}
		return false, nil
	})
	if ended != nil {
		return got, ended
	}
	if err != nil {
		return got, fmt.Errorf("AgentRun %s/%s is %q, not %s, after %s: %w", run.Namespace, run.Name, got.Status.Phase, phase, WaitTimeout, err)
	}
	return got, nil
}

func poll(ctx context.Context, done wait.ConditionWithContextFunc) error {
	return wait.PollUntilContextTimeout(ctx, pollInterval, WaitTimeout, true, done)
}

// Approve answers preq {ok: true} as the user of c.
func Approve(ctx context.Context, c client.Client, preq *toolnexusv1alpha1.PendingRequest) error {
	return Answer(ctx, c, preq, toolnexusv1alpha1.Answer{OK: true})
}

// Decline answers preq {ok: false, reason} as the user of c: the tool does not run, and the model
// is told reason (declined, or free text).
func Decline(ctx context.Context, c client.Client, preq *toolnexusv1alpha1.PendingRequest, reason string) error {
	return Answer(ctx, c, preq, toolnexusv1alpha1.Answer{OK: false, Reason: reason})
}

// AnswerOutput is the data of an answer that supplies a result as text, for an input or
// tool_call request: {output: text}.
func AnswerOutput(text string) *apiextensionsv1.JSON {
	raw, err := json.Marshal(map[string]string{"output": text})
	if err != nil {
		panic(err)
	}
	return &apiextensionsv1.JSON{Raw: raw}
}

// Answer sets preq's status.answer to answer as the user of c, bound to the request it was given:
// answer.requestUID is preq's UID, so the API server refuses it for a request re-created under
// the same name. It refuses it too when the user may not answer (RBAC, spec.approvers), when the
// request is answered already, or when the answer does not fit its kind.
func Answer(ctx context.Context, c client.Client, preq *toolnexusv1alpha1.PendingRequest, answer toolnexusv1alpha1.Answer) error {
	answer.RequestUID = string(preq.UID)
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"answer": answer}})
	if err != nil {
		return err
	}
	// A client made just after the CRDs were installed may not have discovered their kinds yet;
	// anything else the API server says is the answer's fate.
	var last error
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		last = c.Status().Patch(ctx, preq.DeepCopy(), client.RawPatch(types.MergePatchType, patch))
		var noMatch *meta.NoKindMatchError
		if errors.As(last, &noMatch) || meta.IsNoMatchError(last) {
			return false, nil
		}
		return true, last
	})
	if err != nil && last != nil {
		err = last
	}
	if err != nil {
		return fmt.Errorf("answering PendingRequest %s/%s: %w", preq.Namespace, preq.Name, err)
	}
	return nil
}

package agentrun

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/runstore"
)

// A run of an Agent (spec.agentRef) resolves the Agent once, before its first step, and saves
// the Agent's spec in its record: from then on it runs with that snapshot, whatever happens to
// the Agent. Until the Agent exists the run waits with reason AgentNotFound; the Agent watch
// wakes it.

// resolveSpec sets s.spec, the spec the run runs with. A run of an Agent that has no snapshot
// yet takes one from the Agent (took), to be saved before anything else; found is false when
// that Agent does not exist.
func (r *Reconciler) resolveSpec(ctx context.Context, s *scope) (found, took bool, err error) {
	run := s.run
	if ref := run.Spec.AgentRef; ref != nil && s.rec.Agent == nil && !s.rec.Started() {
		agent := &toolnexusv1alpha1.Agent{}
		err := r.Get(ctx, client.ObjectKey{Namespace: run.Namespace, Name: ref.Name}, agent)
		if apierrors.IsNotFound(err) {
			s.spec = &run.Spec
			s.progress.reason = toolnexusv1alpha1.ReasonAgentNotFound
			s.progress.message = fmt.Sprintf("Agent %q does not exist in the run's namespace", ref.Name)
			return false, false, nil
		}
		if err != nil {
			return false, false, fmt.Errorf("reading Agent %s: %w", ref.Name, err)
		}
		raw, err := json.Marshal(agent.Spec)
		if err != nil {
			return false, false, fmt.Errorf("snapshotting Agent %s: %w", ref.Name, err)
		}
		// Saved before any step runs: a step's outcome is applied to the saved record only.
		s.rec.Agent = &runstore.AgentSnapshot{Name: agent.Name, Generation: agent.Generation, Spec: raw}
		took = true
	}
	spec, err := effectiveSpec(run, s.rec)
	if err != nil {
		s.rec.State.End(toolnexusv1alpha1.ReasonTranscriptCorrupt, clip.Marked(err.Error(), 1024))
		s.dirty = true
		spec = &run.Spec
	}
	s.spec = spec
	return true, took, nil
}

// effectiveSpec is the spec a run runs with: its own, or the snapshot of its Agent with the
// run's prompt and, when the run sets one, its maxTurns. A run of an Agent without a snapshot
// (one that ended before resolving it) gets its own spec.
func effectiveSpec(run *toolnexusv1alpha1.AgentRun, rec *runstore.Record) (*toolnexusv1alpha1.AgentRunSpec, error) {
	if run.Spec.AgentRef == nil || rec.Agent == nil {
		return &run.Spec, nil
	}
	var agent toolnexusv1alpha1.AgentSpec
	if err := json.Unmarshal(rec.Agent.Spec, &agent); err != nil {
		return nil, fmt.Errorf("decoding the snapshot of Agent %s in the run's record: %w", rec.Agent.Name, err)
	}
	spec := run.Spec.DeepCopy()
	spec.AgentSpec = agent
	if run.Spec.MaxTurns != 0 {
		spec.MaxTurns = run.Spec.MaxTurns
	}
	return spec, nil
}

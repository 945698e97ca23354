package agentrun

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/runstore"
)

func TestEffectiveSpec(t *testing.T) {
	agent := toolnexusv1alpha1.AgentSpec{
		Model: toolnexusv1alpha1.ModelSpec{Name: "snapshot-model"}, SystemPrompt: "You are terse.", MaxTurns: 5,
		Tools: []toolnexusv1alpha1.ToolSpec{{Name: "lookup", HTTP: &toolnexusv1alpha1.HTTPToolSpec{URL: "http://a"}}},
	}
	raw, err := json.Marshal(agent)
	if err != nil {
		t.Fatal(err)
	}
	snapshot := &runstore.AgentSnapshot{Name: "purchasing", Generation: 3, Spec: raw}
	ofAgent := func(maxTurns int32) toolnexusv1alpha1.AgentRunSpec {
		s := toolnexusv1alpha1.AgentRunSpec{AgentRef: &toolnexusv1alpha1.AgentReference{Name: "purchasing"}, Prompt: "buy a gpu"}
		s.MaxTurns = maxTurns
		return s
	}
	withAgent := func(s toolnexusv1alpha1.AgentSpec, maxTurns int32) toolnexusv1alpha1.AgentRunSpec {
		out := ofAgent(0)
		out.AgentSpec, out.MaxTurns = s, maxTurns
		return out
	}
	inline := toolnexusv1alpha1.AgentRunSpec{Prompt: "hi", AgentSpec: toolnexusv1alpha1.AgentSpec{Model: toolnexusv1alpha1.ModelSpec{Name: "inline"}}}
	for _, tc := range []struct {
		name  string
		spec  toolnexusv1alpha1.AgentRunSpec
		agent *runstore.AgentSnapshot
		want  toolnexusv1alpha1.AgentRunSpec
	}{
		{"an inline run is its own spec", inline, nil, inline},
		{"a run of an agent gets the snapshot, with the agent's maxTurns", ofAgent(0), snapshot, withAgent(agent, 5)},
		{"the run's own maxTurns wins", ofAgent(2), snapshot, withAgent(agent, 2)},
		{"a run that ended before resolving its agent keeps its own spec", ofAgent(0), nil, ofAgent(0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := &toolnexusv1alpha1.AgentRun{Spec: tc.spec}
			got, err := effectiveSpec(run, &runstore.Record{Agent: tc.agent})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, *got); diff != "" {
				t.Errorf("effective spec (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := effectiveSpec(&toolnexusv1alpha1.AgentRun{Spec: ofAgent(0)},
		&runstore.Record{Agent: &runstore.AgentSnapshot{Name: "x", Spec: json.RawMessage(`[]`)}}); err == nil {
		t.Error("a snapshot that does not decode must be an error")
	}
}

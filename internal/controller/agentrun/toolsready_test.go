package agentrun

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller/runspec"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/runstore"
)

// TestToolsReadyNamesRevisions: the ToolsReady condition names the MCP revision each server that
// answered speaks, beside the failures of the others.
func TestToolsReadyNamesRevisions(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	cases := map[string]struct {
		report      runspec.MCPReport
		status, msg string
	}{
		"every server answered": {report: runspec.MCPReport{Revisions: []string{"ci (MCP 2026-07-28)", "docs (MCP 2025-11-25)"}},
			status: "True", msg: "Every MCP server answered: ci (MCP 2026-07-28), docs (MCP 2025-11-25)"},
		"one failed": {report: runspec.MCPReport{Failures: []string{"docs: connection refused"}, Revisions: []string{"ci (MCP 2026-07-28)"}},
			status: "False", msg: "Some MCP tools are missing: docs: connection refused; answered: ci (MCP 2026-07-28)"},
		"none answered": {report: runspec.MCPReport{Failures: []string{"ci: connection refused"}},
			status: "False", msg: "Some MCP tools are missing: ci: connection refused"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			run := &toolnexusv1alpha1.AgentRun{Spec: toolnexusv1alpha1.AgentRunSpec{AgentSpec: toolnexusv1alpha1.AgentSpec{
				MCPServers: []toolnexusv1alpha1.MCPServerSpec{{Name: "ci", URL: "http://127.0.0.1:1"}}}}}
			setToolsReady(run, &runstore.Record{State: loop.NewState("hi")}, progress{toolsBuilt: true, mcp: tc.report}, now)
			c := meta.FindStatusCondition(run.Status.Conditions, toolnexusv1alpha1.ConditionToolsReady)
			if c == nil || string(c.Status) != tc.status || c.Message != tc.msg {
				t.Errorf("ToolsReady = %+v, want %s: %q", c, tc.status, tc.msg)
			}
		})
	}
}

package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/runstore"
)

// maxTranscriptBytes bounds what the plugin decodes of a run's record.
const maxTranscriptBytes = 256 << 20

func newTranscriptCommand(o *options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "transcript RUN",
		Short: "Print an AgentRun's full transcript: every message, tool call and tool result",
		Long: `Print the full transcript of an AgentRun, read from the AgentRunRecords the run owns
(status.transcriptRef): every message with its role, the tool calls the model made with their
arguments, and the tool results, errors marked. -o json prints the stored state as it is.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.runTranscript(cmd.Context(), args[0])
		},
	}
	o.addOutputFlag(cmd)
	return cmd
}

func (o *options) runTranscript(ctx context.Context, name string) error {
	run := &toolnexusv1alpha1.AgentRun{}
	if err := o.client.Get(ctx, client.ObjectKey{Namespace: o.namespace, Name: name}, run); err != nil {
		return err
	}
	st, err := o.loadTranscript(ctx, run)
	if err != nil {
		return err
	}
	if o.output != "" {
		return o.printData(st)
	}
	return printTranscript(o.out, run, st)
}

// loadTranscript reads the run's state from the AgentRunRecords it owns, checked as the manager
// checks them: the head and, in order, the parts that hold the older messages.
func (o *options) loadTranscript(ctx context.Context, run *toolnexusv1alpha1.AgentRun) (*state.State, error) {
	name := run.Name
	if run.Status.TranscriptRef == nil || run.Status.TranscriptRef.Name == "" {
		return nil, fmt.Errorf("agentruns.toolnexus.dev %q has no transcript yet (status.transcriptRef is empty): the run has not taken a step", name)
	}
	rec, err := runstore.Read(ctx, o.client, run, maxTranscriptBytes)
	if err != nil {
		return nil, fmt.Errorf("reading the transcript of agentruns.toolnexus.dev %q: %w", name, err)
	}
	return rec.State, nil
}

func printTranscript(out io.Writer, run *toolnexusv1alpha1.AgentRun, st *state.State) error {
	var b strings.Builder
	fmt.Fprintf(&b, "AgentRun %s/%s: %s, %d turns", run.Namespace, run.Name, runPhase(run), st.Turn)
	if st.Model != "" {
		fmt.Fprintf(&b, ", model %s", st.Model)
	}
	b.WriteString("\n")
	if run.Spec.SystemPrompt != "" {
		fmt.Fprintf(&b, "\n[system]\n%s\n", indent(run.Spec.SystemPrompt))
	}
	toolNames := map[string]string{}
	for _, m := range st.Messages {
		switch m.Role {
		case state.RoleTool:
			name := toolNames[m.ToolCallID]
			label := "result"
			if m.IsError {
				label = "result, ERROR"
			}
			fmt.Fprintf(&b, "\n[tool %s %s] (%s)\n", name, m.ToolCallID, label)
			fmt.Fprintf(&b, "%s\n", indent(m.Content))
		default:
			fmt.Fprintf(&b, "\n[%s]\n", m.Role)
			if m.Content != "" {
				fmt.Fprintf(&b, "%s\n", indent(m.Content))
			}
			for _, tc := range m.ToolCalls {
				toolNames[tc.ID] = tc.Name
				fmt.Fprintf(&b, "  -> call %s %s\n", tc.Name, tc.ID)
				fmt.Fprintf(&b, "     %s\n", prettyJSON(tc.Arguments, "     "))
			}
		}
	}
	if len(st.Calls) > 0 {
		fmt.Fprintf(&b, "\n[calls of turn %d in progress]\n", st.Turn)
		for _, c := range st.Calls {
			fmt.Fprintf(&b, "  %s %s: %s", c.Name, c.ID, c.Phase)
			for _, a := range c.Asks() {
				answered := ""
				if a.Answer != nil && c.Round != nil {
					answered = ", answered" // the call runs once every request of its round is
				}
				fmt.Fprintf(&b, " (%s: %s%s)", a.Request.Kind, oneLine(a.Request.Prompt, 80), answered)
			}
			if w := c.Wait; w != nil {
				fmt.Fprintf(&b, " (on %s %s of %s: %s, %d looks, next %s)", w.Kind, w.ID, w.Server, oneLine(w.Status, 40), w.Polls, w.NextPoll)
			}
			b.WriteString("\n")
		}
	}
	switch {
	case st.Outcome != nil:
		fmt.Fprintf(&b, "\n[end] %s: %s\n", st.Outcome.Reason, st.Outcome.Message)
	case st.Status == "":
	case st.Status == state.StatusIncomplete:
		fmt.Fprintf(&b, "\n[end] incomplete (limit %s)\n", st.Limit)
	default:
		fmt.Fprintf(&b, "\n[end] %s\n", st.Status)
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// indent indents every line of s by two spaces.
func indent(s string) string {
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}

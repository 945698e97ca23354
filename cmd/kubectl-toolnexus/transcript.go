package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// A run's record lives in AgentRunRecords (internal/record): the head (status.transcriptRef)
// holds the gzipped JSON {"state": <loop.State>, "segments": [...]}; each sealed segment, named in
// segments, holds the gzipped JSON {"messages": [...]} of older messages, which come before the
// head's.

// maxTranscriptBytes bounds what the plugin decodes of one record object.
const maxTranscriptBytes = 256 << 20

// The shapes below mirror internal/record and internal/loop.State, reading only what the
// transcript shows. The plugin does not import them, which would pull the model SDKs into it;
// the tests write the record with the real types, so a drift between the two fails them.
type transcriptRecord struct {
	State    *transcriptState    `json:"state"`
	Segments []transcriptSegment `json:"segments,omitempty"`
}

type transcriptSegment struct {
	Name     string `json:"name"`
	Messages int    `json:"messages"`
}

type transcriptState struct {
	Messages []transcriptMessage `json:"messages"`
	Turn     int                 `json:"turn"`
	Model    string              `json:"model,omitempty"`
	Calls    []transcriptCall    `json:"calls,omitempty"`
	Status   string              `json:"status,omitempty"`
	Limit    string              `json:"limit,omitempty"`
	Outcome  *struct {
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"outcome,omitempty"`
}

type transcriptMessage struct {
	Role       string               `json:"role"`
	Content    string               `json:"content,omitempty"`
	ToolCalls  []transcriptToolCall `json:"toolCalls,omitempty"`
	ToolCallID string               `json:"toolCallID,omitempty"`
	IsError    bool                 `json:"isError,omitempty"`
}

type transcriptToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type transcriptCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Phase     string `json:"phase"`
	Request   *struct {
		Kind   string `json:"kind"`
		Prompt string `json:"prompt"`
	} `json:"request,omitempty"`
}

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
	if run.Status.TranscriptRef == nil || run.Status.TranscriptRef.Name == "" {
		return fmt.Errorf("agentruns.toolnexus.dev %q has no transcript yet (status.transcriptRef is empty): the run has not taken a step", name)
	}
	raw, err := o.readTranscriptObject(ctx, run.Namespace, run.Status.TranscriptRef.Name)
	if err != nil {
		return fmt.Errorf("reading the transcript of agentruns.toolnexus.dev %q: %w", name, err)
	}
	rec := &transcriptRecord{}
	if err := json.Unmarshal(raw, rec); err != nil {
		return fmt.Errorf("agentrunrecords.toolnexus.dev %q holds no readable transcript: %w", run.Status.TranscriptRef.Name, err)
	}
	if rec.State == nil {
		return fmt.Errorf("agentrunrecords.toolnexus.dev %q holds no readable transcript: the record has no state", run.Status.TranscriptRef.Name)
	}
	// The sealed segments hold the older messages, in order; the head holds the rest.
	var sealed []json.RawMessage
	for _, ref := range rec.Segments {
		data, err := o.readTranscriptObject(ctx, run.Namespace, ref.Name)
		if err != nil {
			return fmt.Errorf("reading transcript segment %q of agentruns.toolnexus.dev %q: %w", ref.Name, name, err)
		}
		var seg struct {
			Messages []json.RawMessage `json:"messages"`
		}
		if err := json.Unmarshal(data, &seg); err != nil {
			return fmt.Errorf("agentrunrecords.toolnexus.dev %q holds no readable transcript segment: %w", ref.Name, err)
		}
		sealed = append(sealed, seg.Messages...)
	}
	// Both outputs work on the raw messages, so that -o json keeps every field the controller wrote.
	var state map[string]json.RawMessage
	if err := json.Unmarshal(raw, &struct {
		State *map[string]json.RawMessage `json:"state"`
	}{&state}); err != nil {
		return err
	}
	var head []json.RawMessage
	if err := json.Unmarshal(orEmptyList(state["messages"]), &head); err != nil {
		return err
	}
	all := append(sealed, head...)
	if all == nil {
		all = []json.RawMessage{}
	}
	if state["messages"], err = json.Marshal(all); err != nil {
		return err
	}
	if o.output != "" {
		return o.printData(state)
	}
	rec.State.Messages = nil
	for _, m := range all {
		msg := transcriptMessage{}
		if err := json.Unmarshal(m, &msg); err != nil {
			return err
		}
		rec.State.Messages = append(rec.State.Messages, msg)
	}
	return printTranscript(o.out, run, rec)
}

// readTranscriptObject returns the decoded data of one AgentRunRecord.
func (o *options) readTranscriptObject(ctx context.Context, namespace, name string) ([]byte, error) {
	rec := &toolnexusv1alpha1.AgentRunRecord{}
	if err := o.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, rec); err != nil {
		return nil, err
	}
	raw, err := gunzip(rec.Data)
	if err != nil {
		return nil, fmt.Errorf("agentrunrecords.toolnexus.dev %q holds no readable transcript: %w", name, err)
	}
	return raw, nil
}

func orEmptyList(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage("[]")
	}
	return raw
}

func gunzip(data []byte) ([]byte, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("empty")
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	raw, err := io.ReadAll(io.LimitReader(zr, maxTranscriptBytes+1))
	if err == nil && len(raw) > maxTranscriptBytes {
		return nil, fmt.Errorf("it decodes to more than %d MiB", maxTranscriptBytes>>20)
	}
	return raw, err
}

func printTranscript(out io.Writer, run *toolnexusv1alpha1.AgentRun, rec *transcriptRecord) error {
	st := rec.State
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
		case "tool":
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
			if c.Request != nil {
				fmt.Fprintf(&b, " (%s: %s)", c.Request.Kind, oneLine(c.Request.Prompt, 80))
			}
			b.WriteString("\n")
		}
	}
	switch {
	case rec.State.Outcome != nil:
		fmt.Fprintf(&b, "\n[end] %s: %s\n", rec.State.Outcome.Reason, rec.State.Outcome.Message)
	case st.Status == "":
	case st.Status == "incomplete":
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

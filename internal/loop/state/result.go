package state

import (
	"github.com/toolnexus/operator/internal/tools/wire"
)

// Run statuses (toolnexus RunResult vocabulary) and incomplete limits.
const (
	StatusDone       = "done"
	StatusPending    = "pending"
	StatusIncomplete = "incomplete"

	LimitMaxTurns = "maxTurns"
	LimitTimeout  = "timeout"
)

// Result summarises the state as a toolnexus RunResult. While calls wait for an answer the status
// is StatusPending, Pending is the first open Request in call order (Open) and Text its prompt.
func (st *State) Result() RunResult {
	res := RunResult{
		Text:          st.Text,
		Messages:      append([]Message(nil), st.Messages...),
		ToolCalls:     append([]ToolCall(nil), st.ToolCalls...),
		ToolCallCount: st.ToolCallCount,
		Turns:         st.Turn,
		Usage:         st.Usage,
		Model:         st.Model,
		Status:        st.Status,
		Limit:         st.Limit,
	}
	if open := st.Open(); st.Status == "" && len(open) > 0 {
		req := open[0].Ask.Request
		res.Status, res.Pending, res.Text = StatusPending, &req, req.Prompt
	}
	return res
}

// RunResult mirrors the toolnexus RunResult. While pending, Messages and ToolCalls hold what is
// finished: the results of the open turn are recorded together once every call has one, so the
// transcript never carries a placeholder.
type RunResult struct {
	Text          string        `json:"text"`
	Messages      []Message     `json:"messages"`
	ToolCalls     []ToolCall    `json:"toolCalls"`
	ToolCallCount int           `json:"toolCallCount"`
	Turns         int           `json:"turns"`
	Usage         Usage         `json:"usage"`
	Model         string        `json:"model"`
	Status        string        `json:"status"`
	Limit         string        `json:"limit,omitempty"`
	Pending       *wire.Request `json:"pending,omitempty"`
}

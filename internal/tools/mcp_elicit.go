package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// elicitBridge turns the elicitations of one tool call into suspensions (README, "MCP servers").
// Only a 2025-11-25 server elicits within a call (an elicitation/create request on its session);
// a 2026-07-28 server asks in an input_required result instead, which parks as a round
// (mcp_round.go) and needs no bridge.
//
// An elicitation lives inside an open tool call, but a suspension ends the call, and the answer
// may come hours later to another manager process. So the bridge does not hold the call open:
//
//   - First execution: the elicitation arrives with no answer. The bridge records it as the
//     call's Request and answers the server "cancel" (the user dismissed it), so the server
//     unwinds its handler through the protocol's own path and the call ends normally. Its result
//     is discarded and the call returns the suspension. Cancelling the call's context instead
//     would race the SDK's asynchronous notifications/cancelled against closing the session and
//     could leave the server's handler waiting on an elicitation nobody answers.
//   - Re-execution with tc.Answer: the call runs again from the start. When the server elicits
//     again and the elicitation's id (derived from the call id, mode, message and schema, see
//     elicitationID) equals the answer's id, the bridge replays the answer once; the call then
//     returns whatever the tool returns. Any other elicitation suspends the call again.
type elicitBridge struct {
	callID string
	answer *Answer

	mu       sync.Mutex
	replayed bool
	pending  *Request
}

func (b *elicitBridge) handle(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	r := elicitationRequest(b.callID, req.Params)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.answer != nil && !b.replayed && b.answer.ID == r.ID {
		b.replayed = true
		return elicitResult(*b.answer, r.Kind == KindInput), nil
	}
	if b.pending == nil {
		b.pending = &r
	}
	return &mcp.ElicitResult{Action: "cancel"}, nil
}

// suspension is the Request the call was abandoned for, or nil.
func (b *elicitBridge) suspension() *Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pending
}

// elicitationRequest maps an elicitation to a Request: form mode asks for input against the
// requested schema, URL mode asks for an authorization at the URL. Its id is derived from scope
// (the call id; for an input request of a round, the call id and the request's key) and the
// elicitation (elicitationID).
func elicitationRequest(scope string, p *mcp.ElicitParams) Request {
	if p == nil {
		p = &mcp.ElicitParams{}
	}
	if p.Mode == "url" || (p.Mode == "" && (p.URL != "" || p.ElicitationID != "")) {
		r := Request{ID: elicitationID(scope, "url", p.Message, nil), Kind: KindAuthorization, Prompt: p.Message, URL: p.URL}
		if r.Prompt == "" {
			r.Prompt = DefaultAuthPrompt
		}
		if p.ElicitationID != "" {
			r.Data = map[string]any{"elicitationId": p.ElicitationID}
		}
		return r
	}
	schema := jsonNative(p.RequestedSchema)
	return Request{ID: elicitationID(scope, "form", p.Message, schema), Kind: KindInput, Prompt: p.Message,
		Data: map[string]any{"schema": schema}}
}

// elicitationID is "elc-" and a digest of what makes an elicitation the same question when the
// call is re-executed: its scope (elicitationRequest), the mode, the message and (for forms) the
// schema. A URL is left out: it often carries a fresh state or elicitation id on every attempt.
func elicitationID(scope, mode, message string, schema any) string {
	raw, _ := json.Marshal([]any{scope, mode, message, schema})
	sum := sha256.Sum256(raw)
	return "elc-" + hex.EncodeToString(sum[:8])
}

// elicitResult maps an Answer back (toolnexus §2): ok accepts with the answer's data as the
// form content, "declined" declines, and anything else cancels.
func elicitResult(a Answer, form bool) *mcp.ElicitResult {
	switch {
	case a.OK && form:
		content := a.Data
		if content == nil {
			content = map[string]any{}
		}
		return &mcp.ElicitResult{Action: "accept", Content: content}
	case a.OK:
		return &mcp.ElicitResult{Action: "accept"}
	case a.Reason == ReasonDeclined:
		return &mcp.ElicitResult{Action: "decline"}
	}
	return &mcp.ElicitResult{Action: "cancel"}
}

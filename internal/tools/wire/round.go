package wire

import (
	"fmt"
	"strings"
)

// A round is a suspension that asks several things at once: an MCP tools/call answered with
// resultType input_required and its inputRequests (revision 2026-07-28). Each request is
// published and answered on its own; once every one is answered, the tool runs again once, with
// all the answers and what it asked to be handed back with them (Resume: an MCP requestState),
// verbatim. A refusal of any one ends the call as the refusal of a single request does.

// Round bounds: what a tool asks here is stored in the run's record, and each request becomes a
// PendingRequest.
const (
	MaxResumeBytes = 64 << 10
	MaxRoundAsks   = 16
	MaxAskKeyBytes = 256
)

// roundKey is the ToolResult.Metadata key that marks a suspension as a round.
const roundKey = "round"

// Round is what a call asks in one go.
type Round struct {
	// Resume is what the tool must be handed back with the answers, opaque to everyone else.
	Resume string `json:"resume,omitempty"`
	Asks   []Ask  `json:"asks"`
}

// Ask is one request of a round under the tool's own key for it (an MCP input request's key).
type Ask struct {
	Key     string  `json:"key"`
	Request Request `json:"request"`
	// Answer is set when the tool runs again with the round's answers.
	Answer *Answer `json:"answer,omitempty"`
}

// Asking is the result of a call that asks the round r. It is a suspension on r's first request
// as well (PendingOf), so whatever counts suspensions counts it.
func Asking(r Round) ToolResult {
	prompts := make([]string, 0, len(r.Asks))
	for _, a := range r.Asks {
		prompts = append(prompts, a.Request.Prompt)
	}
	res := ToolResult{Output: strings.Join(prompts, "\n"), IsError: true, Metadata: map[string]any{roundKey: r}}
	if len(r.Asks) > 0 {
		res.Metadata[pendingKey] = r.Asks[0].Request
	}
	return res
}

// RoundOf returns the round r asks, or nil.
func RoundOf(r ToolResult) *Round {
	switch v := r.Metadata[roundKey].(type) {
	case Round:
		return &v
	case *Round:
		return v
	}
	return nil
}

// CheckBounds returns an error naming what of r the record or its PendingRequests cannot hold
// ("it asks 20 requests at once; at most 16 are answered"), or nil. Each request's own bounds are
// Request.CheckBounds'.
func (r Round) CheckBounds() error {
	switch n := len(r.Asks); {
	case n == 0:
		return fmt.Errorf("it asks for input without any request")
	case n > MaxRoundAsks:
		return fmt.Errorf("it asks %d requests at once; at most %d are answered", n, MaxRoundAsks)
	}
	if n := len(r.Resume); n > MaxResumeBytes {
		return fmt.Errorf("the state it asks to be handed back with the answers (requestState) is %d bytes; at most %d fit in the run's record", n, MaxResumeBytes)
	}
	keys, ids := map[string]bool{}, map[string]bool{}
	for _, a := range r.Asks {
		switch {
		case a.Key == "" || len(a.Key) > MaxAskKeyBytes:
			return fmt.Errorf("the key of a request is %d bytes; 1 to %d fit", len(a.Key), MaxAskKeyBytes)
		case keys[a.Key]:
			return fmt.Errorf("two of its requests have the key %q", a.Key)
		case ids[a.Request.ID]:
			return fmt.Errorf("two of its requests have the id %q", a.Request.ID)
		}
		keys[a.Key], ids[a.Request.ID] = true, true
	}
	return nil
}

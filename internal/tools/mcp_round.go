package tools

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Multi round-trip input (MCP 2026-07-28): a tools/call answered with resultType input_required
// carries inputRequests and an opaque requestState. The call does not answer them itself (the
// SDK would, within the call, and hold it open): it returns them as a Round (Asking), one request
// per input request in key order, with the requestState as the round's Resume. The loop parks
// the call on them, one PendingRequest each, holding no connection, and once every one is
// answered runs the call again with ToolContext.Round: the same tools/call with every answer in
// inputResponses and the requestState verbatim. What the server makes of it (a result, an error
// for a requestState it refuses, another round) is the call's result.

// asking is the round a server asked for: requests by key, and its requestState. The prompts are
// redacted with hdrs, as the results of the same session are.
func asking(callID string, requests map[string]*mcp.ElicitParams, requestState string, hdrs resolvedHeaders, fail func(string) ToolResult) ToolResult {
	if len(requests) == 0 {
		// The SDK reads it as a server shedding load; a retry now would most likely be shed too.
		return fail("the server answered input_required without any input request (it may be shedding load); the call was not retried")
	}
	keys := make([]string, 0, len(requests))
	for key := range requests {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	round := Round{Resume: requestState}
	for _, key := range keys {
		p := *requests[key]
		p.Message = hdrs.redact(p.Message)
		// The key is part of the id: two input requests of a round may ask the same question.
		round.Asks = append(round.Asks, Ask{Key: key, Request: elicitationRequest(callID+"/"+key, &p)})
	}
	return Asking(round)
}

// inputResponses are a round's answers as the server's inputResponses, by key. The loop runs the
// call again only once every request was answered ok: true.
func inputResponses(r *Round) map[string]*mcp.ElicitResult {
	out := make(map[string]*mcp.ElicitResult, len(r.Asks))
	for _, a := range r.Asks {
		answer := Answer{}
		if a.Answer != nil {
			answer = *a.Answer
		}
		out[a.Key] = elicitResult(answer, a.Request.Kind == KindInput)
	}
	return out
}

// elicitations reads the input requests of a raw result (taskRPC), by key.
func elicitations(raw map[string]json.RawMessage) (map[string]*mcp.ElicitParams, error) {
	out := make(map[string]*mcp.ElicitParams, len(raw))
	for key, ir := range raw {
		p, err := elicitation(ir)
		if err != nil {
			return nil, fmt.Errorf("input request %q: %w", key, err)
		}
		out[key] = p
	}
	return out, nil
}

package tools

import (
	"encoding/json"
	"fmt"
	"strings"
)

// interpretHTTP maps an HTTP response to a tool result (README, "HTTP tools"): non-2xx is an error, a 2xx
// body is the output unless it speaks the suspension protocol.
func interpretHTTP(status int, body string, truncated bool, total int64, limit int) ToolResult {
	text := capOutput(body, limit, truncated, total)
	if status < 200 || status > 299 {
		return ToolResult{Output: fmt.Sprintf("HTTP %d: %s", status, text), IsError: true}
	}
	// A truncated body cannot be a complete JSON document, so it is only ever output.
	if !truncated {
		if r, ok := protocolResult(body); ok {
			return r
		}
	}
	return ToolResult{Output: text}
}

// protocolResult recognises the two JSON shapes a tool server may answer with: the LangSmith
// Fleet auth-required object and a toolnexus ToolResult.
func protocolResult(body string) (ToolResult, bool) {
	body = strings.TrimSpace(body)
	if !strings.HasPrefix(body, "{") {
		return ToolResult{}, false
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal([]byte(body), &fields) != nil {
		return ToolResult{}, false
	}
	if r, ok := authRequiredResult(fields); ok {
		return r, true
	}
	return wireToolResult(fields)
}

// authRequiredResult reads {"auth_required": true, "auth_url": U, "auth_id": I}.
func authRequiredResult(fields map[string]json.RawMessage) (ToolResult, bool) {
	var required bool
	if json.Unmarshal(fields["auth_required"], &required) != nil || !required {
		return ToolResult{}, false
	}
	req := Request{Kind: KindAuthorization, Prompt: DefaultAuthPrompt}
	_ = json.Unmarshal(fields["auth_url"], &req.URL)
	var id any
	if json.Unmarshal(fields["auth_id"], &id) == nil && id != nil {
		req.Data = map[string]any{"auth_id": id}
	}
	return Pending(req), true
}

// toolResultKeys are the keys a toolnexus ToolResult may carry. A body with any other key is an
// ordinary JSON answer that happens to have an "output" field, and is passed on verbatim.
var toolResultKeys = map[string]bool{"output": true, "isError": true, "metadata": true, "parts": true}

func wireToolResult(fields map[string]json.RawMessage) (ToolResult, bool) {
	for k := range fields {
		if !toolResultKeys[k] {
			return ToolResult{}, false
		}
	}
	var r ToolResult
	if json.Unmarshal(fields["output"], &r.Output) != nil {
		return ToolResult{}, false
	}
	if raw, ok := fields["isError"]; ok && json.Unmarshal(raw, &r.IsError) != nil {
		return ToolResult{}, false
	}
	if raw, ok := fields["metadata"]; ok && json.Unmarshal(raw, &r.Metadata) != nil {
		return ToolResult{}, false
	}
	if req := PendingOf(r); req != nil {
		return Pending(*req), true
	}
	return ToolResult{Output: r.Output, IsError: r.IsError}, true
}

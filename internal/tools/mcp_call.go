package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// call runs one tool call in its own session (see MCPServer). Every failure is an error result
// naming the server and the tool; nothing here panics or waits past the spec's timeout.
func (s *MCPServer) call(ctx context.Context, name string, args map[string]any, tc *ToolContext) ToolResult {
	if tc == nil {
		tc = &ToolContext{}
	}
	fail := func(msg string) ToolResult {
		return ToolResult{Output: fmt.Sprintf("MCP server %s: tool %s: %s", s.spec.Name, name, msg), IsError: true}
	}
	if args == nil {
		args = map[string]any{}
	}
	if tc.Wait != nil || s.tasks {
		callCtx, cancel := context.WithTimeout(ctx, s.spec.Timeout)
		defer cancel()
		if tc.Wait != nil {
			return s.pollTask(callCtx, tc, fail)
		}
		return s.callAsTask(callCtx, name, args, tc, fail)
	}

	// Only a 2025-11-25 server elicits within the call; the bridge answers it (mcp_elicit.go).
	bridge := &elicitBridge{callID: tc.CallID, answer: tc.Answer}
	session, err := s.open(ctx, bridge.handle)
	if err != nil {
		return fail(err.Error())
	}
	defer closeSession(session.ClientSession)
	callCtx, cancel := context.WithTimeout(ctx, s.spec.Timeout)
	defer cancel()
	params := &mcp.CallToolParams{Meta: map[string]any{}, Name: name, Arguments: args}
	traceparent(ctx, params.Meta)
	if r := tc.Round; r != nil {
		responses := mcp.InputResponseMap{}
		for key, resp := range inputResponses(r) {
			responses[key] = resp
		}
		params.InputResponses, params.RequestState = responses, r.Resume
	}
	res, err := session.CallTool(callCtx, params)
	// A call that elicited without an answer ends as that suspension, whatever the server
	// made of the "cancel" it was given.
	if req := bridge.suspension(); req != nil {
		return Pending(*req)
	}
	if err != nil {
		if req, ok := urlElicitationRequired(tc.CallID, err); ok {
			// The server wants a URL visited before it runs the tool; after the answer the
			// loop re-executes the call, which is the retry the error asks for.
			return Pending(req)
		}
		if errors.Is(callCtx.Err(), context.DeadlineExceeded) {
			return fail(fmt.Sprintf("no result within %s", s.spec.Timeout))
		}
		return fail(session.explain(err))
	}
	if res.NeedsInput() {
		asked := make(map[string]*mcp.ElicitParams, len(res.InputRequests))
		for key, ir := range res.InputRequests {
			p, ok := ir.(*mcp.ElicitParams)
			if !ok {
				return fail(fmt.Sprintf("input request %q asks for %T; this client declares only elicitation", key, ir))
			}
			asked[key] = p
		}
		return asking(tc.CallID, asked, res.RequestState, session.hdrs, fail)
	}
	out := mcpResult(res)
	out.Output = capOutput(session.hdrs.redact(out.Output), s.spec.MaxOutputBytes, false, -1)
	return out
}

// mcpResult maps a tool result as toolnexus §2 does: an error is its joined text, structured
// content is its JSON, anything else the joined content.
func mcpResult(res *mcp.CallToolResult) ToolResult {
	text := joinContent(res.Content)
	if res.IsError {
		if text == "" {
			text = "the tool reported an error without a message"
		}
		return ToolResult{Output: text, IsError: true}
	}
	if res.StructuredContent != nil {
		if raw, err := json.Marshal(res.StructuredContent); err == nil {
			return ToolResult{Output: string(raw)}
		}
	}
	return ToolResult{Output: text}
}

// joinContent renders the content blocks one per line. Binary blocks become a short label: the
// model cannot read base64, and the size tells it what it missed.
func joinContent(content []mcp.Content) string {
	parts := make([]string, 0, len(content))
	for _, c := range content {
		switch c := c.(type) {
		case *mcp.TextContent:
			parts = append(parts, c.Text)
		case *mcp.ImageContent:
			parts = append(parts, fmt.Sprintf("[image (%s, %d bytes)]", c.MIMEType, len(c.Data)))
		case *mcp.AudioContent:
			parts = append(parts, fmt.Sprintf("[audio (%s, %d bytes)]", c.MIMEType, len(c.Data)))
		case *mcp.ResourceLink:
			parts = append(parts, fmt.Sprintf("[resource link %s]", c.URI))
		case *mcp.EmbeddedResource:
			if r := c.Resource; r != nil && r.Blob == nil {
				parts = append(parts, r.Text)
			} else if r != nil {
				parts = append(parts, fmt.Sprintf("[resource %s (%s, %d bytes)]", r.URI, r.MIMEType, len(r.Blob)))
			}
		default:
			parts = append(parts, fmt.Sprintf("[unsupported %T content]", c))
		}
	}
	return strings.Join(parts, "\n")
}

// urlElicitationRequired reads a URLElicitationRequired error (-32042) into an authorization
// Request for its first elicitation.
func urlElicitationRequired(callID string, err error) (Request, bool) {
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != mcp.CodeURLElicitationRequired {
		return Request{}, false
	}
	var data struct {
		Elicitations []*mcp.ElicitParams `json:"elicitations"`
	}
	if json.Unmarshal(rpcErr.Data, &data) != nil || len(data.Elicitations) == 0 || data.Elicitations[0] == nil {
		return Request{}, false
	}
	p := *data.Elicitations[0]
	p.Mode = "url"
	if p.Message == "" {
		p.Message = rpcErr.Message
	}
	return elicitationRequest(callID, &p), true
}

package main

import (
	"context"
	"fmt"
	"net/http"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type bookMeetingArgs struct {
	Topic string `json:"topic" jsonschema:"what the meeting is about"`
}

// mcpHandler serves one MCP server over streamable HTTP. Its tool book_meeting asks the user for
// a time through a form elicitation, which the operator turns into an input PendingRequest whose
// data.schema is the form; the answer's data becomes the form's content.
func mcpHandler() http.Handler {
	server := mcp.NewServer(&mcp.Implementation{Name: "toolnexus-sample-tools", Version: "v0.1.0"}, nil)
	mcp.AddTool(server, &mcp.Tool{
		Name:        "book_meeting",
		Description: "Books a meeting about a topic; asks the user for the time.",
	}, bookMeeting)
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
}

func bookMeeting(ctx context.Context, req *mcp.CallToolRequest, args bookMeetingArgs) (*mcp.CallToolResult, any, error) {
	topic := orDefault(args.Topic, "an unnamed topic")
	res, err := req.Session.Elicit(ctx, &mcp.ElicitParams{
		Message: "When should the meeting about " + topic + " be?",
		RequestedSchema: &jsonschema.Schema{
			Type:     "object",
			Required: []string{"time"},
			Properties: map[string]*jsonschema.Schema{
				"time": {Type: "string", Description: "for example 2026-12-01 10:00"},
			},
		},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("asking for the meeting time: %w", err)
	}
	if res.Action != "accept" {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{
			&mcp.TextContent{Text: "meeting about " + topic + " not booked: the user chose " + res.Action},
		}}, nil, nil
	}
	when, _ := res.Content["time"].(string)
	return &mcp.CallToolResult{Content: []mcp.Content{
		&mcp.TextContent{Text: "meeting about " + topic + " booked for " + when},
	}}, nil, nil
}

package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
)

// Source says where a tool comes from.
type Source string

// Tool sources.
const (
	SourceNative  Source = "native"
	SourceHTTP    Source = "http"
	SourceMCP     Source = "mcp"
	SourceBuiltin Source = "builtin"
	SourceA2A     Source = "a2a"
)

// ToolContext is what a tool knows about the call beyond its arguments.
type ToolContext struct {
	// Answer is set only on the retry after a suspension was answered with ok: true.
	Answer *Answer
	// CallID is the model's id of this tool call.
	CallID string
	// IdempotencyKey is stable across re-executions of the same call (at-least-once delivery).
	IdempotencyKey string
	// Wait is set when the call waits on external work it started (Waiting): the tool looks at
	// that work (and hands it Answer, when set) instead of starting it again.
	Wait *Wait
	// Round is set on the retry after every request of a round the call asked (Asking) was
	// answered with ok: true: the round as asked, each request with its answer. Answer is then nil.
	Round *Round
}

// Tool is one callable tool.
type Tool struct {
	Name        string
	Description string
	// InputSchema is a JSON Schema object describing the arguments.
	InputSchema map[string]any
	Source      Source
	// URL is where a call goes, as the spec says it: an HTTP tool's URL (its template), an MCP
	// tool's server URL; empty for tools of the process. Remote is an MCP tool's own name on its
	// server. A run's author chooses Name (and an MCP server's prefix), not what these point at:
	// an ApprovalPolicy that must hold whatever a tool is called matches them.
	URL, Remote string
	Execute     func(ctx context.Context, args map[string]any, tc *ToolContext) (ToolResult, error)
}

// NativeTool wraps a Go function as a tool. fn's value maps as follows: a string is the output, a
// ToolResult is returned as is (so a native tool can suspend), anything else is marshalled to JSON,
// and an error becomes an error result carrying its message.
func NativeTool(name, description string, schema map[string]any,
	fn func(ctx context.Context, args map[string]any, tc *ToolContext) (any, error)) Tool {
	if schema == nil {
		schema = map[string]any{"type": "object", "properties": map[string]any{}}
	}
	return Tool{
		Name: Sanitize(name), Description: description, InputSchema: schema, Source: SourceNative,
		Execute: func(ctx context.Context, args map[string]any, tc *ToolContext) (ToolResult, error) {
			v, err := fn(ctx, args, tc)
			if err != nil {
				return ToolResult{Output: err.Error(), IsError: true}, nil
			}
			return resultOf(v)
		},
	}
}

func resultOf(v any) (ToolResult, error) {
	switch r := v.(type) {
	case string:
		return ToolResult{Output: r}, nil
	case ToolResult:
		return r, nil
	case *ToolResult:
		if r == nil {
			return ToolResult{}, nil
		}
		return *r, nil
	case nil:
		return ToolResult{}, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return ToolResult{Output: fmt.Sprintf("tool returned a value that is not JSON: %v", err), IsError: true}, nil
	}
	return ToolResult{Output: string(raw)}, nil
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9_-]`)

// Sanitize replaces every character outside [a-zA-Z0-9_-] with an underscore.
func Sanitize(name string) string {
	return unsafeName.ReplaceAllString(name, "_")
}

// Toolkit is an ordered set of tools addressed by name.
type Toolkit struct {
	tools  []Tool
	byName map[string]int
	// unreachable maps the tool-name prefix of an MCP server that could not be reached to why.
	unreachable map[string]string
}

// NewToolkit builds a toolkit. When two tools share a name the first wins and the second is
// logged and dropped.
func NewToolkit(tools ...Tool) (*Toolkit, error) {
	tk := &Toolkit{byName: make(map[string]int, len(tools))}
	for _, t := range tools {
		if t.Name == "" {
			return nil, fmt.Errorf("toolnexus: a tool has no name")
		}
		if t.Execute == nil {
			return nil, fmt.Errorf("toolnexus: tool %q has no Execute function", t.Name)
		}
		if _, dup := tk.byName[t.Name]; dup {
			slog.Warn("Dropping duplicate tool; the first one with this name wins", "tool", t.Name, "source", t.Source)
			continue
		}
		tk.byName[t.Name] = len(tk.tools)
		tk.tools = append(tk.tools, t)
	}
	return tk, nil
}

// Tools returns the tools in order. The slice must not be modified.
func (tk *Toolkit) Tools() []Tool {
	if tk == nil {
		return nil
	}
	return tk.tools
}

// Unreachable records that the MCP server named server could not be reached: a call to one of its
// tools (the model may have been shown them before) gets an error result saying so, not
// "Unknown tool".
func (tk *Toolkit) Unreachable(server string, err error) {
	if tk.unreachable == nil {
		tk.unreachable = map[string]string{}
	}
	tk.unreachable[Sanitize(server)+"_"] = fmt.Sprintf("MCP server %s: tool %%s: the server cannot be reached: %v", server, err)
}

// Lookup returns the tool named name.
func (tk *Toolkit) Lookup(name string) (Tool, bool) {
	if tk == nil {
		return Tool{}, false
	}
	i, ok := tk.byName[name]
	if !ok {
		return Tool{}, false
	}
	return tk.tools[i], true
}

// Execute runs the named tool. An unknown name yields the error result "Unknown tool: <name>";
// an error returned by the tool becomes an error result carrying its message.
func (tk *Toolkit) Execute(ctx context.Context, name string, args map[string]any, tc *ToolContext) ToolResult {
	t, ok := tk.Lookup(name)
	if !ok && tk != nil {
		for prefix, reason := range tk.unreachable {
			if tool, found := strings.CutPrefix(name, prefix); found {
				return ToolResult{Output: fmt.Sprintf(reason, tool), IsError: true}
			}
		}
	}
	if !ok {
		return ToolResult{Output: "Unknown tool: " + name, IsError: true}
	}
	if tc == nil {
		tc = &ToolContext{}
	}
	res, err := t.Execute(ctx, args, tc)
	if err != nil {
		return ToolResult{Output: err.Error(), IsError: true}
	}
	return res
}

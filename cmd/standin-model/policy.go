package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/toolnexus/operator/internal/loop/looptest"
)

// reply is the assistant message the stand-in decided on.
type reply struct {
	Content   string
	ToolCalls []looptest.ChatToolCall
}

// decide applies the documented policy (see the package comment) to one request.
func decide(req looptest.ChatRequest) reply {
	lastUser := -1
	for i, m := range req.Messages {
		if m.Role == "user" {
			lastUser = i
		}
	}
	prompt := ""
	if lastUser >= 0 {
		prompt = req.Messages[lastUser].Text()
	}
	if results := toolResultsAfter(req.Messages, lastUser); len(results) > 0 {
		return reply{Content: "Stand-in model: " + strings.Join(results, "; ")}
	}
	if len(req.Tools) == 0 {
		return reply{Content: "Stand-in model: you said: " + prompt}
	}
	tool := pickTool(req.Tools, prompt)
	args, _ := json.Marshal(synthesise(tool.Function.Parameters, prompt, ""))
	return reply{ToolCalls: []looptest.ChatToolCall{{
		ID:   fmt.Sprintf("call_%d", countRole(req.Messages, "assistant")+1),
		Type: "function", Function: looptest.ChatFunctionCall{Name: tool.Function.Name, Arguments: string(args)},
	}}}
}

// toolResultsAfter renders the tool results that follow message index from, in order.
func toolResultsAfter(msgs []looptest.ChatMessage, from int) []string {
	names := map[string]string{}
	var out []string
	for _, m := range msgs[from+1:] {
		for _, tc := range m.ToolCalls {
			names[tc.ID] = tc.Function.Name
		}
		if m.Role != "tool" {
			continue
		}
		name := names[m.ToolCallID]
		if name == "" {
			name = "the tool"
		}
		out = append(out, name+" returned: "+m.Text())
	}
	return out
}

func countRole(msgs []looptest.ChatMessage, role string) int {
	n := 0
	for _, m := range msgs {
		if m.Role == role {
			n++
		}
	}
	return n
}

var wordPattern = regexp.MustCompile(`[A-Za-z0-9]+`)

// commonWords never decide which tool matches, nor become an argument.
var commonWords = map[string]bool{
	"the": true, "and": true, "for": true, "with": true, "from": true, "into": true, "that": true,
	"this": true, "please": true, "can": true, "you": true, "your": true, "our": true, "are": true,
	"was": true, "what": true, "which": true, "who": true, "how": true, "when": true, "then": true,
	"tool": true, "call": true, "use": true, "some": true, "any": true, "all": true, "out": true,
	"about": true, "should": true, "would": true, "could": true, "will": true, "have": true,
	"has": true, "not": true, "but": true, "get": true, "let": true, "me": true, "my": true,
}

func words(s string) []string {
	var out []string
	for _, w := range wordPattern.FindAllString(strings.ToLower(s), -1) {
		if len(w) >= 3 && !commonWords[w] {
			out = append(out, w)
		}
	}
	return out
}

// pickTool returns the first tool sharing a word with the prompt, else the first tool. Words are
// compared by prefix both ways, so "deploy" matches "deployment" and "events" matches "event".
func pickTool(tools []looptest.ChatTool, prompt string) looptest.ChatTool {
	promptWords := words(prompt)
	for _, t := range tools {
		toolWords := words(strings.NewReplacer("_", " ", "-", " ").Replace(t.Function.Name) + " " + t.Function.Description)
		for _, tw := range toolWords {
			for _, pw := range promptWords {
				if strings.HasPrefix(tw, pw) || strings.HasPrefix(pw, tw) {
					return t
				}
			}
		}
	}
	return tools[0]
}

var (
	assignmentPattern = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_-]*)=("[^"]*"|\S+)`)
	numberPattern     = regexp.MustCompile(`-?\d+(\.\d+)?`)
)

// wholePromptNames are string properties that get the whole prompt rather than one word.
var wholePromptNames = map[string]bool{
	"question": true, "prompt": true, "message": true, "text": true, "query": true, "reason": true,
}

// synthesise builds a value for schema from the prompt; name is the property being filled.
func synthesise(schema map[string]any, prompt, name string) any {
	if v, ok := assignment(prompt, name); ok {
		return convert(v, schema)
	}
	if d, ok := schema["default"]; ok {
		return d
	}
	if enum, ok := schema["enum"].([]any); ok && len(enum) > 0 {
		return enum[0]
	}
	typ, _ := schema["type"].(string)
	props, _ := schema["properties"].(map[string]any)
	if typ == "" && props != nil {
		typ = "object"
	}
	switch typ {
	case "object", "":
		obj := map[string]any{}
		for _, key := range fillKeys(schema, props) {
			sub, _ := props[key].(map[string]any)
			obj[key] = synthesise(sub, prompt, key)
		}
		return obj
	case "array":
		items, _ := schema["items"].(map[string]any)
		return []any{synthesise(items, prompt, name)}
	case "integer":
		if n := numberPattern.FindString(prompt); n != "" {
			if i, err := strconv.ParseFloat(n, 64); err == nil {
				return int64(i)
			}
		}
		return 1
	case "number":
		if n := numberPattern.FindString(prompt); n != "" {
			if f, err := strconv.ParseFloat(n, 64); err == nil {
				return f
			}
		}
		return 1
	case "boolean":
		return true
	}
	if wholePromptNames[strings.ToLower(name)] {
		return strings.TrimSpace(prompt)
	}
	return lastWord(prompt)
}

// fillKeys are the properties to fill: the required ones, or all when none is required.
func fillKeys(schema, props map[string]any) []string {
	var keys []string
	if req, ok := schema["required"].([]any); ok && len(req) > 0 {
		for _, k := range req {
			if s, ok := k.(string); ok {
				keys = append(keys, s)
			}
		}
		return keys
	}
	for k := range props {
		keys = append(keys, k)
	}
	// Map order is random; sorting keeps the policy deterministic (the JSON is sorted anyway).
	sort.Strings(keys)
	return keys
}

// assignment finds "name=value" in the prompt.
func assignment(prompt, name string) (string, bool) {
	if name == "" {
		return "", false
	}
	for _, m := range assignmentPattern.FindAllStringSubmatch(prompt, -1) {
		if strings.EqualFold(m[1], name) {
			return strings.Trim(m[2], `"`), true
		}
	}
	return "", false
}

func convert(v string, schema map[string]any) any {
	switch schema["type"] {
	case "integer":
		if i, err := strconv.ParseInt(v, 10, 64); err == nil {
			return i
		}
	case "number":
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			return f
		}
	case "boolean":
		if b, err := strconv.ParseBool(v); err == nil {
			return b
		}
	}
	return v
}

// lastWord is the prompt's last word that is not a common word or an assignment, else "example".
func lastWord(prompt string) string {
	prompt = assignmentPattern.ReplaceAllString(prompt, " ")
	ws := words(prompt)
	for i := len(ws) - 1; i >= 0; i-- {
		if numberPattern.FindString(ws[i]) != ws[i] {
			return ws[i]
		}
	}
	return "example"
}

// completion wraps a reply in the chat completion response format.
func completion(req looptest.ChatRequest, r reply) looptest.ChatCompletion {
	msg := looptest.AssistantText(r.Content)
	if len(r.ToolCalls) > 0 {
		msg = looptest.AssistantToolCalls(r.ToolCalls...)
	}
	promptTokens := 0
	for _, m := range req.Messages {
		promptTokens += len(strings.Fields(m.Text())) + 1
	}
	completionTokens := len(strings.Fields(r.Content)) + 1
	for _, tc := range r.ToolCalls {
		completionTokens += len(strings.Fields(tc.Function.Arguments)) + 1
	}
	c := looptest.NewCompletion(fmt.Sprintf("chatcmpl-standin-%d", len(req.Messages)), standinModel, msg, looptest.ChatUsage{
		PromptTokens: promptTokens, CompletionTokens: completionTokens, TotalTokens: promptTokens + completionTokens,
	})
	c.Created, c.SystemFingerprint = time.Now().Unix(), standinFingerprint
	return c
}

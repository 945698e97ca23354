// Package wire is the toolnexus suspension vocabulary: a tool's result, the Request a suspended
// call parks on a person, and the Answer that resolves it. It is plain data with no dependencies
// beyond the standard library, so the record format and the kubectl plugin can read it; package
// tools re-exports it as part of the tool model.
package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync/atomic"
	"time"
)

// Request kinds of the toolnexus vocabulary. The vocabulary is open: a tool may use its own.
const (
	KindAuthorization = "authorization"
	KindApproval      = "approval"
	KindInput         = "input"
	KindQuestion      = "question"
	KindToolCall      = "tool_call"
)

// Answer reasons used when ok is false.
const (
	ReasonDeclined  = "declined"
	ReasonCancelled = "cancelled"
	ReasonExpired   = "expired"
)

// DefaultAuthPrompt is the prompt of an authorization request that names none.
const DefaultAuthPrompt = "Authorization required to continue"

// Answer data keys the loop reads back, in precedence order.
const (
	ResultsKey = "results"
	OutputKey  = "output"
)

// RecognisedKeys are the Answer.Data keys that carry a tool result, in precedence order.
var RecognisedKeys = []string{ResultsKey, OutputKey}

// pendingKey is the ToolResult.Metadata key that marks a result as a suspension.
const pendingKey = "pending"

// Request is a suspended tool call's question to a person or an automation (toolnexus §10).
type Request struct {
	ID        string         `json:"id"`
	Kind      string         `json:"kind"`
	Prompt    string         `json:"prompt"`
	URL       string         `json:"url,omitempty"`
	Data      map[string]any `json:"data,omitempty"`
	ExpiresAt string         `json:"expiresAt,omitempty"`
}

// Answer resolves a Request. Data carries the result for kinds that need one.
type Answer struct {
	ID     string         `json:"id"`
	OK     bool           `json:"ok"`
	Data   map[string]any `json:"data,omitempty"`
	Reason string         `json:"reason,omitempty"`
}

// ToolResult is what a tool returns. It is a suspension iff Metadata["pending"] is a Request.
type ToolResult struct {
	Output   string         `json:"output"`
	IsError  bool           `json:"isError"`
	Metadata map[string]any `json:"metadata,omitempty"`
}

var pendingSeq atomic.Uint64

// newRequestID returns "pnd-<base36 unix ms>-<seq>", unique within the process.
func newRequestID() string {
	return "pnd-" + strconv.FormatInt(time.Now().UnixMilli(), 36) + "-" + strconv.FormatUint(pendingSeq.Add(1), 10)
}

// Pending returns the suspension result for req. An empty ID is generated. The output is the
// prompt, followed by a newline and the URL when one is set.
func Pending(req Request) ToolResult {
	if req.ID == "" {
		req.ID = newRequestID()
	}
	out := req.Prompt
	if req.URL != "" {
		out += "\n" + req.URL
	}
	return ToolResult{Output: out, IsError: true, Metadata: map[string]any{pendingKey: req}}
}

// AuthRequired returns an authorization suspension for url. An empty prompt becomes
// DefaultAuthPrompt.
func AuthRequired(url, prompt string) ToolResult {
	if prompt == "" {
		prompt = DefaultAuthPrompt
	}
	return Pending(Request{Kind: KindAuthorization, Prompt: prompt, URL: url})
}

// PendingOf returns the Request that makes r a suspension, or nil. It recognises a Request value,
// a pointer to one, and a Request that went through JSON (a map with at least kind or prompt).
func PendingOf(r ToolResult) *Request {
	v, ok := r.Metadata[pendingKey]
	if !ok || v == nil {
		return nil
	}
	switch p := v.(type) {
	case Request:
		return &p
	case *Request:
		return p
	case map[string]any:
		raw, err := json.Marshal(p)
		if err != nil {
			return nil
		}
		var req Request
		if json.Unmarshal(raw, &req) != nil || (req.Kind == "" && req.Prompt == "") {
			return nil
		}
		return &req
	}
	return nil
}

// AnswerOutput is the success Answer carrying a string result under the "output" key.
func AnswerOutput(id, output string) Answer {
	return Answer{ID: id, OK: true, Data: map[string]any{OutputKey: output}}
}

// AnswerDeclined is the refusal Answer. An empty reason becomes "declined".
func AnswerDeclined(id, reason string) Answer {
	if reason == "" {
		reason = ReasonDeclined
	}
	return Answer{ID: id, OK: false, Reason: reason}
}

// HasRecognisedKey reports whether the answer's data carries a key the loop reads as a result.
func (a Answer) HasRecognisedKey() bool {
	for _, k := range RecognisedKeys {
		if _, ok := a.Data[k]; ok {
			return true
		}
	}
	return false
}

// ErrNoOutput is returned by OutputOf when the answer carries no "output" key.
var ErrNoOutput = errors.New(`answer data carries no "output"`)

// OutputOf returns data["output"]; it is an error when the key is absent or not a string.
func (a Answer) OutputOf() (string, error) {
	v, ok := a.Data[OutputKey]
	if !ok {
		return "", ErrNoOutput
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf(`answer data["output"] is %T, want a string`, v)
	}
	return s, nil
}

// DataKeys lists the answer's data keys, sorted, for error messages that must not echo values.
func (a Answer) DataKeys() []string {
	keys := make([]string, 0, len(a.Data))
	for k := range a.Data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

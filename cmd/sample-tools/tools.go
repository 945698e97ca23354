package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"strings"
)

// answerHeader carries the Answer on the retry after a suspension (README, "HTTP tools").
const answerHeader = "Toolnexus-Answer"

// The wire shapes, spelled out so this file reads as the protocol's reference.

// request is a toolnexus Request: what the tool needs from a person.
type request struct {
	ID     string         `json:"id,omitempty"` // empty: the operator assigns one
	Kind   string         `json:"kind"`         // approval | authorization | input | question | ...
	Prompt string         `json:"prompt"`
	URL    string         `json:"url,omitempty"`
	Data   map[string]any `json:"data,omitempty"`
}

// answer is a toolnexus Answer, as the PendingRequest's status.answer holds it.
type answer struct {
	ID     string         `json:"id"`
	OK     bool           `json:"ok"`
	Data   map[string]any `json:"data,omitempty"`
	Reason string         `json:"reason,omitempty"`
}

// toolResult is a toolnexus ToolResult. With metadata.pending set it suspends the call.
type toolResult struct {
	Output   string         `json:"output"`
	IsError  bool           `json:"isError"`
	Metadata map[string]any `json:"metadata,omitempty"`
}

func suspend(w http.ResponseWriter, req request) {
	writeJSON(w, toolResult{Output: req.Prompt, IsError: true, Metadata: map[string]any{"pending": req}})
}

// answerOf decodes the Toolnexus-Answer header; nil means this is the first call.
func answerOf(r *http.Request) (*answer, error) {
	h := r.Header.Get(answerHeader)
	if h == "" {
		return nil, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("%s is not base64url without padding: %w", answerHeader, err)
	}
	var a answer
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, fmt.Errorf("%s is not an Answer: %w", answerHeader, err)
	}
	return &a, nil
}

// call decodes the JSON arguments and the answer; on a bad request it has already replied.
func call(w http.ResponseWriter, r *http.Request, args any) (*answer, bool) {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(args); err != nil {
		http.Error(w, "the arguments are not a JSON object: "+err.Error(), http.StatusBadRequest)
		return nil, false
	}
	a, err := answerOf(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil, false
	}
	return a, true
}

func orDefault(s, def string) string {
	if strings.TrimSpace(s) == "" {
		return def
	}
	return s
}

// approvePurchase asks for an approval, then approves.
func approvePurchase(w http.ResponseWriter, r *http.Request) {
	var args struct {
		Item string `json:"item"`
	}
	a, ok := call(w, r, &args)
	if !ok {
		return
	}
	item := orDefault(args.Item, "the item")
	switch {
	case a == nil:
		suspend(w, request{Kind: "approval", Prompt: "Approve purchase of " + item + "?", Data: map[string]any{"item": item}})
	case a.OK:
		writeText(w, "purchase of "+item+" approved")
	default:
		writeText(w, "purchase of "+item+" not made: "+orDefault(a.Reason, "declined"))
	}
}

// calendar needs an authorization, in the LangSmith Fleet format, before it reads events.
func calendar(w http.ResponseWriter, r *http.Request) {
	var args struct {
		Date string `json:"date"`
	}
	a, ok := call(w, r, &args)
	if !ok {
		return
	}
	date := orDefault(args.Date, "today")
	if a == nil || !a.OK {
		authID := "calendar-" + strings.NewReplacer("/", "-", " ", "-").Replace(date)
		writeJSON(w, map[string]any{
			"auth_required": true,
			"auth_url":      "http://" + r.Host + "/oauth/authorize?auth_id=" + authID,
			"auth_id":       authID,
		})
		return
	}
	writeText(w, "events on "+date+": 09:00 stand-up; 13:00 lunch with the platform team; 16:00 GPU budget review")
}

// deploy asks which environment, then deploys there.
func deploy(w http.ResponseWriter, r *http.Request) {
	var args struct {
		Service string `json:"service"`
	}
	a, ok := call(w, r, &args)
	if !ok {
		return
	}
	service := orDefault(args.Service, "the service")
	if a == nil {
		suspend(w, request{Kind: "input", Prompt: "Which environment? (deploying " + service + ")"})
		return
	}
	env, _ := a.Data["output"].(string)
	if !a.OK || env == "" {
		writeJSON(w, toolResult{Output: "deploy of " + service + " not started: no environment was given", IsError: true})
		return
	}
	writeText(w, "deployed "+service+" to "+env)
}

// deleteUser is a plain tool: whatever approval it needs is the run's approval gate.
func deleteUser(w http.ResponseWriter, r *http.Request) {
	var args struct {
		User string `json:"user"`
	}
	if _, ok := call(w, r, &args); !ok {
		return
	}
	writeText(w, "user "+orDefault(args.User, "(none)")+" deleted")
}

// authorizePage is where an authorization URL points: a real tool would run an OAuth consent
// flow here; the sample just says how to finish.
func authorizePage(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = fmt.Fprintf(w, `<!doctype html><title>Sample consent</title>
<p>This is the sample tool server's stand-in consent page for <code>%s</code>.
<p>Nothing to do here: tell the run that authorization is done by answering its PendingRequest,
with the command <code>kubectl toolnexus show NAME</code> prints (it binds the answer to the request):
<pre>kubectl toolnexus approve NAME -n NAMESPACE --uid UID</pre>
`, html.EscapeString(r.URL.Query().Get("auth_id")))
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func writeText(w http.ResponseWriter, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = fmt.Fprint(w, s)
}

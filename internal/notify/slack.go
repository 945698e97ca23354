package notify

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/toolnexus/operator/internal/clip"
)

// Slack bounds a section's text to 3000 characters; the prompt and the arguments are cut well
// below that so the commands always fit.
const (
	slackPromptLimit    = 1500
	slackArgumentsLimit = 700
)

// slackMessage is a Slack incoming-webhook payload: text is the notification's fallback, blocks
// what Slack shows.
type slackMessage struct {
	Text   string       `json:"text"`
	Blocks []slackBlock `json:"blocks"`
}

type slackBlock struct {
	Type     string      `json:"type"`
	Text     *slackText  `json:"text,omitempty"`
	Fields   []slackText `json:"fields,omitempty"`
	Elements []slackText `json:"elements,omitempty"`
}

type slackText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

func mrkdwn(s string) slackText { return slackText{Type: "mrkdwn", Text: s} }

// Slack renders m as a Slack incoming-webhook message: what is asked, of whom, in which run, and
// the kubectl toolnexus commands that answer it.
func Slack(m Message) ([]byte, error) {
	where := fmt.Sprintf("%s/%s", m.Namespace, m.Run)
	var headline string
	switch m.Event {
	case Opened:
		headline = fmt.Sprintf("Run %s waits for %s: %s", where, article(m.Kind), oneLine(m.Prompt))
	case Answered:
		verdict := "declined"
		switch {
		case m.Answer != nil && m.Answer.OK && (m.Kind == "approval" || m.Kind == "authorization"):
			verdict = "approved"
		case m.Answer != nil && m.Answer.OK:
			verdict = "answered"
		}
		headline = fmt.Sprintf("Request %s of run %s was %s by %s", m.Name, where, verdict, answerer(m.Answer))
	case Expired:
		headline = fmt.Sprintf("Request %s of run %s expired unanswered", m.Name, where)
	}
	// Slack reads <...> in the fallback text too (a <!channel> would page everybody).
	headline = escape(headline)
	fields := []slackText{
		mrkdwn("*Kind*\n" + m.Kind), mrkdwn("*Run*\n" + where),
		mrkdwn("*Request*\n" + m.Name), mrkdwn("*Who may answer*\n" + whoMayAnswer(m)),
	}
	blocks := []slackBlock{
		{Type: "section", Text: ptr(mrkdwn(headline))},
		{Type: "section", Fields: fields},
	}
	if m.Prompt != "" {
		blocks = append(blocks, slackBlock{Type: "section", Text: ptr(mrkdwn("*Prompt*\n" + escape(cut(m.Prompt, slackPromptLimit))))})
	}
	if m.URL != "" {
		blocks = append(blocks, slackBlock{Type: "section", Text: ptr(mrkdwn("*Sign in at*\n" + escape(m.URL)))})
	}
	blocks = append(blocks, slackBlock{Type: "section", Text: ptr(mrkdwn(
		fmt.Sprintf("*Tool call* `%s`\n```%s```", escape(m.Tool), escape(cut(m.Arguments, slackArgumentsLimit)))))})
	if m.Event == Opened {
		blocks = append(blocks, slackBlock{Type: "section", Text: ptr(mrkdwn(
			"*Answer with*\n```" + strings.Join(Commands(m.Kind, m.Namespace, m.Name), "\n") + "```"))})
	} else if m.Answer != nil && m.Answer.Reason != "" {
		blocks = append(blocks, slackBlock{Type: "context", Elements: []slackText{mrkdwn("Reason: " + escape(m.Answer.Reason))}})
	}
	return json.Marshal(slackMessage{Text: headline, Blocks: blocks})
}

// Commands are the kubectl toolnexus commands that answer a request of kind, approving or
// supplying a result first, declining last.
func Commands(kind, namespace, name string) []string {
	target := name + " -n " + namespace
	decline := "kubectl toolnexus decline " + target + " --reason \"...\""
	switch kind {
	case "approval", "authorization":
		return []string{"kubectl toolnexus approve " + target, decline}
	case "input":
		return []string{"kubectl toolnexus answer " + target + " --output \"...\"", decline}
	case "question":
		return []string{"kubectl toolnexus answer " + target + " --data '{\"output\":\"...\"}'", decline}
	case "tool_call":
		return []string{"kubectl toolnexus answer " + target + " --data '{\"results\":[...]}'", decline}
	}
	return []string{"kubectl toolnexus approve " + target, "kubectl toolnexus answer " + target + " --output \"...\"", decline}
}

func whoMayAnswer(m Message) string {
	var who []string
	for _, u := range m.Users {
		who = append(who, "user "+u)
	}
	for _, g := range m.Groups {
		who = append(who, "group "+g)
	}
	if len(who) == 0 {
		return "anyone allowed to patch pendingrequests/status"
	}
	return escape(strings.Join(who, ", "))
}

func answerer(a *Answer) string {
	if a == nil || a.AnsweredBy == "" {
		return "an unknown user"
	}
	return a.AnsweredBy
}

// article names a request kind for a sentence: "an approval", "a question".
func article(kind string) string {
	if kind != "" && strings.ContainsRune("aeiou", rune(kind[0])) {
		return "an " + kind
	}
	return "a " + kind
}

// escape makes text safe for Slack mrkdwn: &, < and > are its control characters.
func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

func oneLine(s string) string { return cut(strings.Join(strings.Fields(s), " "), 200) }

// cut shortens s to at most n bytes on a rune boundary, ending it with an ellipsis.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return clip.Bytes(s, n-len("…")) + "…"
}

func ptr[T any](v T) *T { return &v }

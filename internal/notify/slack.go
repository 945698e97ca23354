package notify

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/toolnexus/operator/internal/clip"
)

// Slack bounds a section's text to 3000 characters and a field's to 2000; what a request holds
// is cut, escaped, well below that so that the commands always fit.
const (
	slackPromptLimit    = 1500
	slackArgumentsLimit = 700
	slackURLLimit       = 2000
	slackFieldLimit     = 1900
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
	// Verbatim keeps Slack from parsing plain text: no auto-linked names, no mentions.
	Verbatim bool `json:"verbatim,omitempty"`
}

func mrkdwn(s string) slackText { return slackText{Type: "mrkdwn", Text: s, Verbatim: true} }

// Slack renders m as a Slack incoming-webhook message: what is asked, of whom, in which run, and
// the kubectl toolnexus commands that answer it, bound to the request's uid. Whatever the
// request's author, model or tool wrote is escaped for mrkdwn and shown in code blocks, where
// it cannot format itself into something that looks like the message's own commands.
func Slack(m Message) ([]byte, error) {
	where := m.where()
	var headline string
	switch m.Event {
	case Opened:
		headline = fmt.Sprintf("Run %s waits for %s: %s", where, wanted(m), oneLine(m.Prompt))
	case Answered:
		verdict := "declined"
		switch {
		case m.Answer != nil && m.Answer.OK && (m.Kind == "approval" || m.Kind == "authorization" || m.Quorum()):
			verdict = "approved"
		case m.Answer != nil && m.Answer.OK:
			verdict = "answered"
		}
		headline = fmt.Sprintf("Request %s of run %s was %s by %s", m.Name, where, verdict, decidedBy(m))
		if m.Login && m.Answer != nil && m.Answer.OK {
			headline = fmt.Sprintf("Sign-in for request %s of run %s completed; the run goes on", m.Name, where)
		}
	case Expired:
		headline = fmt.Sprintf("Request %s of run %s expired unanswered", m.Name, where)
	case Escalated:
		headline = escalatedHeadline(m, where)
	}
	// Slack reads <...> in the fallback text too (a <!channel> would page everybody).
	headline = line(headline, slackFieldLimit)
	fields := []slackText{
		mrkdwn("*Kind*\n" + line(m.Kind, slackFieldLimit)), mrkdwn("*Run*\n" + line(where, slackFieldLimit)),
		mrkdwn("*Request*\n" + line(m.Name, slackFieldLimit)), mrkdwn("*Who may answer*\n" + whoMayAnswer(m)),
	}
	fields = append(fields, policyFields(m)...)
	if m.Quorum() {
		fields = append(fields, mrkdwn("*Approvals*\n"+line(progress(m), slackFieldLimit)))
	}
	blocks := []slackBlock{
		{Type: "section", Text: ptr(mrkdwn(headline))},
		{Type: "section", Fields: fields},
	}
	if m.Prompt != "" {
		blocks = append(blocks, slackBlock{Type: "section", Text: ptr(mrkdwn("*Prompt*\n" + codeBlock(m.Prompt, slackPromptLimit)))})
	}
	if m.URL != "" && (!m.Login || m.Event != Answered) {
		blocks = append(blocks, slackBlock{Type: "section", Text: ptr(mrkdwn("*Sign in at*\n" + link(m.URL)))})
	}
	blocks = append(blocks, slackBlock{Type: "section", Text: ptr(mrkdwn(
		"*Tool call* " + codeSpan(m.Tool) + "\n" + codeBlock(m.Arguments, slackArgumentsLimit)))})
	if m.Event == Opened || m.Event == Escalated {
		commands := Commands(m.Kind, m.Namespace, m.Name, m.UID)
		switch {
		case m.Quorum():
			commands = QuorumCommands(m.Namespace, m.Name, m.UID)
		case m.Login:
			commands = commands[len(commands)-1:] // signing in answers it; declining is all that is left
		}
		blocks = append(blocks, slackBlock{Type: "section", Text: ptr(mrkdwn(
			"*Answer with*\n```" + strings.Join(commands, "\n") + "```"))})
	} else if m.Answer != nil && m.Answer.Reason != "" {
		blocks = append(blocks, slackBlock{Type: "context", Elements: []slackText{mrkdwn("Reason: " + line(m.Answer.Reason, slackFieldLimit))}})
	}
	return json.Marshal(slackMessage{Text: headline, Blocks: blocks})
}

// Commands are the kubectl toolnexus commands that answer a request of kind, approving or
// supplying a result first, declining last. Each carries the request's uid (--uid), so that it
// answers the request it was printed for and is refused for one re-created under its name; each
// works pasted as it is (the "..." are the text to replace).
func Commands(kind, namespace, name, uid string) []string {
	target := name + " -n " + namespace + " --uid " + uid
	decline := "kubectl toolnexus decline " + target + " --reason \"...\""
	switch kind {
	case "approval", "authorization":
		return []string{"kubectl toolnexus approve " + target, decline}
	case "input":
		return []string{"kubectl toolnexus answer " + target + " --output \"...\"", decline}
	case "question":
		return []string{"kubectl toolnexus answer " + target + " --data '{\"output\":\"...\"}'", decline}
	case "tool_call":
		return []string{"kubectl toolnexus answer " + target + " --data '{\"results\":[\"...\"]}'", decline}
	}
	return []string{"kubectl toolnexus approve " + target, "kubectl toolnexus answer " + target + " --output \"...\"", decline}
}

// QuorumCommands are the commands that add an approver's entry to a request that needs several
// approvals, whatever its kind: approve first, decline last, each bound to the request's uid as
// Commands' are.
func QuorumCommands(namespace, name, uid string) []string {
	return Commands("approval", namespace, name, uid)
}

// wanted says what the request waits for: "2 approvals", or its kind with an article.
func wanted(m Message) string {
	if m.Quorum() {
		return fmt.Sprintf("%d approvals", m.Required)
	}
	return article(m.Kind)
}

// progress says how far a request that needs several approvals is: "needs 2 approvals; approved
// by alice; declined by carol: over budget".
func progress(m Message) string {
	parts := []string{fmt.Sprintf("needs %d approvals", m.Required)}
	if users := m.Approvers(); len(users) > 0 {
		parts = append(parts, "approved by "+strings.Join(users, ", "))
	} else if m.Decline() == nil {
		parts = append(parts, "none yet")
	}
	if d := m.Decline(); d != nil {
		parts = append(parts, "declined by "+d.User+reasonSuffix(d.Reason))
	}
	return strings.Join(parts, "; ")
}

func reasonSuffix(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}

// decidedBy names who decided an answered request: the approvers, or the decliner, of a request
// that needs several approvals (its answer is the manager's, system:quorum), else the answerer.
func decidedBy(m Message) string {
	if m.Quorum() && m.Answer != nil {
		if d := m.Decline(); !m.Answer.OK && d != nil {
			return d.User
		}
		if users := m.Approvers(); m.Answer.OK && len(users) > 0 {
			return strings.Join(users, ", ")
		}
	}
	return answerer(m.Answer)
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
	return line(strings.Join(who, ", "), slackFieldLimit)
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

// mrkdwnEscaper escapes mrkdwn's control characters: &, < and > (a <!channel> pages everybody,
// a <URL|label> shows one address and opens another).
var mrkdwnEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// line makes text safe for one line of mrkdwn, at most n bytes: its controls escaped
// (PrintableLine), then Slack's, and its backticks shown as the look-alike U+02CB, so that it
// cannot open a code span or block that looks like one of the message's commands.
func line(s string, n int) string {
	return bound(strings.ReplaceAll(mrkdwnEscaper.Replace(PrintableLine(s)), "`", "\u02cb"), n)
}

// codeBlock shows text as written, in a ``` block, at most n bytes of it: a backtick in it is
// followed by a zero-width space, so that no ``` of the text ends the block and formats the rest.
func codeBlock(s string, n int) string {
	return "```" + bound(strings.ReplaceAll(mrkdwnEscaper.Replace(Printable(s)), "`", "`\u200b"), n) + "```"
}

// codeSpan is codeBlock for one line.
func codeSpan(s string) string { return "`" + line(s, slackFieldLimit) + "`" }

// link is a sign-in address as a link that opens what it shows: only http and https, and a |
// (which would start a label of the author's choosing) percent-encoded, as the URL means it
// anyway. An address too long for the message is shown cut, as text.
func link(raw string) string {
	u := mrkdwnEscaper.Replace(PrintableLine(raw))
	if len(u) > slackURLLimit || !strings.HasPrefix(raw, "https://") && !strings.HasPrefix(raw, "http://") {
		return bound(u, slackURLLimit)
	}
	return "<" + strings.ReplaceAll(u, "|", "%7C") + ">"
}

func oneLine(s string) string { return cut(strings.Join(strings.Fields(s), " "), 200) }

// cut shortens s to at most n bytes on a rune boundary, ending it with an ellipsis.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return clip.Bytes(s, n-len("…")) + "…"
}

// bound is cut for escaped text: the cut never leaves half an entity (&am) behind.
func bound(escaped string, n int) string {
	if len(escaped) <= n {
		return escaped
	}
	s := clip.Bytes(escaped, n-len("…"))
	if amp := strings.LastIndexByte(s, '&'); amp >= 0 && !strings.Contains(s[amp:], ";") {
		s = s[:amp]
	}
	return s + "…"
}

func ptr[T any](v T) *T { return &v }

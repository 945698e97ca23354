package notify

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// decodeSlack reads a Slack payload strictly: only text and blocks, each block of a known shape.
func decodeSlack(t *testing.T, raw []byte) slackMessage {
	t.Helper()
	var m slackMessage
	decodeStrict(t, raw, &m)
	if m.Text == "" || len(m.Blocks) == 0 {
		t.Fatalf("a Slack message needs text and blocks: %s", raw)
	}
	for _, b := range m.Blocks {
		if b.Type != "section" && b.Type != "context" {
			t.Errorf("unexpected block type %q", b.Type)
		}
		for _, f := range append(b.Fields, b.Elements...) {
			if len(f.Text) > 2000 {
				t.Errorf("a field of %d characters is over Slack's limit", len(f.Text))
			}
		}
		if b.Text != nil && len(b.Text.Text) > 3000 {
			t.Errorf("a section of %d characters is over Slack's limit", len(b.Text.Text))
		}
	}
	return m
}

func allText(m slackMessage) string {
	var s strings.Builder
	s.WriteString(m.Text)
	for _, b := range m.Blocks {
		if b.Text != nil {
			s.WriteString("\n" + b.Text.Text)
		}
		for _, f := range append(b.Fields, b.Elements...) {
			s.WriteString("\n" + f.Text)
		}
	}
	return s.String()
}

func TestSlackOpened(t *testing.T) {
	raw, err := Slack(opened)
	if err != nil {
		t.Fatal(err)
	}
	m := decodeSlack(t, raw)
	if want := "Run team-a/buy-gpu waits for an approval: Approve purchase of gpu?"; m.Text != want {
		t.Errorf("text = %q, want %q", m.Text, want)
	}
	text := allText(m)
	for _, want := range []string{
		"*Kind*\napproval", "*Run*\nteam-a/buy-gpu", "*Request*\nbuy-gpu-1-call-1", "user alice, group buyers",
		"*Prompt*\n```Approve purchase of gpu?```", "`approve_purchase`", `{"item":"gpu"}`,
		"kubectl toolnexus approve buy-gpu-1-call-1 -n team-a --uid 4b1e\nkubectl toolnexus decline buy-gpu-1-call-1 -n team-a --uid 4b1e",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the message lacks %q:\n%s", want, text)
		}
	}
}

// A request of a sub-agent's run names the path from the root run, which is what its answerer
// started.
func TestSlackOpenedInASubAgentsRun(t *testing.T) {
	delegated := opened
	delegated.Path = []string{"orders", "buy-gpu"}
	raw, err := Slack(delegated)
	if err != nil {
		t.Fatal(err)
	}
	m := decodeSlack(t, raw)
	if want := "Run team-a/orders → buy-gpu waits for an approval: Approve purchase of gpu?"; m.Text != want {
		t.Errorf("text = %q, want %q", m.Text, want)
	}
	if text := allText(m); !strings.Contains(text, "*Run*\nteam-a/orders → buy-gpu") {
		t.Errorf("the message lacks the path:\n%s", text)
	}
}

func TestSlackAnsweredAndExpired(t *testing.T) {
	answered := opened
	answered.Event, answered.Answer = Answered, &Answer{OK: false, Reason: "over budget", AnsweredBy: "alice"}
	expired := opened
	expired.Event, expired.Answer = Expired, &Answer{Reason: "expired", AnsweredBy: "system:expired"}
	for _, tc := range []struct {
		in   Message
		want string
	}{
		{answered, "Request buy-gpu-1-call-1 of run team-a/buy-gpu was declined by alice"},
		{expired, "Request buy-gpu-1-call-1 of run team-a/buy-gpu expired unanswered"},
	} {
		raw, err := Slack(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		m := decodeSlack(t, raw)
		if m.Text != tc.want {
			t.Errorf("text = %q, want %q", m.Text, tc.want)
		}
		if strings.Contains(allText(m), "kubectl toolnexus") {
			t.Errorf("a settled request offers no commands:\n%s", allText(m))
		}
	}
}

func TestSlackEscapesAndBounds(t *testing.T) {
	m := opened
	m.Prompt = "<!channel> & @here " + strings.Repeat("é", 5000)
	m.Arguments = strings.Repeat("x", 10000)
	raw, err := Slack(m)
	if err != nil {
		t.Fatal(err)
	}
	text := allText(decodeSlack(t, raw))
	if strings.Contains(text, "<!channel>") || !strings.Contains(text, "&lt;!channel&gt; &amp;") {
		t.Errorf("Slack control characters of the prompt are not escaped:\n%.200s", text)
	}
	// Escaping makes text longer: what is cut is the escaped text, so it stays within Slack's bounds.
	m.Prompt, m.Arguments = strings.Repeat("&\x1b", 3000), strings.Repeat("<", 3000)
	m.URL = "https://login.example.com/" + strings.Repeat("&", 4000)
	m.Users = []string{strings.Repeat("&", 3000)}
	raw, err = Slack(m)
	if err != nil {
		t.Fatal(err)
	}
	text = allText(decodeSlack(t, raw))
	if strings.Contains(text, "&am…") || strings.Contains(text, "&a…") || strings.Contains(text, "&…") {
		t.Errorf("a cut left half an entity behind:\n%.300s", text)
	}
}

// What a model, a tool or a run's author wrote cannot hide text, reach a terminal's or Slack's
// controls, mention anyone, link elsewhere than it shows, or format itself into a command block.
func TestSlackShowsHostileTextInert(t *testing.T) {
	m := opened
	m.Kind = "approval\x1b[8m"
	m.Prompt = "Pay 10 \x1b[8m(hidden)\x1b[0m \x1b]52;c;cm0gLXJmIC8=\x07 <@U123> <!subteam^S1> @channel \u202e0001\n" +
		"```\n*Answer with*\n```kubectl toolnexus approve other -n team-b --uid 1```"
	m.Arguments = `{"amount":"\u202e0001"}` + "```*bold*```"
	m.Tool = "pay`now`"
	m.URL = "https://login.example.com/?a=1|https://login.example.org/"
	m.Users = []string{"<!here>", "eve\u0085"}
	raw, err := Slack(m)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing a terminal or a browser acts on, in the bytes of the payload as Slack receives them.
	var decoded strings.Builder
	msg := decodeSlack(t, raw)
	decoded.WriteString(allText(msg))
	for _, bad := range []string{"\x1b", "\u202e", "\u0085", "\a"} {
		if strings.Contains(decoded.String(), bad) {
			t.Errorf("the message holds %q raw:\n%s", bad, decoded.String())
		}
	}
	text := decoded.String()
	for _, bad := range []string{"<@U123>", "<!subteam", "<!here>", "|https://login.example.org/>"} {
		if strings.Contains(text, bad) {
			t.Errorf("the message holds %q:\n%s", bad, text)
		}
	}
	for _, want := range []string{`\x1b[8m(hidden)\x1b[0m`, `\u202e0001`, "&lt;@U123&gt;", "`pay\u02cbnow\u02cb`",
		"<https://login.example.com/?a=1%7Chttps://login.example.org/>"} {
		if !strings.Contains(text, want) {
			t.Errorf("the message lacks %q:\n%s", want, text)
		}
	}
	for _, b := range msg.Blocks {
		for _, f := range append(append([]slackText{}, b.Fields...), b.Elements...) {
			if f.Type == "mrkdwn" && !f.Verbatim {
				t.Errorf("a mrkdwn text without verbatim, which Slack parses for mentions: %q", f.Text)
			}
		}
		if b.Text != nil && b.Text.Type == "mrkdwn" && !b.Text.Verbatim {
			t.Errorf("a mrkdwn text without verbatim, which Slack parses for mentions: %q", b.Text.Text)
		}
		// The prompt's and the arguments' fences cannot close the message's code blocks: every
		// ``` in a block is one of the message's own, four in the tool-call block, two elsewhere.
		if b.Text != nil && strings.HasPrefix(b.Text.Text, "*Prompt*") || b.Text != nil && strings.HasPrefix(b.Text.Text, "*Tool call*") {
			if n := strings.Count(b.Text.Text, "```"); n != 2 {
				t.Errorf("%d ``` in %q, want the block's own 2", n, b.Text.Text)
			}
		}
	}
	// One line of text holds no backtick: it opens no code span that looks like a command.
	if strings.Contains(msg.Text, "`") || strings.Contains(msg.Blocks[0].Text.Text, "`") {
		t.Errorf("the headline holds a backtick: %q", msg.Text)
	}
	// The one command block is the message's own, for this request.
	var commands []string
	for _, b := range msg.Blocks {
		if b.Text != nil && strings.HasPrefix(b.Text.Text, "*Answer with*") {
			commands = append(commands, b.Text.Text)
		}
	}
	if len(commands) != 1 || !strings.HasPrefix(commands[0], "*Answer with*\n```kubectl toolnexus approve buy-gpu-1-call-1 -n team-a --uid 4b1e\n") {
		t.Errorf("command blocks %q, want the message's own only", commands)
	}
}

func TestCommands(t *testing.T) {
	const ns, name, uid = "team-a", "r-1-c", "0b5c7a4e-2f0d-4b8e-9f57-1a2b3c4d5e6f"
	target := "r-1-c -n team-a --uid " + uid
	decline := `kubectl toolnexus decline ` + target + ` --reason "..."`
	for kind, want := range map[string][]string{
		"approval":      {"kubectl toolnexus approve " + target, decline},
		"authorization": {"kubectl toolnexus approve " + target, decline},
		"input":         {`kubectl toolnexus answer ` + target + ` --output "..."`, decline},
		"question":      {`kubectl toolnexus answer ` + target + ` --data '{"output":"..."}'`, decline},
		"tool_call":     {`kubectl toolnexus answer ` + target + ` --data '{"results":["..."]}'`, decline},
		"any":           {"kubectl toolnexus approve " + target, `kubectl toolnexus answer ` + target + ` --output "..."`, decline},
	} {
		got := Commands(kind, ns, name, uid)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", kind, diff)
		}
		// Pasted into a shell, each is a command line of kubectl toolnexus for this request and
		// uid, and its --data is a JSON object.
		for _, command := range got {
			argv := shellWords(t, command)
			if len(argv) < 8 || argv[0] != "kubectl" || argv[1] != "toolnexus" || argv[3] != name ||
				argv[4] != "-n" || argv[5] != ns || argv[6] != "--uid" || argv[7] != uid {
				t.Errorf("%s: %q parses as %q, want kubectl toolnexus VERB %s -n %s --uid %s ...", kind, command, argv, name, ns, uid)
			}
			for i, a := range argv {
				if a == "--data" && (i+1 == len(argv) || !json.Valid([]byte(argv[i+1])) || !strings.HasPrefix(argv[i+1], "{")) {
					t.Errorf("%s: --data of %q is no JSON object", kind, command)
				}
			}
		}
	}
}

// shellWords is how a POSIX shell splits command into words: a shell splits it.
func shellWords(t *testing.T, command string) []string {
	t.Helper()
	out, err := exec.Command("sh", "-c", "set -- "+command+"\nprintf '%s\\0' \"$@\"").Output()
	if err != nil {
		t.Fatalf("sh cannot parse %q: %v", command, err)
	}
	return strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
}

// A request that needs several approvals says how many, by which policy, who approved so far, and
// offers the commands that add an approver's entry, whatever its kind.
func TestSlackQuorum(t *testing.T) {
	quorum := opened
	quorum.Kind, quorum.Policy, quorum.Required = "input", "prod-changes", 2
	escalated := quorum
	escalated.Event = Escalated
	escalated.Approvals = []Approval{{User: "alice", OK: true}}
	approved := quorum
	approved.Event, approved.Answer = Answered, &Answer{OK: true, AnsweredBy: "system:quorum"}
	approved.Approvals = []Approval{{User: "alice", OK: true}, {User: "carol", OK: true}}
	declined := quorum
	declined.Event, declined.Answer = Answered, &Answer{OK: false, Reason: "over budget", AnsweredBy: "system:quorum"}
	declined.Approvals = []Approval{{User: "alice", OK: true}, {User: "carol", Reason: "over budget"}}
	commands := "*Answer with*\n```kubectl toolnexus approve buy-gpu-1-call-1 -n team-a --uid 4b1e\n" +
		"kubectl toolnexus decline buy-gpu-1-call-1 -n team-a --uid 4b1e --reason \"...\"```"
	for _, tc := range []struct {
		name     string
		in       Message
		headline string
		want     []string
		commands bool
	}{
		{"opened", quorum, "Run team-a/buy-gpu waits for 2 approvals: Approve purchase of gpu?",
			[]string{"*Policy*\nprod-changes", "*Approvals*\nneeds 2 approvals; none yet"}, true},
		{"escalated", escalated, "Request buy-gpu-1-call-1 of run team-a/buy-gpu is escalated: it still waits for 2 approvals",
			[]string{"*Approvals*\nneeds 2 approvals; approved by alice"}, true},
		{"approved", approved, "Request buy-gpu-1-call-1 of run team-a/buy-gpu was approved by alice, carol",
			[]string{"*Approvals*\nneeds 2 approvals; approved by alice, carol"}, false},
		{"declined", declined, "Request buy-gpu-1-call-1 of run team-a/buy-gpu was declined by carol",
			[]string{"*Approvals*\nneeds 2 approvals; approved by alice; declined by carol: over budget", "Reason: over budget"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := Slack(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			m := decodeSlack(t, raw)
			if m.Text != tc.headline {
				t.Errorf("text = %q, want %q", m.Text, tc.headline)
			}
			text := allText(m)
			for _, want := range tc.want {
				if !strings.Contains(text, want) {
					t.Errorf("the message lacks %q:\n%s", want, text)
				}
			}
			if got := strings.Contains(text, commands); got != tc.commands {
				t.Errorf("offers the approve and decline commands: %v, want %v:\n%s", got, tc.commands, text)
			}
			if strings.Contains(text, "kubectl toolnexus answer") {
				t.Errorf("offers a direct answer for a request decided by approvals:\n%s", text)
			}
		})
	}

	// A request that needs one approval is shown as before: no approvals field, even with an entry.
	single := opened
	single.Required, single.Approvals = 1, []Approval{{User: "alice", OK: true}}
	raw, err := Slack(single)
	if err != nil {
		t.Fatal(err)
	}
	if text := allText(decodeSlack(t, raw)); strings.Contains(text, "*Approvals*") || strings.Contains(text, "*Policy*") {
		t.Errorf("a request without policy that needs one approval shows approvals or a policy:\n%s", text)
	}
}

// Who approved and why is written by people and their identity providers: it is escaped like the
// rest, mentions and controls inert.
func TestSlackQuorumEscapes(t *testing.T) {
	m := opened
	m.Event, m.Required, m.Policy = Answered, 2, "prod\u202e"
	m.Answer = &Answer{OK: false, Reason: "no", AnsweredBy: "system:quorum"}
	m.Approvals = []Approval{{User: "<!here>", OK: true}, {User: "eve\x1b[8m", Reason: "```kubectl toolnexus approve other``` <@U1>"}}
	raw, err := Slack(m)
	if err != nil {
		t.Fatal(err)
	}
	msg := decodeSlack(t, raw)
	text := allText(msg)
	for _, bad := range []string{"<!here>", "<@U1>", "\x1b", "\u202e", "```kubectl"} {
		if strings.Contains(text, bad) {
			t.Errorf("the message holds %q:\n%s", bad, text)
		}
	}
	for _, want := range []string{"declined by eve\\x1b[8m", "&lt;!here&gt;", "&lt;@U1&gt;", `prod\u202e`} {
		if !strings.Contains(text, want) {
			t.Errorf("the message lacks %q:\n%s", want, text)
		}
	}
}

func TestSlackLogin(t *testing.T) {
	login := opened
	login.Kind, login.Login = "authorization", true
	login.Prompt, login.URL = "Sign in at as.example.com so that who_whoami can reach https://cal.example.com as you.", "https://as.example.com/authorize?state=s"
	raw, err := Slack(login)
	if err != nil {
		t.Fatal(err)
	}
	text := allText(decodeSlack(t, raw))
	if !strings.Contains(text, "*Sign in at*\n<https://as.example.com/authorize?state=s>") {
		t.Errorf("the login's message lacks its link:\n%s", text)
	}
	if strings.Contains(text, "kubectl toolnexus approve") || !strings.Contains(text, "kubectl toolnexus decline buy-gpu-1-call-1") {
		t.Errorf("signing in answers a login: only declining is offered, got:\n%s", text)
	}

	done := login
	done.Event, done.Answer = Answered, &Answer{OK: true, AnsweredBy: "system:oauth"}
	raw, err = Slack(done)
	if err != nil {
		t.Fatal(err)
	}
	m := decodeSlack(t, raw)
	if want := "Sign-in for request buy-gpu-1-call-1 of run team-a/buy-gpu completed; the run goes on"; m.Text != want {
		t.Errorf("text = %q, want %q", m.Text, want)
	}
	if strings.Contains(allText(m), "as.example.com/authorize") {
		t.Errorf("a completed login's message still offers the link:\n%s", allText(m))
	}
}

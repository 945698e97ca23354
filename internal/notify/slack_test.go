package notify

import (
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
		"Approve purchase of gpu?", "`approve_purchase`", `{"item":"gpu"}`,
		"kubectl toolnexus approve buy-gpu-1-call-1 -n team-a\nkubectl toolnexus decline buy-gpu-1-call-1 -n team-a",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the message lacks %q:\n%s", want, text)
		}
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
	m.Prompt = "<!channel> & " + strings.Repeat("é", 5000)
	m.Arguments = strings.Repeat("x", 10000)
	raw, err := Slack(m)
	if err != nil {
		t.Fatal(err)
	}
	text := allText(decodeSlack(t, raw))
	if strings.Contains(text, "<!channel>") || !strings.Contains(text, "&lt;!channel&gt; &amp;") {
		t.Errorf("Slack control characters of the prompt are not escaped:\n%.200s", text)
	}
}

func TestCommands(t *testing.T) {
	const ns, name = "team-a", "r-1-c"
	decline := `kubectl toolnexus decline r-1-c -n team-a --reason "..."`
	for kind, want := range map[string][]string{
		"approval":      {"kubectl toolnexus approve r-1-c -n team-a", decline},
		"authorization": {"kubectl toolnexus approve r-1-c -n team-a", decline},
		"input":         {`kubectl toolnexus answer r-1-c -n team-a --output "..."`, decline},
		"question":      {`kubectl toolnexus answer r-1-c -n team-a --data '{"output":"..."}'`, decline},
		"tool_call":     {`kubectl toolnexus answer r-1-c -n team-a --data '{"results":[...]}'`, decline},
		"any":           {"kubectl toolnexus approve r-1-c -n team-a", `kubectl toolnexus answer r-1-c -n team-a --output "..."`, decline},
	} {
		if diff := cmp.Diff(want, Commands(kind, ns, name)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", kind, diff)
		}
	}
}

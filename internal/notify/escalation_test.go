package notify

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// escalated is opened's request, of policy prod-changes, at its second of two steps: group
// sre-leads joins alice and buyers.
func escalated() Message {
	m := opened
	m.Event, m.Policy, m.Time = Escalated, "prod-changes", opened.Time.Add(30*time.Minute)
	m.Users, m.Groups = []string{"alice"}, []string{"buyers", "sre-leads"}
	m.Escalation = &Escalation{Step: 1, Steps: 2, After: 30 * time.Minute, Groups: []string{"sre-leads"}}
	return m
}

func TestCloudEventEscalated(t *testing.T) {
	raw, err := CloudEvent(escalated())
	if err != nil {
		t.Fatal(err)
	}
	var env strictEnvelope
	decodeStrict(t, raw, &env)
	if env.Type != "dev.toolnexus.pendingrequest.escalated" || env.ID != "4b1e/escalated/1" || !env.Time.Equal(escalated().Time) {
		t.Errorf("type %q, id %q, time %s; want the escalated type, the step's id and the step's time", env.Type, env.ID, env.Time)
	}
	var d data
	decodeStrict(t, env.Data, &d)
	want := data{
		Namespace: "team-a", Name: "buy-gpu-1-call-1", UID: "4b1e", Run: "buy-gpu", Kind: "approval", Prompt: "Approve purchase of gpu?",
		Approvers:  &approvers{Users: []string{"alice"}, Groups: []string{"buyers", "sre-leads"}},
		ToolCall:   toolCall{Name: "approve_purchase", Arguments: `{"item":"gpu"}`},
		Policy:     "prod-changes",
		Escalation: &escalationData{Step: 1, After: "30m0s", Approvers: &approvers{Groups: []string{"sre-leads"}}},
	}
	if diff := cmp.Diff(want, d); diff != "" {
		t.Errorf("data (-want +got):\n%s", diff)
	}

	// A step that adds no approvers says so by leaving them out.
	m := escalated()
	m.Escalation.Groups = nil
	raw, err = CloudEvent(m)
	if err != nil {
		t.Fatal(err)
	}
	var bare strictEnvelope
	decodeStrict(t, raw, &bare)
	var bareData data
	decodeStrict(t, bare.Data, &bareData)
	if e := bareData.Escalation; e == nil || e.Approvers != nil {
		t.Errorf("escalation = %+v, want one without approvers", e)
	}
}

func TestSlackEscalated(t *testing.T) {
	raw, err := Slack(escalated())
	if err != nil {
		t.Fatal(err)
	}
	m := decodeSlack(t, raw)
	if want := "Request buy-gpu-1-call-1 of run team-a/buy-gpu is undecided after 30m0s: escalation step 2 of 2 of policy prod-changes"; m.Text != want {
		t.Errorf("text = %q, want %q", m.Text, want)
	}
	text := allText(m)
	for _, want := range []string{
		"*Who may answer*\nuser alice, group buyers, group sre-leads", "*Policy*\nprod-changes",
		"*Escalation step 2 of 2*\nadds group sre-leads", "`approve_purchase`",
		// The people the step adds are asked: the message tells them how to answer.
		"kubectl toolnexus approve buy-gpu-1-call-1 -n team-a --uid 4b1e\nkubectl toolnexus decline buy-gpu-1-call-1 -n team-a --uid 4b1e",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the message lacks %q:\n%s", want, text)
		}
	}
}

func TestSlackEscalatedEscapes(t *testing.T) {
	m := escalated()
	m.Policy = "<!channel>\x1b[8m"
	m.Escalation.Groups = []string{"<!here>", "sre\u202eleads"}
	raw, err := Slack(m)
	if err != nil {
		t.Fatal(err)
	}
	text := allText(decodeSlack(t, raw))
	for _, raw := range []string{"<!channel>", "<!here>", "\x1b", "\u202e"} {
		if strings.Contains(text, raw) {
			t.Errorf("the message holds %q raw:\n%s", raw, text)
		}
	}
	for _, want := range []string{"*Policy*\n&lt;!channel&gt;\\x1b[8m", "adds group &lt;!here&gt;, group sre\\u202eleads"} {
		if !strings.Contains(text, want) {
			t.Errorf("the message lacks %q:\n%s", want, text)
		}
	}
}

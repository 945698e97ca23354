package notify

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/go-cmp/cmp"
)

var opened = Message{
	Event: Opened, Namespace: "team-a", Name: "buy-gpu-1-call-1", UID: "4b1e", Run: "buy-gpu",
	Kind: "approval", Prompt: "Approve purchase of gpu?", Users: []string{"alice"}, Groups: []string{"buyers"},
	Tool: "approve_purchase", Arguments: `{"item":"gpu"}`, Time: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
}

// strictEnvelope is a structured-mode CloudEvent with exactly the attributes a notification
// carries; decoding refuses any other.
type strictEnvelope struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject"`
	Time            time.Time       `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	Data            json.RawMessage `json:"data"`
}

func decodeStrict(t *testing.T, raw []byte, into any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		t.Fatalf("decoding %s: %v", raw, err)
	}
}

func TestCloudEvent(t *testing.T) {
	ok := true
	answered := opened
	answered.Event, answered.Time = Answered, opened.Time.Add(time.Hour)
	answered.Answer = &Answer{OK: true, AnsweredBy: "alice"}
	expired := opened
	expired.Event, expired.Users, expired.Groups = Expired, nil, nil
	expired.Answer = &Answer{OK: false, Reason: "expired", AnsweredBy: "system:expired"}
	quorum := answered
	quorum.Policy, quorum.Required, quorum.Answer = "prod-changes", 2, &Answer{OK: true, AnsweredBy: "system:quorum"}
	quorum.Approvals = []Approval{{User: "alice", OK: true, At: opened.Time.Add(time.Minute)}, {User: "carol", OK: true, Reason: "checked the budget"}}
	approvedAt := opened.Time.Add(time.Minute)
	escalated := opened
	escalated.Event, escalated.Policy, escalated.Required = Escalated, "prod-changes", 2
	single := answered
	single.Policy, single.Required = "prod-changes", 1
	single.Approvals = []Approval{{User: "alice", OK: true}} // an entry on a request answered directly is no quorum's
	delegated := opened
	delegated.Path = []string{"orders", "buy-gpu"}
	for _, tc := range []struct {
		name     string
		in       Message
		wantType string
		wantID   string
		wantData data
	}{
		{"opened", opened, "dev.toolnexus.pendingrequest.opened", "4b1e/opened", data{
			Namespace: "team-a", Name: "buy-gpu-1-call-1", UID: "4b1e", Run: "buy-gpu", Kind: "approval", Prompt: "Approve purchase of gpu?",
			Approvers: &approvers{Users: []string{"alice"}, Groups: []string{"buyers"}},
			ToolCall:  toolCall{Name: "approve_purchase", Arguments: `{"item":"gpu"}`}}},
		{"answered", answered, "dev.toolnexus.pendingrequest.answered", "4b1e/answered", data{
			Namespace: "team-a", Name: "buy-gpu-1-call-1", UID: "4b1e", Run: "buy-gpu", Kind: "approval", Prompt: "Approve purchase of gpu?",
			Approvers: &approvers{Users: []string{"alice"}, Groups: []string{"buyers"}},
			ToolCall:  toolCall{Name: "approve_purchase", Arguments: `{"item":"gpu"}`}, OK: &ok, AnsweredBy: "alice"}},
		{"expired", expired, "dev.toolnexus.pendingrequest.expired", "4b1e/expired", data{
			Namespace: "team-a", Name: "buy-gpu-1-call-1", UID: "4b1e", Run: "buy-gpu", Kind: "approval", Prompt: "Approve purchase of gpu?",
			ToolCall: toolCall{Name: "approve_purchase", Arguments: `{"item":"gpu"}`}, OK: new(bool), Reason: "expired",
			AnsweredBy: "system:expired"}},
		{"answered by a quorum", quorum, "dev.toolnexus.pendingrequest.answered", "4b1e/answered", data{
			Namespace: "team-a", Name: "buy-gpu-1-call-1", UID: "4b1e", Run: "buy-gpu", Kind: "approval", Prompt: "Approve purchase of gpu?",
			Approvers: &approvers{Users: []string{"alice"}, Groups: []string{"buyers"}},
			ToolCall:  toolCall{Name: "approve_purchase", Arguments: `{"item":"gpu"}`}, OK: &ok, AnsweredBy: "system:quorum",
			Policy: "prod-changes", Required: 2,
			Approvals: []approval{{User: "alice", OK: true, At: &approvedAt}, {User: "carol", OK: true, Reason: "checked the budget"}}}},
		{"escalated, no approval yet", escalated, "dev.toolnexus.pendingrequest.escalated", "4b1e/escalated", data{
			Namespace: "team-a", Name: "buy-gpu-1-call-1", UID: "4b1e", Run: "buy-gpu", Kind: "approval", Prompt: "Approve purchase of gpu?",
			Approvers: &approvers{Users: []string{"alice"}, Groups: []string{"buyers"}},
			ToolCall:  toolCall{Name: "approve_purchase", Arguments: `{"item":"gpu"}`}, Policy: "prod-changes", Required: 2}},
		{"a policy's gate that needs one approval", single, "dev.toolnexus.pendingrequest.answered", "4b1e/answered", data{
			Namespace: "team-a", Name: "buy-gpu-1-call-1", UID: "4b1e", Run: "buy-gpu", Kind: "approval", Prompt: "Approve purchase of gpu?",
			Approvers: &approvers{Users: []string{"alice"}, Groups: []string{"buyers"}},
			ToolCall:  toolCall{Name: "approve_purchase", Arguments: `{"item":"gpu"}`}, OK: &ok, AnsweredBy: "alice", Policy: "prod-changes"}},
		{"opened in a sub-agent's run", delegated, "dev.toolnexus.pendingrequest.opened", "4b1e/opened", data{
			Namespace: "team-a", Name: "buy-gpu-1-call-1", UID: "4b1e", Run: "buy-gpu", RootRun: "orders", Path: []string{"orders", "buy-gpu"},
			Kind: "approval", Prompt: "Approve purchase of gpu?", Approvers: &approvers{Users: []string{"alice"}, Groups: []string{"buyers"}},
			ToolCall: toolCall{Name: "approve_purchase", Arguments: `{"item":"gpu"}`}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := CloudEvent(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			// The SDK reads it back as a valid CloudEvent ...
			var e cloudevent.Event
			if err := json.Unmarshal(raw, &e); err != nil {
				t.Fatalf("the SDK cannot read %s: %v", raw, err)
			}
			if err := e.Validate(); err != nil {
				t.Fatalf("the SDK finds %s invalid: %v", raw, err)
			}
			// ... and it holds exactly the attributes and data a notification promises.
			var env strictEnvelope
			decodeStrict(t, raw, &env)
			want := strictEnvelope{SpecVersion: "1.0", ID: tc.wantID, Source: "/namespaces/team-a/agentruns/buy-gpu",
				Type: tc.wantType, Subject: "buy-gpu-1-call-1", Time: tc.in.Time, DataContentType: "application/json"}
			got := env
			got.Data = nil
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("attributes (-want +got):\n%s", diff)
			}
			var d data
			decodeStrict(t, env.Data, &d)
			if diff := cmp.Diff(tc.wantData, d); diff != "" {
				t.Errorf("data (-want +got):\n%s", diff)
			}
		})
	}
}

// Package notify builds the notifications of PendingRequests (a CloudEvent or a Slack message)
// and delivers one of them with one HTTP request, saying whether to retry. It keeps no state and
// imports no Kubernetes: the controller decides what is due, when to try again, and records
// what was delivered.
package notify

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
)

// Event is what happened to a request, as it appears in a CloudEvent's type.
type Event string

// The events a sink can be told about.
const (
	Opened   Event = "opened"
	Answered Event = "answered"
	Expired  Event = "expired"
)

// EventTypePrefix starts the CloudEvents type of every notification: <prefix><event>.
const EventTypePrefix = "dev.toolnexus.pendingrequest."

// CloudEventsContentType is how a CloudEvent is posted: structured mode.
const CloudEventsContentType = "application/cloudevents+json"

// Message is what a notification says about one request.
type Message struct {
	Event Event
	// Namespace, Name and UID identify the PendingRequest; Run is its AgentRun.
	Namespace, Name, UID, Run string
	// Path is, for a request of a run a sub-agent call created, the runs from the root to Run (Run
	// last); empty for a run nobody delegated.
	Path []string
	// Kind, Prompt and URL are the request's (URL only for authorization).
	Kind, Prompt, URL string
	// Login says the request is a login the operator completes itself once someone signs in at
	// URL (SPEC §12): nobody answers it but to decline.
	Login bool
	// Users and Groups may answer; both empty means whoever RBAC lets.
	Users, Groups []string
	// Tool and Arguments are the suspended call.
	Tool, Arguments string
	// Policy names the ApprovalPolicy whose gate the request is; empty for a run's own gates.
	Policy string
	// Required is how many distinct approvals the request needs; above 1, approvers add entries
	// (Approvals) and the manager writes the answer.
	Required int
	// Approvals are the approvers' entries so far, in the order the request holds them.
	Approvals []Approval
	// Answer is set for Answered and Expired.
	Answer *Answer
	// Time is when the event happened: the request's creation, or its answer.
	Time time.Time
	// Escalation is the step that applied, for Escalated.
	Escalation *Escalation
}

// Answer is what the request was answered with.
type Answer struct {
	OK         bool
	Reason     string
	AnsweredBy string
}

// Approval is one approver's entry on a request that needs several approvals.
type Approval struct {
	User   string
	OK     bool
	Reason string
	// At is when the API server took the entry; zero when it did not say.
	At time.Time
}

// Quorum reports whether m's request is decided by several approvers' entries.
func (m Message) Quorum() bool { return m.Required > 1 }

// Approvers are the users whose entries approve, in order.
func (m Message) Approvers() []string {
	var users []string
	for _, a := range m.Approvals {
		if a.OK {
			users = append(users, a.User)
		}
	}
	return users
}

// Decline is the first entry that declines, the one that decides the request; nil when none does.
func (m Message) Decline() *Approval {
	for i := range m.Approvals {
		if !m.Approvals[i].OK {
			return &m.Approvals[i]
		}
	}
	return nil
}

// data is the CloudEvent's data.
type data struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// UID is the request's metadata.uid: an answer that carries it as answer.requestUID is
	// refused by the API server for any other request of the same name.
	UID string `json:"uid"`
	Run string `json:"run"`
	// RootRun and Path are set for a request of a sub-agent's run: the root run, and the runs
	// from it to Run.
	RootRun    string     `json:"rootRun,omitempty"`
	Path       []string   `json:"path,omitempty"`
	Kind       string     `json:"kind"`
	Prompt     string     `json:"prompt,omitempty"`
	URL        string     `json:"url,omitempty"`
	Approvers  *approvers `json:"approvers,omitempty"`
	ToolCall   toolCall   `json:"toolCall"`
	OK         *bool      `json:"ok,omitempty"`
	Reason     string     `json:"reason,omitempty"`
	AnsweredBy string     `json:"answeredBy,omitempty"`

	// Policy is set for a policy's gate; Required and Approvals for a request that needs several
	// approvals (required above 1); Escalation for an escalation only.
	Policy     string          `json:"policy,omitempty"`
	Required   int             `json:"required,omitempty"`
	Approvals  []approval      `json:"approvals,omitempty"`
	Escalation *escalationData `json:"escalation,omitempty"`
}

type approval struct {
	User   string     `json:"user"`
	OK     bool       `json:"ok"`
	Reason string     `json:"reason,omitempty"`
	At     *time.Time `json:"at,omitempty"`
}

type approvers struct {
	Users  []string `json:"users,omitempty"`
	Groups []string `json:"groups,omitempty"`
}

type toolCall struct {
	Name string `json:"name"`
	// Arguments is the JSON object the model sent, as a string, as the PendingRequest shows it.
	Arguments string `json:"arguments,omitempty"`
}

// CloudEvent renders m as a CloudEvents 1.0 event in structured mode. Its id, <request
// uid>/<event> (<request uid>/escalated/<step> for an escalation), is the same on every attempt,
// so a receiver can drop duplicates.
func CloudEvent(m Message) ([]byte, error) {
	d := data{Namespace: m.Namespace, Name: m.Name, UID: m.UID, Run: m.Run, Kind: m.Kind, Prompt: m.Prompt, URL: m.URL,
		ToolCall: toolCall{Name: m.Tool, Arguments: m.Arguments}}
	if len(m.Path) > 1 {
		d.RootRun, d.Path = m.Path[0], m.Path
	}
	if len(m.Users)+len(m.Groups) > 0 {
		d.Approvers = &approvers{Users: m.Users, Groups: m.Groups}
	}
	if a := m.Answer; a != nil {
		d.OK, d.Reason, d.AnsweredBy = &a.OK, a.Reason, a.AnsweredBy
	}
	d.Policy, d.Escalation = m.Policy, m.Escalation.data()
	if m.Quorum() {
		d.Required = m.Required
		for _, a := range m.Approvals {
			e := approval{User: a.User, OK: a.OK, Reason: a.Reason}
			if !a.At.IsZero() {
				e.At = &a.At
			}
			d.Approvals = append(d.Approvals, e)
		}
	}
	e := cloudevent.New(cloudevent.CloudEventsVersionV1)
	e.SetID(eventID(m))
	e.SetType(EventTypePrefix + string(m.Event))
	e.SetSource(fmt.Sprintf("/namespaces/%s/agentruns/%s", m.Namespace, m.Run))
	e.SetSubject(m.Name)
	e.SetTime(m.Time)
	if err := e.SetData(cloudevent.ApplicationJSON, d); err != nil {
		return nil, fmt.Errorf("encoding the event data: %w", err)
	}
	if err := e.Validate(); err != nil {
		return nil, fmt.Errorf("building the CloudEvent: %w", err)
	}
	return json.Marshal(e)
}

// PathText is a delegation path as people read it: root → child.
func PathText(path []string) string { return strings.Join(path, " → ") }

// where is the run a request belongs to, as a message names it: namespace/run, or for a sub-agent's
// run namespace/root → … → run.
func (m Message) where() string {
	if len(m.Path) > 1 {
		return m.Namespace + "/" + PathText(m.Path)
	}
	return m.Namespace + "/" + m.Run
}

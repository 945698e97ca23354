package notify

import (
	"fmt"
	"time"
)

// Escalated: a request of a policy is still undecided once an escalation step's after has
// passed, and the step's approvers may approve too. Only the step's own sinks are told.
const Escalated Event = "escalated"

// Escalation is the step an Escalated message is about.
type Escalation struct {
	// Step is the step's index in the request's spec.escalation, as status.escalations records
	// it; Steps is how many steps the request has.
	Step, Steps int
	// After is how long after the request opened the step applied.
	After time.Duration
	// Users and Groups are the approvers the step adds; the message's own Users and Groups are
	// everybody who may approve from then on.
	Users, Groups []string
}

// escalationData is the CloudEvent data of an escalation.
type escalationData struct {
	Step      int        `json:"step"`
	After     string     `json:"after"`
	Approvers *approvers `json:"approvers,omitempty"`
}

func (e *Escalation) data() *escalationData {
	if e == nil {
		return nil
	}
	d := &escalationData{Step: e.Step, After: e.After.String()}
	if len(e.Users)+len(e.Groups) > 0 {
		d.Approvers = &approvers{Users: e.Users, Groups: e.Groups}
	}
	return d
}

// eventID is a notification's CloudEvent id: one per request and event, and per step for an
// escalation (a request escalates up to once per step).
func eventID(m Message) string {
	if m.Escalation != nil {
		return fmt.Sprintf("%s/%s/%d", m.UID, m.Event, m.Escalation.Step)
	}
	return m.UID + "/" + string(m.Event)
}

// escalatedHeadline is the Slack headline of an escalation, naming the step as people count
// (from 1) and the policy.
func escalatedHeadline(m Message, where string) string {
	e := m.Escalation
	if e == nil {
		return fmt.Sprintf("Request %s of run %s is escalated: it still waits for %s", m.Name, where, wanted(m))
	}
	return fmt.Sprintf("Request %s of run %s is undecided after %s: escalation step %d of %d of policy %s",
		m.Name, where, e.After, e.Step+1, e.Steps, m.Policy)
}

// policyFields are the Slack fields of a policy's request: the policy, and for an escalation
// who the step adds.
func policyFields(m Message) []slackText {
	if m.Policy == "" {
		return nil
	}
	fields := []slackText{mrkdwn("*Policy*\n" + line(m.Policy, slackFieldLimit))}
	if e := m.Escalation; e != nil {
		added := "no approvers"
		if len(e.Users)+len(e.Groups) > 0 {
			added = whoMayAnswer(Message{Users: e.Users, Groups: e.Groups})
		}
		fields = append(fields, mrkdwn(fmt.Sprintf("*Escalation step %d of %d*\nadds %s", e.Step+1, e.Steps, added)))
	}
	return fields
}

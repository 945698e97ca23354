// Package audit builds the audit trail of PendingRequests, one CloudEvent per thing that happened
// to a request, and delivers one event with one HTTP request (internal/notify's Post). Like notify
// it keeps no state and imports no Kubernetes: internal/controller/auditor decides what a request
// is owed, when to try again, and records what was delivered. docs/audit.md is the schema.
package audit

import (
	"encoding/json"
	"fmt"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"

	"github.com/toolnexus/operator/internal/clip"
)

// Kind is what happened to a request, the last part of its event's type.
type Kind string

// The audit events of a request.
const (
	// Requested: the request was opened.
	Requested Kind = "requested"
	// Approval: one approver added an entry to status.approvals.
	Approval Kind = "approval"
	// Answered: the request was answered (by a person, an automation, or system:quorum).
	Answered Kind = "answered"
	// Expired: the manager answered it on expiry.
	Expired Kind = "expired"
	// Cancelled: it ended unanswered.
	Cancelled Kind = "cancelled"
	// Executed: the run took an ok answer in, and its call went ahead.
	Executed Kind = "executed"
)

// TypePrefix starts the CloudEvents type of every audit event: <prefix><kind>.
const TypePrefix = "dev.toolnexus.audit."

// Why a request was cancelled.
const (
	// WhyRunGone: the run ended (it completed, failed or was cancelled) before an answer came.
	WhyRunGone = "RunGone"
	// WhyDeleted: the request was deleted unanswered: its run was deleted, or it was by hand.
	WhyDeleted = "Deleted"
)

// maxReason bounds a reason an event carries, as the API bounds it.
const maxReason = 1024

// Event is one audit event of one request. Its fields are the request's own (names the API
// bounds) and digests: never the arguments, an answer's data or a Secret.
type Event struct {
	Kind Kind
	// Namespace and Run are the request's namespace and AgentRun; Request, UID and RequestKind
	// its name, metadata.uid and spec.request.kind.
	Namespace, Run, Request, UID, RequestKind string
	// Tool is the suspended call's tool; ArgumentsDigest the digest of its arguments.
	Tool, ArgumentsDigest string
	// Policy is the ApprovalPolicy whose gate the request is, when it is one.
	Policy *Policy
	// RequestedBy is who created the run.
	RequestedBy string
	// Approval is the entry of an Approval event.
	Approval *ApprovalEntry
	// Answer is the answer of an Answered or Expired event.
	Answer *Answer
	// ExpiresAt is when the request expired (Expired), as the request states it.
	ExpiresAt string
	// Why says why it was cancelled (Cancelled): WhyRunGone or WhyDeleted.
	Why string
	// Time is when it happened, as the request records it; zero leaves the CloudEvent's time out.
	Time time.Time
}

// Policy names an ApprovalPolicy and the generation applied.
type Policy struct {
	Name       string `json:"name"`
	Generation int64  `json:"generation"`
}

// ApprovalEntry is one approver's entry.
type ApprovalEntry struct {
	User   string     `json:"user"`
	OK     bool       `json:"ok"`
	Reason string     `json:"reason,omitempty"`
	At     *time.Time `json:"at,omitempty"`
}

// Answer is who answered, when, and with what verdict; never its data.
type Answer struct {
	AnsweredBy string     `json:"answeredBy,omitempty"`
	AnsweredAt *time.Time `json:"answeredAt,omitempty"`
	OK         bool       `json:"ok"`
	Reason     string     `json:"reason,omitempty"`
}

// Key names the event within its request: its kind, and for an approval "approval/<user>". It is
// what status.audited records once the event is delivered.
func (e Event) Key() string {
	if e.Kind == Approval && e.Approval != nil {
		return string(Approval) + "/" + e.Approval.User
	}
	return string(e.Kind)
}

// ID is the CloudEvent's id, <request uid>/<key>: the same on every attempt and after a restart,
// so a receiver recognises a delivery it already has.
func (e Event) ID() string {
	return e.UID + "/" + e.Key()
}

// data is the CloudEvent's data.
type data struct {
	Namespace       string         `json:"namespace"`
	Run             string         `json:"run"`
	Request         request        `json:"request"`
	Tool            string         `json:"tool"`
	ArgumentsDigest string         `json:"argumentsDigest"`
	Policy          *Policy        `json:"policy,omitempty"`
	RequestedBy     string         `json:"requestedBy,omitempty"`
	Approval        *ApprovalEntry `json:"approval,omitempty"`
	// The answer's fields are the event's own (answered, expired).
	AnsweredBy string     `json:"answeredBy,omitempty"`
	AnsweredAt *time.Time `json:"answeredAt,omitempty"`
	OK         *bool      `json:"ok,omitempty"`
	Reason     string     `json:"reason,omitempty"`
	ExpiresAt  string     `json:"expiresAt,omitempty"`
	Why        string     `json:"why,omitempty"`
}

type request struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
	Kind string `json:"kind"`
}

// CloudEvent renders e as a CloudEvents 1.0 event in structured mode.
func CloudEvent(e Event) ([]byte, error) {
	d := data{Namespace: e.Namespace, Run: e.Run, Request: request{Name: e.Request, UID: e.UID, Kind: e.RequestKind},
		Tool: e.Tool, ArgumentsDigest: e.ArgumentsDigest, Policy: e.Policy, RequestedBy: e.RequestedBy,
		ExpiresAt: e.ExpiresAt, Why: e.Why}
	if a := e.Approval; a != nil {
		d.Approval = &ApprovalEntry{User: a.User, OK: a.OK, Reason: clip.Marked(a.Reason, maxReason), At: a.At}
	}
	if a := e.Answer; a != nil {
		d.AnsweredBy, d.AnsweredAt, d.OK, d.Reason = a.AnsweredBy, a.AnsweredAt, &a.OK, clip.Marked(a.Reason, maxReason)
	}
	ce := cloudevent.New(cloudevent.CloudEventsVersionV1)
	ce.SetID(e.ID())
	ce.SetType(TypePrefix + string(e.Kind))
	ce.SetSource(fmt.Sprintf("/namespaces/%s/agentruns/%s", e.Namespace, e.Run))
	ce.SetSubject(e.Request)
	if !e.Time.IsZero() {
		ce.SetTime(e.Time)
	}
	if err := ce.SetData(cloudevent.ApplicationJSON, d); err != nil {
		return nil, fmt.Errorf("encoding the audit event's data: %w", err)
	}
	if err := ce.Validate(); err != nil {
		return nil, fmt.Errorf("building the audit CloudEvent: %w", err)
	}
	return json.Marshal(ce)
}

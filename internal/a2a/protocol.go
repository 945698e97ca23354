// Package a2a is the Agent2Agent protocol, version 1.0, as far as this project speaks it: the data
// model of specification/a2a.proto in its ProtoJSON form (camelCase fields, enums by their
// SCREAMING_SNAKE_CASE names), the JSON-RPC 2.0 binding over HTTP (specification §9) with
// Server-Sent Events for streams, and a client for that binding. The A2A Go SDK of 1.0 (a2a-go/v2)
// is not served by the module proxy this project builds from, and the served v0.3 speaks the
// 0.3 protocol (other method names and enums), so this follows the specification's text instead.
//
// The standard library only (and internal/clip): the A2A client tool (internal/tools) and the gateway
// (internal/a2a/gateway) share it, and the tools know nothing about Kubernetes.
package a2a

import (
	"encoding/json"
	"strings"
)

// ProtocolVersion is the A2A version this package speaks, as the A2A-Version header carries it.
const ProtocolVersion = "1.0"

// VersionHeader is the service parameter naming the protocol version of a request (§3.6).
const VersionHeader = "A2A-Version"

// ProtocolBindingJSONRPC names the JSON-RPC binding in an AgentInterface.
const ProtocolBindingJSONRPC = "JSONRPC"

// WellKnownCardPath is where an agent's card is served, relative to the agent's base URL (§8.2).
const WellKnownCardPath = ".well-known/agent-card.json"

// JSON-RPC methods of the binding (§5.3).
const (
	MethodSendMessage          = "SendMessage"
	MethodSendStreamingMessage = "SendStreamingMessage"
	MethodGetTask              = "GetTask"
	MethodListTasks            = "ListTasks"
	MethodCancelTask           = "CancelTask"
	MethodSubscribeToTask      = "SubscribeToTask"
)

// TaskState is where a task stands (TaskState in a2a.proto).
type TaskState string

// Task states.
const (
	TaskStateUnspecified   TaskState = "TASK_STATE_UNSPECIFIED"
	TaskStateSubmitted     TaskState = "TASK_STATE_SUBMITTED"
	TaskStateWorking       TaskState = "TASK_STATE_WORKING"
	TaskStateCompleted     TaskState = "TASK_STATE_COMPLETED"
	TaskStateFailed        TaskState = "TASK_STATE_FAILED"
	TaskStateCanceled      TaskState = "TASK_STATE_CANCELED"
	TaskStateInputRequired TaskState = "TASK_STATE_INPUT_REQUIRED"
	TaskStateRejected      TaskState = "TASK_STATE_REJECTED"
	TaskStateAuthRequired  TaskState = "TASK_STATE_AUTH_REQUIRED"
)

// Terminal reports whether a task in state s accepts no further messages.
func (s TaskState) Terminal() bool {
	switch s {
	case TaskStateCompleted, TaskStateFailed, TaskStateCanceled, TaskStateRejected:
		return true
	}
	return false
}

// Interrupted reports whether a task in state s waits for its client.
func (s TaskState) Interrupted() bool {
	return s == TaskStateInputRequired || s == TaskStateAuthRequired
}

// Short is the state without its prefix, in lower case ("input_required"), for people.
func (s TaskState) Short() string {
	return strings.ToLower(strings.TrimPrefix(string(s), "TASK_STATE_"))
}

// Role is who sent a message.
type Role string

// Roles.
const (
	RoleUser  Role = "ROLE_USER"
	RoleAgent Role = "ROLE_AGENT"
)

// Part is one piece of a message or artifact: exactly one of text, raw, url or data.
type Part struct {
	Text      string          `json:"text,omitempty"`
	Raw       []byte          `json:"raw,omitempty"`
	URL       string          `json:"url,omitempty"`
	Data      json.RawMessage `json:"data,omitempty"`
	Metadata  map[string]any  `json:"metadata,omitempty"`
	Filename  string          `json:"filename,omitempty"`
	MediaType string          `json:"mediaType,omitempty"`
}

// Message is one turn of communication between a client and an agent.
type Message struct {
	MessageID        string         `json:"messageId"`
	ContextID        string         `json:"contextId,omitempty"`
	TaskID           string         `json:"taskId,omitempty"`
	Role             Role           `json:"role"`
	Parts            []Part         `json:"parts"`
	Metadata         map[string]any `json:"metadata,omitempty"`
	Extensions       []string       `json:"extensions,omitempty"`
	ReferenceTaskIDs []string       `json:"referenceTaskIds,omitempty"`
}

// Text joins the message's text parts with newlines.
func (m *Message) Text() string {
	if m == nil {
		return ""
	}
	var texts []string
	for _, p := range m.Parts {
		if p.Text != "" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n")
}

// TaskStatus is a task's state, the message that goes with it, and when it was set.
type TaskStatus struct {
	State     TaskState `json:"state"`
	Message   *Message  `json:"message,omitempty"`
	Timestamp string    `json:"timestamp,omitempty"`
}

// Artifact is an output of a task.
type Artifact struct {
	ArtifactID  string         `json:"artifactId"`
	Name        string         `json:"name,omitempty"`
	Description string         `json:"description,omitempty"`
	Parts       []Part         `json:"parts"`
	Metadata    map[string]any `json:"metadata,omitempty"`
}

// Task is a stateful unit of work.
type Task struct {
	ID        string         `json:"id"`
	ContextID string         `json:"contextId,omitempty"`
	Status    TaskStatus     `json:"status"`
	Artifacts []Artifact     `json:"artifacts,omitempty"`
	History   []Message      `json:"history,omitempty"`
	Metadata  map[string]any `json:"metadata,omitempty"`
}

// ArtifactText joins the text parts of every artifact with newlines.
func (t *Task) ArtifactText() string {
	var texts []string
	for _, a := range t.Artifacts {
		for _, p := range a.Parts {
			if p.Text != "" {
				texts = append(texts, p.Text)
			}
		}
	}
	return strings.Join(texts, "\n")
}

// TaskStatusUpdateEvent is a change of a task's status, in a stream.
type TaskStatusUpdateEvent struct {
	TaskID    string         `json:"taskId"`
	ContextID string         `json:"contextId"`
	Status    TaskStatus     `json:"status"`
	Metadata  map[string]any `json:"metadata,omitempty"`
}

// TaskArtifactUpdateEvent is a new or extended artifact, in a stream.
type TaskArtifactUpdateEvent struct {
	TaskID    string         `json:"taskId"`
	ContextID string         `json:"contextId"`
	Artifact  Artifact       `json:"artifact"`
	Append    bool           `json:"append,omitempty"`
	LastChunk bool           `json:"lastChunk,omitempty"`
	Metadata  map[string]any `json:"metadata,omitempty"`
}

// SendMessageConfiguration says how a SendMessage is to be answered.
type SendMessageConfiguration struct {
	AcceptedOutputModes []string `json:"acceptedOutputModes,omitempty"`
	HistoryLength       *int32   `json:"historyLength,omitempty"`
	// ReturnImmediately answers as soon as the task exists; otherwise the server answers once the
	// task is terminal or interrupted.
	ReturnImmediately bool `json:"returnImmediately,omitempty"`
}

// SendMessageRequest is the params of SendMessage and SendStreamingMessage.
type SendMessageRequest struct {
	Tenant        string                    `json:"tenant,omitempty"`
	Message       Message                   `json:"message"`
	Configuration *SendMessageConfiguration `json:"configuration,omitempty"`
	Metadata      map[string]any            `json:"metadata,omitempty"`
}

// SendMessageResponse is the result of SendMessage: a task, or a direct message.
type SendMessageResponse struct {
	Task    *Task    `json:"task,omitempty"`
	Message *Message `json:"message,omitempty"`
}

// StreamResponse is one event of a stream: exactly one of its fields.
type StreamResponse struct {
	Task           *Task                    `json:"task,omitempty"`
	Message        *Message                 `json:"message,omitempty"`
	StatusUpdate   *TaskStatusUpdateEvent   `json:"statusUpdate,omitempty"`
	ArtifactUpdate *TaskArtifactUpdateEvent `json:"artifactUpdate,omitempty"`
}

// GetTaskRequest is the params of GetTask.
type GetTaskRequest struct {
	Tenant        string `json:"tenant,omitempty"`
	ID            string `json:"id"`
	HistoryLength *int32 `json:"historyLength,omitempty"`
}

// ListTasksRequest is the params of ListTasks.
type ListTasksRequest struct {
	Tenant               string    `json:"tenant,omitempty"`
	ContextID            string    `json:"contextId,omitempty"`
	Status               TaskState `json:"status,omitempty"`
	PageSize             *int32    `json:"pageSize,omitempty"`
	PageToken            string    `json:"pageToken,omitempty"`
	HistoryLength        *int32    `json:"historyLength,omitempty"`
	StatusTimestampAfter string    `json:"statusTimestampAfter,omitempty"`
	IncludeArtifacts     *bool     `json:"includeArtifacts,omitempty"`
}

// ListTasksResponse is the result of ListTasks. NextPageToken is always present, empty on the
// last page.
type ListTasksResponse struct {
	Tasks         []Task `json:"tasks"`
	NextPageToken string `json:"nextPageToken"`
	PageSize      int32  `json:"pageSize"`
	TotalSize     int32  `json:"totalSize"`
}

// CancelTaskRequest is the params of CancelTask.
type CancelTaskRequest struct {
	Tenant   string         `json:"tenant,omitempty"`
	ID       string         `json:"id"`
	Metadata map[string]any `json:"metadata,omitempty"`
}

// SubscribeToTaskRequest is the params of SubscribeToTask.
type SubscribeToTaskRequest struct {
	Tenant string `json:"tenant,omitempty"`
	ID     string `json:"id"`
}

// AgentCard describes an agent: who it is, where and how to reach it, what it needs of callers.
type AgentCard struct {
	Name                 string                    `json:"name"`
	Description          string                    `json:"description"`
	SupportedInterfaces  []AgentInterface          `json:"supportedInterfaces"`
	Provider             *AgentProvider            `json:"provider,omitempty"`
	Version              string                    `json:"version"`
	DocumentationURL     string                    `json:"documentationUrl,omitempty"`
	Capabilities         AgentCapabilities         `json:"capabilities"`
	SecuritySchemes      map[string]SecurityScheme `json:"securitySchemes,omitempty"`
	SecurityRequirements []SecurityRequirement     `json:"securityRequirements,omitempty"`
	DefaultInputModes    []string                  `json:"defaultInputModes"`
	DefaultOutputModes   []string                  `json:"defaultOutputModes"`
	Skills               []AgentSkill              `json:"skills"`
}

// AgentInterface is one URL and protocol binding the agent is served on.
type AgentInterface struct {
	URL             string `json:"url"`
	ProtocolBinding string `json:"protocolBinding"`
	Tenant          string `json:"tenant,omitempty"`
	ProtocolVersion string `json:"protocolVersion"`
}

// AgentProvider is who runs the agent.
type AgentProvider struct {
	URL          string `json:"url"`
	Organization string `json:"organization"`
}

// AgentCapabilities are the optional features the agent supports.
type AgentCapabilities struct {
	Streaming         *bool `json:"streaming,omitempty"`
	PushNotifications *bool `json:"pushNotifications,omitempty"`
	ExtendedAgentCard *bool `json:"extendedAgentCard,omitempty"`
}

// AgentSkill is one thing the agent can do.
type AgentSkill struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	Description string   `json:"description"`
	Tags        []string `json:"tags"`
	Examples    []string `json:"examples,omitempty"`
	InputModes  []string `json:"inputModes,omitempty"`
	OutputModes []string `json:"outputModes,omitempty"`
}

// SecurityScheme is one way to authenticate; this project uses HTTP bearer only.
type SecurityScheme struct {
	HTTPAuthSecurityScheme *HTTPAuthSecurityScheme `json:"httpAuthSecurityScheme,omitempty"`
}

// HTTPAuthSecurityScheme is HTTP authentication with a scheme such as Bearer.
type HTTPAuthSecurityScheme struct {
	Description  string `json:"description,omitempty"`
	Scheme       string `json:"scheme"`
	BearerFormat string `json:"bearerFormat,omitempty"`
}

// SecurityRequirement names the schemes (with their scopes) a request must satisfy together.
type SecurityRequirement struct {
	Schemes map[string]StringList `json:"schemes"`
}

// StringList is a list of strings (a2a.proto wraps lists that are map values).
type StringList struct {
	List []string `json:"list"`
}

// A task of a toolnexus agent that waits on a person carries, in its status message, one data part
// per PendingRequest it waits on, marked by RequestMetadataKey in the part's metadata. A follow-up
// message answers one with a data part holding an AnswerPart (a JSON object with a boolean "ok"),
// or with text, which the gateway reads by the request's kind (docs: README, "A2A").
const RequestMetadataKey = "toolnexus.dev/pendingRequest"

// RequestPart is a PendingRequest as a task's status message shows it: its name and UID (which an
// answer binds to), and the toolnexus Request with the call it suspended.
type RequestPart struct {
	Name      string         `json:"name"`
	UID       string         `json:"uid,omitempty"`
	ID        string         `json:"id,omitempty"`
	Kind      string         `json:"kind"`
	Prompt    string         `json:"prompt,omitempty"`
	URL       string         `json:"url,omitempty"`
	Data      map[string]any `json:"data,omitempty"`
	ExpiresAt string         `json:"expiresAt,omitempty"`
	Tool      string         `json:"tool,omitempty"`
	Arguments string         `json:"arguments,omitempty"`
}

// AnswerPart answers one request of a task: the toolnexus Answer (ok, data, reason), and the
// request it is for by name or UID (the first open request when neither is given). A RequestUID
// binds the answer to the object its answerer saw: the API server refuses it for any other.
type AnswerPart struct {
	Request    string         `json:"request,omitempty"`
	RequestUID string         `json:"requestUID,omitempty"`
	OK         bool           `json:"ok"`
	Data       map[string]any `json:"data,omitempty"`
	Reason     string         `json:"reason,omitempty"`
}

// Requests returns the RequestParts of m's data parts.
func (m *Message) Requests() []RequestPart {
	if m == nil {
		return nil
	}
	var out []RequestPart
	for _, p := range m.Parts {
		if _, ok := p.Metadata[RequestMetadataKey]; !ok || len(p.Data) == 0 {
			continue
		}
		var r RequestPart
		if json.Unmarshal(p.Data, &r) == nil && r.Kind != "" {
			out = append(out, r)
		}
	}
	return out
}

// Answer returns the AnswerPart of m's first data part that is a JSON object with a boolean "ok".
func (m *Message) Answer() (*AnswerPart, bool) {
	for _, p := range m.Parts {
		var probe map[string]json.RawMessage
		if len(p.Data) == 0 || json.Unmarshal(p.Data, &probe) != nil {
			continue
		}
		var ok bool
		if raw, has := probe["ok"]; !has || json.Unmarshal(raw, &ok) != nil {
			continue
		}
		var a AnswerPart
		if json.Unmarshal(p.Data, &a) == nil {
			return &a, true
		}
	}
	return nil, false
}

package loop

import "github.com/toolnexus/operator/internal/loop/state"

// The durable state the step machine advances lives in package state, free of model SDKs so that
// the record format and the kubectl plugin can use it. It is re-exported here under the names the
// loop has always used.

type (
	// State is the durable state of a run: everything needed to continue it in a fresh process.
	State = state.State
	// Message is one entry of the provider-neutral transcript.
	Message = state.Message
	// MessageToolCall is a tool call requested by an assistant message.
	MessageToolCall = state.MessageToolCall
	// Usage is the token count, summed over the model turns of a run.
	Usage = state.Usage
	// ToolCall summarises one finished tool call.
	ToolCall = state.ToolCall
	// Call is a tool call of the current turn.
	Call = state.Call
	// Phase is where a tool call of the current turn stands.
	Phase = state.Phase
	// Gate is what a host said about an approval gate it raised.
	Gate = state.Gate
	// Announcement names the object a host published a suspension as.
	Announcement = state.Announcement
	// Outcome is an end of the run that the host decided.
	Outcome = state.Outcome
	// Wait is a call's wait on external work.
	Wait = state.Wait
	// Action is a kind of step.
	Action = state.Action
	// RunResult mirrors the toolnexus RunResult.
	RunResult = state.RunResult
)

// Roles, call phases, actions, statuses and limits.
const (
	RoleUser      = state.RoleUser
	RoleAssistant = state.RoleAssistant
	RoleTool      = state.RoleTool

	PhaseQueued    = state.PhaseQueued
	PhaseSuspended = state.PhaseSuspended
	PhaseAnswered  = state.PhaseAnswered
	PhaseWaiting   = state.PhaseWaiting
	PhaseDone      = state.PhaseDone

	ActionModelTurn = state.ActionModelTurn
	ActionToolCalls = state.ActionToolCalls
	ActionWaiting   = state.ActionWaiting
	ActionFinished  = state.ActionFinished

	StatusDone       = state.StatusDone
	StatusPending    = state.StatusPending
	StatusIncomplete = state.StatusIncomplete

	LimitMaxTurns = state.LimitMaxTurns
	LimitTimeout  = state.LimitTimeout
)

// NewState starts a run with prompt as the first user turn.
func NewState(prompt string) *State { return state.New(prompt) }

// ValidateAnswer checks that a fits req; see state.ValidateAnswer.
var ValidateAnswer = state.ValidateAnswer

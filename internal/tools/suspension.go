package tools

import "github.com/toolnexus/operator/internal/tools/wire"

// The suspension vocabulary lives in package wire, which depends on nothing, so the record format
// and the kubectl plugin can use it without this package's MCP and CEL dependencies. It is part of
// the tool model, and re-exported here under the same names.

type (
	// Request is a suspended tool call's question to a person or an automation (toolnexus §10).
	Request = wire.Request
	// Answer resolves a Request.
	Answer = wire.Answer
	// ToolResult is what a tool returns; a suspension carries its Request in metadata.pending.
	ToolResult = wire.ToolResult
	// Wait is the handle of external work a call waits on (an MCP task); see wire.Wait.
	Wait = wire.Wait
	// Round is what a call asks in one go (several requests, answered together); see wire.Round.
	Round = wire.Round
	// Ask is one request of a Round.
	Ask = wire.Ask
)

// Request kinds, answer reasons and data keys of the toolnexus vocabulary.
const (
	KindAuthorization = wire.KindAuthorization
	KindApproval      = wire.KindApproval
	KindInput         = wire.KindInput
	KindQuestion      = wire.KindQuestion
	KindToolCall      = wire.KindToolCall

	ReasonDeclined  = wire.ReasonDeclined
	ReasonCancelled = wire.ReasonCancelled
	ReasonExpired   = wire.ReasonExpired

	DefaultAuthPrompt = wire.DefaultAuthPrompt

	WaitKindMCPTask = wire.WaitKindMCPTask
	WaitKindA2ATask = wire.WaitKindA2ATask

	ResultsKey = wire.ResultsKey
	OutputKey  = wire.OutputKey
)

// The helpers of the suspension vocabulary.
var (
	Pending        = wire.Pending
	AuthRequired   = wire.AuthRequired
	PendingOf      = wire.PendingOf
	AnswerOutput   = wire.AnswerOutput
	AnswerDeclined = wire.AnswerDeclined
	RecognisedKeys = wire.RecognisedKeys
	ErrNoOutput    = wire.ErrNoOutput
	Waiting        = wire.Waiting
	WaitOf         = wire.WaitOf
	Asking         = wire.Asking
	RoundOf        = wire.RoundOf
)

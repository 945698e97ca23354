package a2a

import (
	"encoding/json"
	"fmt"
)

// JSON-RPC error codes: the standard ones, and those of A2A (§5.4).
const (
	CodeParseError     = -32700
	CodeInvalidRequest = -32600
	CodeMethodNotFound = -32601
	CodeInvalidParams  = -32602
	CodeInternalError  = -32603

	CodeTaskNotFound                 = -32001
	CodeTaskNotCancelable            = -32002
	CodePushNotificationNotSupported = -32003
	CodeUnsupportedOperation         = -32004
	CodeContentTypeNotSupported      = -32005
	CodeInvalidAgentResponse         = -32006
	CodeVersionNotSupported          = -32009

	// CodeRefused is this project's code for a request the authenticated caller may not make (the
	// API server refused what it would do as them): JSON-RPC leaves -32000 to implementations,
	// outside the range A2A reserves.
	CodeRefused = -32000
)

// ErrorInfoType is the @type of a google.rpc.ErrorInfo detail.
const ErrorInfoType = "type.googleapis.com/google.rpc.ErrorInfo"

// Request is a JSON-RPC 2.0 request.
type Request struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params,omitempty"`
}

// Response is a JSON-RPC 2.0 response: a result or an error.
type Response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *Error          `json:"error,omitempty"`
}

// Error is a JSON-RPC error object. Data holds details, each an object with an @type key.
type Error struct {
	Code    int              `json:"code"`
	Message string           `json:"message"`
	Data    []map[string]any `json:"data,omitempty"`
}

func (e *Error) Error() string { return fmt.Sprintf("%s (%d)", e.Message, e.Code) }

// Errorf is an error with code and a message; reason, when set, is added as an ErrorInfo detail
// (its machine-readable reason, in the domain toolnexus.dev).
func Errorf(code int, reason, format string, a ...any) *Error {
	e := &Error{Code: code, Message: fmt.Sprintf(format, a...)}
	if reason != "" {
		e.Data = []map[string]any{{"@type": ErrorInfoType, "reason": reason, "domain": "toolnexus.dev"}}
	}
	return e
}

// Reason is the reason of the error's ErrorInfo detail, or "".
func (e *Error) Reason() string {
	for _, d := range e.Data {
		if d["@type"] == ErrorInfoType {
			r, _ := d["reason"].(string)
			return r
		}
	}
	return ""
}

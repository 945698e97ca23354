package state

import (
	"fmt"
	"strings"

	"github.com/toolnexus/operator/internal/tools/wire"
)

// Answer records the answer to a suspended call. A refusal (OK false) finishes the call at once
// with the error result "declined/expired: <prompt>" (plus "\nreason: <reason>"), so the tool
// never runs again; an approval makes the call runnable: the next Step re-executes it once with
// the answer. An answer that does not fit its request is refused and st is left unchanged.
func (st *State) Answer(callID string, a wire.Answer) error {
	i := -1
	for j := range st.Calls {
		if st.Calls[j].ID == callID {
			i = j
			break
		}
	}
	if i < 0 {
		return fmt.Errorf("state: no tool call %q in the current turn", callID)
	}
	call := &st.Calls[i]
	switch {
	case call.Answer != nil:
		return fmt.Errorf("state: tool call %q is already answered", callID)
	case call.Phase != PhaseSuspended:
		return fmt.Errorf("state: tool call %q is not waiting for an answer (phase %s)", callID, call.Phase)
	}
	if err := ValidateAnswer(*call.Request, a); err != nil {
		return err
	}
	ans := a
	if ans.ID == "" {
		// The id is optional for the answerer; the tool sees the answer as addressed to its request.
		ans.ID = call.Request.ID
	}
	call.Answer = &ans
	if a.OK {
		call.Phase = PhaseAnswered
		return nil
	}
	out := "declined/expired: " + call.Request.Prompt
	if a.Reason != "" {
		// A timeout must never read as a refusal, so the reason travels with the result.
		out += "\nreason: " + a.Reason
	}
	call.Phase, call.Result = PhaseDone, &wire.ToolResult{Output: out, IsError: true}
	return nil
}

// ValidateAnswer checks that a fits req: the id, when given, echoes the request's, and an OK
// answer to an input, question or tool_call request carries a result the tool can use, so an
// empty "success" never fabricates a tool result. Errors name what is missing and never echo
// values.
func ValidateAnswer(req wire.Request, a wire.Answer) error {
	if a.ID != "" && a.ID != req.ID {
		return fmt.Errorf("state: answer id %q does not echo the pending request id %q", a.ID, req.ID)
	}
	if !a.OK {
		return nil
	}
	if a.Reason != "" {
		return fmt.Errorf("state: answer to request %q has ok: true and a reason; a reason is only for ok: false", req.ID)
	}
	switch req.Kind {
	case wire.KindInput:
		return validateInput(req, a)
	case wire.KindQuestion:
		if len(a.Data) == 0 {
			return fmt.Errorf("state: answer to question request %q has no data: ok: true needs a non-empty data object holding the answers", req.ID)
		}
	case wire.KindToolCall:
		_, results := a.Data[wire.ResultsKey].([]any)
		_, output := a.Data[wire.OutputKey].(string)
		if !results && !output {
			return fmt.Errorf("state: answer to tool_call request %q carries no result: ok: true needs data.%s (an array) or data.%s (a string) (keys seen: %v)",
				req.ID, wire.ResultsKey, wire.OutputKey, a.DataKeys())
		}
	}
	return nil
}

// validateInput accepts data.output as a string or, for a form (data.schema), a data object with
// the schema's required fields.
func validateInput(req wire.Request, a wire.Answer) error {
	if v, ok := a.Data[wire.OutputKey]; ok {
		if _, isString := v.(string); isString {
			return nil
		}
		return fmt.Errorf("state: answer to input request %q has data.output of type %T; it must be a string", req.ID, v)
	}
	schema, hasSchema := req.Data["schema"].(map[string]any)
	if !hasSchema {
		return fmt.Errorf("state: answer to input request %q carries no result: ok: true needs data.output (a string) (keys seen: %v)", req.ID, a.DataKeys())
	}
	var missing []string
	for _, f := range StringList(schema["required"]) {
		if _, ok := a.Data[f]; !ok {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("state: answer to input request %q lacks required field(s) %s of data.schema (or give data.output as a string)",
			req.ID, strings.Join(missing, ", "))
	}
	return nil
}

// StringList reads a JSON array of strings (as decoded into any), skipping what is not a string.
func StringList(v any) []string {
	switch l := v.(type) {
	case []string:
		return l
	case []any:
		out := make([]string, 0, len(l))
		for _, s := range l {
			if str, ok := s.(string); ok {
				out = append(out, str)
			}
		}
		return out
	}
	return nil
}

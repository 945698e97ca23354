package loop

import (
	"fmt"

	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/tools"
)

// A call that asks several things at once (tools.Asking: an MCP input_required result) parks on
// a round: each request is published and answered on its own, and the call runs again once, when
// every one is answered ok, with all the answers and what the tool asked to be handed back
// (state.Round.Resume, kept verbatim). A refusal of any one is the refusal of the call.
//
// After that retry the loop rule holds with one widening, which the multi round-trip protocol
// needs: a retry that asks a round again is unresolved when it repeats a request just answered
// (the same id: the same key and question), and is the call's next round when every request is
// new, up to MaxInputRounds rounds. A retry that suspends on anything but a round is unresolved,
// as any retry's.

// MaxInputRounds bounds the rounds of one call, as the MCP Go SDK bounds its own.
const MaxInputRounds = 10

// askRound parks call on the round r (asked by o), or returns false with o's result made the error
// the model sees: a retry that asks again (above), or a round no record or PendingRequest holds.
func (c *Client) askRound(call *Call, o *execution, r *tools.Round) (Call, bool) {
	fail := func(format string, a ...any) (Call, bool) {
		o.result = tools.ToolResult{Output: fmt.Sprintf("%s cannot wait for its answers: ", call.Name) + fmt.Sprintf(format, a...), IsError: true}
		return Call{}, false
	}
	round := tools.Round{Resume: r.Resume, Asks: append([]tools.Ask(nil), r.Asks...)}
	for i := range round.Asks {
		round.Asks[i].Answer = nil
		if round.Asks[i].Request.ID == "" {
			round.Asks[i].Request.ID = "pending:" + call.ID + "/" + round.Asks[i].Key // the answer must be able to echo it
		}
	}
	number := 1
	if o.retried {
		switch prev := call.Round; {
		case prev == nil || repeats(*call, round):
			o.result = tools.ToolResult{Output: "unresolved: " + call.Request.Prompt, IsError: true}
			return Call{}, false
		case prev.Number >= MaxInputRounds:
			return fail("it asked for input again after %d rounds of answers; at most %d rounds are answered", prev.Number, MaxInputRounds)
		default:
			number = prev.Number + 1
		}
	}
	if err := round.CheckBounds(); err != nil {
		return fail("%v", err)
	}
	var args []byte
	for i := range round.Asks {
		var err error
		if args, err = c.holdable(call.Name, &round.Asks[i].Request, o.args); err != nil {
			return fail("its request %q: %v", round.Asks[i].Key, err)
		}
	}
	first := round.Asks[0]
	held := &state.Round{Number: number, Resume: round.Resume, Key: first.Key}
	for _, a := range round.Asks[1:] {
		held.More = append(held.More, state.Input{Key: a.Key, Request: a.Request})
	}
	next := Call{ID: call.ID, Name: call.Name, Arguments: call.Arguments, Args: string(args), Phase: PhaseSuspended,
		Request: &first.Request, Round: held, Approval: call.Approval, Passed: call.Passed, Wait: call.Wait}
	if call.Gated {
		// The approved tool ran for the first time and asked on its own.
		next.Approval, next.Passed = call.Answer, passedWith(*call)
	}
	return next, true
}

// repeats reports whether r asks again a request of call's round just answered.
func repeats(call Call, r tools.Round) bool {
	answered := map[string]bool{}
	for _, a := range call.Asks() {
		answered[a.Request.ID] = true
	}
	for _, a := range r.Asks {
		if answered[a.Request.ID] {
			return true
		}
	}
	return false
}

// roundOf is the round call parked on, with its answers, as the tool is handed it on the retry.
func roundOf(call Call) *tools.Round {
	r := &tools.Round{Resume: call.Round.Resume}
	for _, a := range call.Asks() {
		r.Asks = append(r.Asks, tools.Ask{Key: a.Key, Request: a.Request, Answer: a.Answer})
	}
	return r
}

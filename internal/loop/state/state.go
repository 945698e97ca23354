// Package state is the durable state of a toolnexus run and its transitions: the transcript, the
// calls of the current turn with their requests, arguments and answers, and how the run ended.
// It is plain data, table-tested and free of model SDKs, so the record format and the kubectl
// plugin can use it; package loop drives it (Step) and re-exports it.
package state

import (
	"encoding/json"
	"fmt"

	"github.com/toolnexus/operator/internal/tools/wire"
)

// Message roles of the provider-neutral transcript.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Message is one entry of the provider-neutral transcript. Each model style translates it to its
// own wire shape, so a run started against one endpoint is plain data, not an SDK value.
type Message struct {
	Role       string            `json:"role"`
	Content    string            `json:"content,omitempty"`
	ToolCalls  []MessageToolCall `json:"toolCalls,omitempty"`
	ToolCallID string            `json:"toolCallID,omitempty"`
	IsError    bool              `json:"isError,omitempty"`
}

// MessageToolCall is a tool call requested by an assistant message. Arguments is the model's raw
// JSON text, kept verbatim so the transcript replays exactly what the model said.
type MessageToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Usage is the token count, summed over the model turns of a run.
type Usage struct {
	PromptTokens     int `json:"promptTokens"`
	CompletionTokens int `json:"completionTokens"`
	TotalTokens      int `json:"totalTokens"`
}

// Add sums o into u.
func (u *Usage) Add(o Usage) {
	u.PromptTokens += o.PromptTokens
	u.CompletionTokens += o.CompletionTokens
	u.TotalTokens += o.TotalTokens
}

// ToolCall summarises one finished tool call. Turn is the 1-based model turn that requested it.
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Output    string `json:"output"`
	IsError   bool   `json:"isError"`
	Turn      int    `json:"turn"`
}

// Phase is where a tool call of the current turn stands.
type Phase string

// Call phases. queued → done, or queued → suspended → answered → done, or suspended → done when
// the answer declines. A call that handed its work to someone else (an MCP task) is waiting until
// the work ends: queued → waiting → done; when the work asks a person something on the way, the
// call is suspended on that request and back to waiting once it is answered.
const (
	PhaseQueued    Phase = "queued"
	PhaseSuspended Phase = "suspended"
	PhaseAnswered  Phase = "answered"
	PhaseWaiting   Phase = "waiting"
	PhaseDone      Phase = "done"
)

// Call is a tool call of the current turn, with everything needed to finish it in another process.
type Call struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	// Args are the arguments the call runs with, as JSON text: the model's, or what BeforeTool
	// rewrote them to (even to {}). Set when the call suspends; its answerer is shown exactly
	// these, and the retry with the answer runs with exactly these.
	Args    string           `json:"args,omitempty"`
	Phase   Phase            `json:"phase"`
	Request *wire.Request    `json:"request,omitempty"`
	Answer  *wire.Answer     `json:"answer,omitempty"`
	Result  *wire.ToolResult `json:"result,omitempty"`
	// Gated marks a suspension raised by BeforeTool (an approval gate): the tool has not run yet.
	Gated bool `json:"gated,omitempty"`
	// Approval is the gate's answer once the approved tool, run for the first time, suspended on
	// its own: the call then waits on a second request, the tool's own.
	Approval *wire.Answer `json:"approval,omitempty"`
	// Gate describes the gate a Gated call waits on, as its host defined it, so the host can
	// publish the same request again after a crash.
	Gate *Gate `json:"gate,omitempty"`
	// Passed are the keys of the gates that approved this call so far, in order. A call may be
	// gated several times (a platform's policies and its run's own gates); it runs only once
	// BeforeTool raises no gate outside Passed.
	Passed []string `json:"passed,omitempty"`
	// Announced says where the host published the open suspension for its answerers (for the
	// operator, the PendingRequest it created). The loop does not interpret it; the host reads
	// answers only from the object named here.
	Announced *Announcement `json:"announced,omitempty"`
	// Wait is the external work the call waits on (see Wait). It stays while the work asks a
	// person something, so that the answer goes to the work and the call never starts it again.
	Wait *Wait `json:"wait,omitempty"`
	// Round is set while the call waits on a round of requests the tool asked at once
	// (wire.Round): Request is the round's first, Round.More the others (see Asks).
	Round *Round `json:"round,omitempty"`
}

// Round is what a call asked in one go, beyond its Request: every request is published and
// answered on its own, and the call runs again once, when every one is answered ok.
type Round struct {
	// Number counts the call's rounds from 1: a tool that asks for other input after the answers
	// starts the next one (see loop.MaxInputRounds).
	Number int `json:"number"`
	// Resume is what the tool asked to be handed back with the answers (an MCP requestState),
	// verbatim.
	Resume string `json:"resume,omitempty"`
	// Key is the tool's key of the call's Request.
	Key string `json:"key"`
	// More are the round's other requests, in the order asked.
	More []Input `json:"more,omitempty"`
}

// Input is a request of a round after its first, with what its call's Request has beside it.
type Input struct {
	Key       string        `json:"key"`
	Request   wire.Request  `json:"request"`
	Answer    *wire.Answer  `json:"answer,omitempty"`
	Announced *Announcement `json:"announced,omitempty"`
}

// Ask is one request of a suspended call as its host publishes and settles it: the call's Request,
// or one of its round's others.
type Ask struct {
	// Index is 0 for the call's Request and i+1 for Round.More[i].
	Index     int
	Key       string
	Request   wire.Request
	Answer    *wire.Answer
	Announced *Announcement
}

// Asks lists the requests the call asked, its Request first; none when it asked nothing.
func (c Call) Asks() []Ask {
	if c.Request == nil {
		return nil
	}
	asks := []Ask{{Request: *c.Request, Answer: c.Answer, Announced: c.Announced}}
	if c.Round == nil {
		return asks
	}
	asks[0].Key = c.Round.Key
	for i, in := range c.Round.More {
		asks = append(asks, Ask{Index: i + 1, Key: in.Key, Request: in.Request, Answer: in.Answer, Announced: in.Announced})
	}
	return asks
}

// Announce records that the host published the call's request index (Ask.Index) as a.
func (c *Call) Announce(index int, a Announcement) {
	if index == 0 {
		c.Announced = &a
		return
	}
	c.Round.More[index-1].Announced = &a
}

// Wait is a call's wait on external work that is not a person: the tool's handle of the work, and
// the loop's schedule for looking at it. It is kept general on purpose: an MCP task today, and the
// same wait serves a parent run waiting on a child run or an A2A remote task.
type Wait struct {
	wire.Wait
	// Since is when the call started waiting, Deadline when it stops waiting whatever the work
	// says, and NextPoll when the work is looked at next; RFC 3339 with nanoseconds, UTC.
	Since    string `json:"since"`
	Deadline string `json:"deadline"`
	NextPoll string `json:"nextPoll"`
	// Polls counts the looks taken, Failures the looks that failed in a row.
	Polls    int `json:"polls,omitempty"`
	Failures int `json:"failures,omitempty"`
	// Due says NextPoll has come (Settle decides it): the next step looks at the work.
	Due bool `json:"due,omitempty"`
}

// OnTimeoutFail, as a Gate's OnTimeout, ends the run when the gate's request expires.
const OnTimeoutFail = "Fail"

// Gate is what a host said about an approval gate it raised (BeforeTool's ToolOverride.Gate).
type Gate struct {
	// Key tells the gate from the call's other gates (for the operator, "run" or "policy/<name>").
	Key string `json:"key"`
	// OnTimeout is what expiry of this gate's request does to the run (OnTimeoutFail ends it,
	// anything else declines the call); empty: the run's own onTimeout.
	OnTimeout string `json:"onTimeout,omitempty"`
	// Terms are the host's description of who decides the gate, opaque to the loop.
	Terms json.RawMessage `json:"terms,omitempty"`
}

// Announcement names the object a host published a suspension as.
type Announcement struct {
	Name string `json:"name"`
	UID  string `json:"uid,omitempty"`
}

// Outcome is an end of the run that the host decided (a failure, a cancellation), as opposed to
// the model's own end (StatusDone, StatusIncomplete).
type Outcome struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// State is the durable state of a run: plain JSON holding everything needed to continue it in a
// fresh process with a new Client. The system prompt is not stored; it comes from Options, so a
// state never carries configuration that could go stale.
type State struct {
	Messages []Message `json:"messages"`
	// Turn counts the model turns done.
	Turn  int    `json:"turn"`
	Usage Usage  `json:"usage"`
	Model string `json:"model,omitempty"`
	// Calls are the tool calls of the current turn in the model's order; empty when the next step
	// is a model turn.
	Calls         []Call     `json:"calls,omitempty"`
	ToolCalls     []ToolCall `json:"toolCalls,omitempty"`
	ToolCallCount int        `json:"toolCallCount"`
	// Status is empty while the run is going, then StatusDone or StatusIncomplete.
	Status string `json:"status,omitempty"`
	Limit  string `json:"limit,omitempty"`
	Text   string `json:"text,omitempty"`
	// Outcome is set when the host ended the run (End); then no step runs.
	Outcome *Outcome `json:"outcome,omitempty"`
	// ModelFailures counts consecutive transient model failures (ModelFailed); a model turn that
	// succeeds resets it.
	ModelFailures int `json:"modelFailures,omitempty"`
	// Abandoned is external work calls of a recorded turn stopped waiting on while it may still go
	// on: the host is told to stop it (Settle), then it is dropped.
	Abandoned []wire.Wait `json:"abandoned,omitempty"`
}

// New starts a run with prompt as the first user turn.
func New(prompt string) *State {
	return &State{Messages: []Message{{Role: RoleUser, Content: prompt}}}
}

// Action is a kind of step.
type Action string

// Actions of the step machine.
const (
	// ActionModelTurn sends the transcript to the model.
	ActionModelTurn Action = "ModelTurn"
	// ActionToolCalls runs the queued and answered calls of the turn and, once every call is done,
	// appends their results to the transcript.
	ActionToolCalls Action = "ToolCalls"
	// ActionWaiting means nothing can run: every open call waits for an answer.
	ActionWaiting Action = "Waiting"
	// ActionFinished means the run has ended.
	ActionFinished Action = "Finished"
)

// Next reports what Step would do now, without doing it.
func (st *State) Next() Action {
	switch {
	case st.Ended():
		return ActionFinished
	case len(st.Calls) == 0:
		return ActionModelTurn
	}
	if st.AllDone() {
		return ActionToolCalls
	}
	for _, c := range st.Calls {
		if c.Phase == PhaseQueued || c.Phase == PhaseAnswered || (c.Phase == PhaseWaiting && c.Wait.Due) {
			return ActionToolCalls
		}
	}
	return ActionWaiting
}

// Waiting lists the calls waiting on external work, in call order.
func (st *State) Waiting() []Call {
	var out []Call
	for _, c := range st.Calls {
		if c.Phase == PhaseWaiting {
			out = append(out, c)
		}
	}
	return out
}

// AllDone reports whether every call of the turn has a result.
func (st *State) AllDone() bool {
	for _, c := range st.Calls {
		if c.Phase != PhaseDone {
			return false
		}
	}
	return true
}

// Suspended lists the calls waiting for an answer, in call order.
func (st *State) Suspended() []Call {
	var out []Call
	for _, c := range st.Calls {
		if c.Phase == PhaseSuspended {
			out = append(out, c)
		}
	}
	return out
}

// OpenAsk is a request a suspended call still waits on an answer to.
type OpenAsk struct {
	Call Call
	Ask  Ask
}

// Open lists the requests the suspended calls still wait on, in call order and, within a call,
// in the order asked.
func (st *State) Open() []OpenAsk {
	var out []OpenAsk
	for _, c := range st.Suspended() {
		for _, a := range c.Asks() {
			if a.Answer == nil {
				out = append(out, OpenAsk{Call: c, Ask: a})
			}
		}
	}
	return out
}

// UnmarshalJSON decodes a State and checks that every call has what its phase needs, so a
// damaged record is an error when it is read rather than a panic when it is stepped.
func (st *State) UnmarshalJSON(data []byte) error {
	type plain State
	var p plain
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	if err := (*State)(&p).validate(); err != nil {
		return err
	}
	*st = State(p)
	return nil
}

func (st *State) validate() error {
	seen := make(map[string]bool, len(st.Calls))
	for i, c := range st.Calls {
		if c.ID == "" || seen[c.ID] {
			return fmt.Errorf("state: call %d has an empty or repeated id %q", i, c.ID)
		}
		seen[c.ID] = true
		switch {
		case c.Phase == PhaseQueued:
		case c.Phase == PhaseSuspended && c.Request != nil && c.Args != "":
		case c.Phase == PhaseAnswered && c.Request != nil && c.Answer != nil && c.Args != "" && c.roundAnswered():
		case c.Phase == PhaseWaiting && c.Wait != nil && c.Args != "":
		case c.Phase == PhaseDone && c.Result != nil:
		default:
			return fmt.Errorf("state: call %q in phase %q lacks what the phase needs (request, arguments, answer or result)", c.ID, c.Phase)
		}
	}
	return nil
}

// Clone copies st's structure, sharing its texts (strings never change), so a step can advance the
// copy while st stays as it was saved: a copy costs the slices and calls, not the transcript again.
func (st *State) Clone() *State {
	c := *st
	c.Messages = append([]Message(nil), st.Messages...)
	for i, m := range c.Messages {
		if m.ToolCalls != nil {
			c.Messages[i].ToolCalls = append([]MessageToolCall(nil), m.ToolCalls...)
		}
	}
	c.ToolCalls = append([]ToolCall(nil), st.ToolCalls...)
	c.Abandoned = append([]wire.Wait(nil), st.Abandoned...)
	if st.Calls != nil {
		c.Calls = make([]Call, len(st.Calls))
		for i, call := range st.Calls {
			c.Calls[i] = call.clone()
		}
	}
	if st.Outcome != nil {
		o := *st.Outcome
		c.Outcome = &o
	}
	return &c
}

// clone copies a call and what it points to; a request's or an answer's data is never changed once
// set, so it is shared.
func (c Call) clone() Call {
	dup := func(p *wire.Answer) *wire.Answer {
		if p == nil {
			return nil
		}
		a := *p
		return &a
	}
	if c.Request != nil {
		r := *c.Request
		c.Request = &r
	}
	if c.Result != nil {
		r := *c.Result
		c.Result = &r
	}
	if c.Announced != nil {
		a := *c.Announced
		c.Announced = &a
	}
	c.Answer, c.Approval = dup(c.Answer), dup(c.Approval)
	c.Passed = append([]string(nil), c.Passed...)
	if c.Gate != nil {
		g := *c.Gate
		c.Gate = &g
	}
	if c.Wait != nil {
		w := *c.Wait
		c.Wait = &w
	}
	if c.Round != nil {
		r := *c.Round
		r.More = append([]Input(nil), r.More...)
		for i := range r.More {
			r.More[i].Answer = dup(r.More[i].Answer)
			if a := r.More[i].Announced; a != nil {
				dupA := *a
				r.More[i].Announced = &dupA
			}
		}
		c.Round = &r
	}
	return c
}

// roundAnswered reports whether every request of the call's round beyond its Request has an
// answer (true without a round).
func (c Call) roundAnswered() bool {
	if c.Round == nil {
		return true
	}
	for _, in := range c.Round.More {
		if in.Answer == nil {
			return false
		}
	}
	return true
}

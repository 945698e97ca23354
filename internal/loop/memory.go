package loop

import "unsafe"

// What a step holds, for a host that runs steps against a memory budget (the controller's
// executor, Job.Bytes).
const (
	// requestCopies is how many times a request's encoded size is held while it is sent: the
	// encoder's buffer, which may reach twice the body as it grows, and the body it returns.
	requestCopies = 3
	// toolsAllowance stands for the tool definitions a request carries; a toolkit's are not known
	// before the step builds it, and an MCP server's list is charged as it is read.
	toolsAllowance = 16 << 10
	// messageJSON is what a message's keys and punctuation add to its encoded texts.
	messageJSON = 64
)

// StepBytes is the memory a step of st holds from its start to its end beyond the state it is
// given, for its host to admit it by (the executor's Job.Bytes): the request it encodes for the
// model, and the copy of the state's structure it works on (the texts themselves are shared with
// the state when the copy is a deep copy of the structure, as it should be: a JSON round trip
// would double them). What the step reads, the model's answer and the tools' outputs, is not
// known before it arrives; the host charges it as it is read (netguard charges every response
// body to the executor job that reads it).
func (c *Client) StepBytes(st *State) int64 {
	request := int64(toolsAllowance + jsonSize(c.opts.SystemPrompt) + jsonSize(c.opts.Model))
	for _, m := range st.Messages {
		request += int64(messageJSON + jsonSize(m.Content) + jsonSize(m.ToolCallID))
		for _, tc := range m.ToolCalls {
			request += int64(messageJSON + jsonSize(tc.ID) + jsonSize(tc.Name) + jsonSize(tc.Arguments))
		}
	}
	structure := int64(len(st.Messages))*int64(unsafe.Sizeof(Message{})) +
		int64(len(st.Calls))*int64(unsafe.Sizeof(Call{})) + int64(len(st.ToolCalls))*int64(unsafe.Sizeof(ToolCall{}))
	return requestCopies*request + structure
}

// jsonSize is the length of s encoded as a JSON string the way encoding/json writes it (the
// model SDKs use it): quotes, two bytes for \" \\ \n \r \t \b \f, six for every other control
// character and for the HTML-escaped < > &. Bytes past ASCII are counted as themselves; the rare
// invalid or line-separator sequence written as \ufffd or \u2028 is undercounted by at most 3.
func jsonSize(s string) int {
	n := len(s) + 2
	for i := 0; i < len(s); i++ {
		n += int(escapeExtra[s[i]])
	}
	return n
}

// escapeExtra is what encoding/json adds to each byte it escapes.
var escapeExtra = func() (t [256]uint8) {
	for b := range 0x20 {
		t[b] = 5 // \u00XX
	}
	for _, b := range []byte{'"', '\\', '\n', '\r', '\t', '\b', '\f'} {
		t[b] = 1
	}
	for _, b := range []byte{'<', '>', '&'} {
		t[b] = 5
	}
	return t
}()

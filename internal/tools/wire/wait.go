package wire

// An external wait is work a tool call handed to someone else that is not a person: an MCP task, a
// task of a remote A2A agent, and later a child run. The call does not hold a connection or a worker
// while the work goes on; the loop parks it with the handle the tool returned and asks the tool
// again (with the handle, ToolContext.Wait) when the handle says to look again.

// Wait kinds.
const (
	// WaitKindMCPTask is an MCP task (the io.modelcontextprotocol/tasks extension).
	WaitKindMCPTask = "mcp-task"
	// WaitKindA2ATask is a task of a remote A2A agent; Server is the tool's name in the spec.
	WaitKindA2ATask = "a2a-task"
)

// WaitKindAgentRun is a child run of another agent (a sub-agent call): Server names the Agent, ID
// the child AgentRun. Its host wakes the call when the child ends (Woken).
const WaitKindAgentRun = "agentrun"

// Wait bounds: what a tool server sets here is stored in the run's record.
const (
	MaxWaitIDBytes      = 512
	MaxWaitServerBytes  = 253
	MaxWaitMessageBytes = 1024
)

// waitKey is the ToolResult.Metadata key that marks a result as an external wait.
const waitKey = "wait"

// Wait is the handle of external work a call waits on, as the tool that started it described it.
type Wait struct {
	// Kind says what the work is (WaitKindMCPTask).
	Kind string `json:"kind"`
	// Server names where the work lives (for an MCP task, the MCP server's name in the spec).
	Server string `json:"server,omitempty"`
	// ID identifies the work there (for an MCP task, its taskId).
	ID string `json:"id"`
	// PollIntervalMs is when the holder asks to be looked at again, as it said it; the loop bounds it.
	PollIntervalMs int64 `json:"pollIntervalMs,omitempty"`
	// Status and Message are the work's last known status, for people reading the record.
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
	// PollError says this look failed (the holder could not be reached, or answered with an error
	// that may pass): the work's state is unknown and the loop backs off. Empty for a good look.
	PollError string `json:"pollError,omitempty"`
	// Woken says the host is told when the work ends (a watch) and wakes the call itself: the loop
	// schedules no looks, and the call waits until it is woken or its deadline passes.
	Woken bool `json:"woken,omitempty"`
}

// Waiting is the result of a call that started external work, or of a look at it that found it
// still going.
func Waiting(w Wait) ToolResult {
	return ToolResult{Output: "waiting on " + w.Kind + " " + w.ID, Metadata: map[string]any{waitKey: w}}
}

// WaitOf returns the handle that makes r a wait, or nil.
func WaitOf(r ToolResult) *Wait {
	switch w := r.Metadata[waitKey].(type) {
	case Wait:
		return &w
	case *Wait:
		return w
	}
	return nil
}

package v1alpha1

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ModelStyle is the wire protocol of the model endpoint.
// +kubebuilder:validation:Enum=openai;anthropic
type ModelStyle string

const (
	// ModelStyleOpenAI speaks the OpenAI chat-completions protocol (OpenAI, Ollama, vLLM, LiteLLM...).
	ModelStyleOpenAI ModelStyle = "openai"
	// ModelStyleAnthropic speaks the Anthropic messages protocol.
	ModelStyleAnthropic ModelStyle = "anthropic"
)

// ModelSpec says which model endpoint a run talks to.
type ModelSpec struct {
	// style is the endpoint's protocol: openai (the default; any OpenAI-compatible endpoint) or
	// anthropic.
	// +optional
	// +kubebuilder:default=openai
	Style ModelStyle `json:"style,omitempty"`

	// name is the model id, sent verbatim.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`

	// baseURL of the endpoint, for example https://api.openai.com/v1 or http://ollama:11434/v1.
	// Defaults to https://api.openai.com/v1 for openai and https://api.anthropic.com for anthropic.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('http://') || self.startsWith('https://')",message="model.baseURL must start with http:// or https://"
	BaseURL string `json:"baseURL,omitempty"`

	// apiKeySecretRef names the Secret key holding the API key. Local endpoints need none. The key
	// never appears in status, events, logs or the transcript.
	// +optional
	APIKeySecretRef *SecretKeyReference `json:"apiKeySecretRef,omitempty"`

	// retries is how many consecutive transient failures (429, 5xx, network) are tolerated before
	// the run fails.
	// +optional
	// +kubebuilder:default=5
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Retries *int32 `json:"retries,omitempty"`

	// requestTimeout bounds one model request (default 120s, at most 10m).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('10m')",message="model.requestTimeout must be at most 10m"
	RequestTimeout *metav1.Duration `json:"requestTimeout,omitempty"`
}

// HTTPMethod is the method of an HTTP tool request.
// +kubebuilder:validation:Enum=GET;POST;PUT;PATCH;DELETE
type HTTPMethod string

// SecretValueSource says where a header value comes from.
type SecretValueSource struct {
	// secretKeyRef selects a key of a Secret in the run's namespace.
	// +required
	SecretKeyRef SecretKeyReference `json:"secretKeyRef"`
}

// HTTPHeader is one header sent with every request of a tool.
// +kubebuilder:validation:XValidation:rule="has(self.value) != has(self.valueFrom)",message="a header needs exactly one of value or valueFrom"
type HTTPHeader struct {
	// name of the header.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&'*+.^_|~-]+$`
	Name string `json:"name"`

	// value is a literal value. Put credentials in a Secret and use valueFrom instead.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Value *string `json:"value,omitempty"`

	// valueFrom reads the value from a Secret when the tool is called. It is never logged or stored.
	// +optional
	ValueFrom *SecretValueSource `json:"valueFrom,omitempty"`
}

// HTTPToolSpec calls an HTTP endpoint; see the README for the suspension wire protocol.
// +kubebuilder:validation:XValidation:rule="!has(self.auth) || !has(self.headers) || !self.headers.exists(h, h.name.lowerAscii() == 'authorization')",message="auth.oauth sends the Authorization header: remove it from headers"
type HTTPToolSpec struct {
	// url of the endpoint. `{name}` segments are filled from the call's arguments of that name,
	// which are then left out of the body.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('http://') || self.startsWith('https://')",message="http.url must start with http:// or https://"
	URL string `json:"url"`

	// method of the request (default POST).
	// +optional
	// +kubebuilder:default=POST
	Method HTTPMethod `json:"method,omitempty"`

	// headers sent with every request.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Headers []HTTPHeader `json:"headers,omitempty"`

	// timeout of one request (default 30s, at most 10m).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('10m')",message="tools[].http.timeout must be at most 10m"
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// auth has the operator sign the tool's requests in.
	// +optional
	Auth *ToolAuth `json:"auth,omitempty"`
}

// ToolAuth is how the operator signs a tool's or an MCP server's requests in.
type ToolAuth struct {
	// oauth has the operator complete an OAuth 2.1 login itself (authorization code with PKCE,
	// discovered from the endpoint's 401), keep the tokens for tokenScope and send them as
	// Authorization: Bearer; see the README, "Logins the operator completes".
	// +required
	OAuth *OAuthSpec `json:"oauth"`
}

// TokenScope says whose login a token is, and so which calls reuse it.
// +kubebuilder:validation:Enum=Requester;Agent;Run
type TokenScope string

// Token scopes.
const (
	// TokenScopeRequester: the run's requester (spec.requestedBy), across their runs in the namespace.
	TokenScopeRequester TokenScope = "Requester"
	// TokenScopeAgent: every run of the Agent (spec.agentRef), whoever requested it.
	TokenScopeAgent TokenScope = "Agent"
	// TokenScopeRun: the run alone.
	TokenScopeRun TokenScope = "Run"
)

// OAuthSpec is an OAuth 2.1 client the operator signs in with.
type OAuthSpec struct {
	// clientID is the client's id registered at the authorization server, with the manager's
	// --oauth-redirect-url as a redirect URI.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[!-~]+$`
	ClientID string `json:"clientID"`

	// clientSecretRef is the secret of a confidential client, read by the manager when it
	// exchanges a code or refreshes a token, and sent to the token endpoint only. A public client
	// (PKCE alone) sets none.
	// +optional
	ClientSecretRef *SecretKeyReference `json:"clientSecretRef,omitempty"`

	// scopes to request. Empty asks for those the endpoint's 401 names, else those its protected
	// resource metadata lists.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=128
	// +kubebuilder:validation:items:Pattern=`^[!#-\[\]-~]+$`
	Scopes []string `json:"scopes,omitempty"`

	// tokenScope says whose login the token is: Requester (the default) keeps one per requester,
	// reused by their later runs in the namespace; Agent one per Agent, shared by all its runs;
	// Run one per run.
	// +optional
	// +kubebuilder:default=Requester
	TokenScope TokenScope `json:"tokenScope,omitempty"`
}

// A2AToolSpec makes a tool a remote agent spoken to over A2A 1.0 (JSON-RPC binding); see the
// README, "A2A".
type A2AToolSpec struct {
	// url of the remote agent's JSON-RPC endpoint: the url of its agent card's supportedInterfaces
	// entry with protocolBinding JSONRPC. The card itself is not fetched, so the headers go to this
	// URL only.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('http://') || self.startsWith('https://')",message="a2a.url must start with http:// or https://"
	URL string `json:"url"`

	// headers sent with every request, such as Authorization for the remote agent's scheme.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Headers []HTTPHeader `json:"headers,omitempty"`

	// timeout of one request to the agent (default 30s, at most 10m). The remote task itself may
	// take as long as the run's suspension timeout (24h when unset).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('10m')",message="tools[].a2a.timeout must be at most 10m"
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// ToolSpec declares one tool the model may call.
// +kubebuilder:validation:XValidation:rule="[has(self.http), has(self.agentRef), has(self.a2a)].filter(x, x).size() == 1",message="a tool needs exactly one implementation: set one of http, agentRef or a2a"
type ToolSpec struct {
	// name the model calls the tool by.
	// +required
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_-]{1,64}$`
	// +kubebuilder:validation:MaxLength=64
	Name string `json:"name"`

	// description tells the model what the tool does.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Description string `json:"description,omitempty"`

	// parameters is the JSON Schema of the tool's arguments (an object schema).
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	Parameters *apiextensionsv1.JSON `json:"parameters,omitempty"`

	// http makes the tool an HTTP call.
	// +optional
	HTTP *HTTPToolSpec `json:"http,omitempty"`

	// agentRef makes the tool another Agent of the namespace (a sub-agent): a call creates a run of
	// that Agent, owned by this one, and its final text is the tool's output. Without parameters
	// the tool takes one argument, prompt, the child's prompt; with parameters the arguments, as
	// JSON, are the child's prompt. See the README, "Sub-agents".
	// +optional
	AgentRef *AgentReference `json:"agentRef,omitempty"`

	// a2a makes the tool a remote A2A agent: a call sends it a message and waits for its task,
	// and what the task asks a person (input-required, auth-required) becomes a PendingRequest of
	// this run, whose answer is sent back as the follow-up message.
	// +optional
	A2A *A2AToolSpec `json:"a2a,omitempty"`
}

// MCPServerSpec connects a remote MCP server over streamable HTTP. Its tools are named
// <server>_<tool>.
// +kubebuilder:validation:XValidation:rule="!has(self.auth) || !has(self.headers) || !self.headers.exists(h, h.name.lowerAscii() == 'authorization')",message="auth.oauth sends the Authorization header: remove it from headers"
type MCPServerSpec struct {
	// name prefixes the server's tool names.
	// +required
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9_-]{1,32}$`
	// +kubebuilder:validation:MaxLength=32
	Name string `json:"name"`

	// url of the server's streamable HTTP endpoint.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('http://') || self.startsWith('https://')",message="mcpServers[].url must start with http:// or https://"
	URL string `json:"url"`

	// tools is an allow-list of the server's tool names (as the server names them). Empty means all.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=128
	// +kubebuilder:validation:items:MaxLength=128
	Tools []string `json:"tools,omitempty"`

	// headers sent with every request to the server.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Headers []HTTPHeader `json:"headers,omitempty"`

	// timeout bounds each phase (connect, list, call); default 30s, at most 10m.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('10m')",message="mcpServers[].timeout must be at most 10m"
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// auth has the operator sign the server's requests in.
	// +optional
	Auth *ToolAuth `json:"auth,omitempty"`
}

// Builtin names a tool that ships with the operator.
// +kubebuilder:validation:Enum=question
type Builtin string

// BuiltinQuestion asks the person one or more questions (toolnexus §4A).
const BuiltinQuestion Builtin = "question"

// ApprovalGate asks for approval before a matching tool runs.
type ApprovalGate struct {
	// tools are globs over final tool names (for MCP tools, <server>_<tool>).
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=128
	Tools []string `json:"tools"`

	// when is a CEL expression over `tool` (string) and `args` (map) that must be true for the gate
	// to apply, for example `args.amount > 1000`. Empty means always.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	When string `json:"when,omitempty"`

	// prompt shown to the approver, a Go template over {{.tool}} and {{.arguments}}.
	// Default: "Approve the call to <tool>?".
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Prompt string `json:"prompt,omitempty"`
}

// OnTimeout says what an expired PendingRequest does to its run.
// +kubebuilder:validation:Enum=Decline;Fail
type OnTimeout string

const (
	// OnTimeoutDecline answers the request {ok: false, reason: expired}; the model is told and
	// the run continues.
	OnTimeoutDecline OnTimeout = "Decline"
	// OnTimeoutFail answers the request as expired and fails the run with reason RequestExpired.
	OnTimeoutFail OnTimeout = "Fail"
)

// SuspensionPolicy governs the run's PendingRequests.
type SuspensionPolicy struct {
	// timeout after which an unanswered PendingRequest expires (at most 720h). Unset: it waits forever.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('720h')",message="suspension.timeout must be at most 720h (30 days)"
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// onTimeout is Decline (the default) or Fail.
	// +optional
	// +kubebuilder:default=Decline
	OnTimeout OnTimeout `json:"onTimeout,omitempty"`

	// approvers who may answer this run's requests; copied into each PendingRequest.
	// +optional
	Approvers *Approvers `json:"approvers,omitempty"`

	// notify lists the sinks told when a request of the run opens, is answered or expires;
	// copied into each PendingRequest. Names are unique.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:rule="self.all(n, self.exists_one(m, m.name == n.name))",message="suspension.notify names must be unique"
	Notify []NotifySink `json:"notify,omitempty"`
}

// AgentSpec is the reusable part of a run: the model, its instructions, its tools and the
// policies of its requests. An Agent holds one; an AgentRun either names an Agent (agentRef) or
// carries these fields itself.
// +kubebuilder:validation:XValidation:rule="!has(self.tools) || !has(self.mcpServers) || self.tools.all(t, !self.mcpServers.exists(s, t.name.startsWith(s.name + '_')))",message="a tool name must not start with '<mcpServer name>_': that prefix is reserved for the server's tools"
type AgentSpec struct {
	// model is the endpoint the agent talks to. Required on an Agent, and on an AgentRun without
	// agentRef.
	// +optional
	Model ModelSpec `json:"model,omitzero"`

	// systemPrompt is sent as the system message.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	SystemPrompt string `json:"systemPrompt,omitempty"`

	// maxTurns bounds the number of model turns (default 10). A run that reaches it without a final
	// answer ends Incomplete with limit maxTurns. A run of an agent may set its own.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxTurns int32 `json:"maxTurns,omitempty"`

	// tools the model may call, in the order it is shown them. Names are unique.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(t, self.exists_one(u, u.name == t.name))",message="tool names must be unique within spec.tools"
	Tools []ToolSpec `json:"tools,omitempty"`

	// mcpServers whose tools the model may call. Names are unique.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(t, self.exists_one(u, u.name == t.name))",message="mcpServers names must be unique"
	MCPServers []MCPServerSpec `json:"mcpServers,omitempty"`

	// builtins are tools that ship with the operator: question.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=8
	Builtins []Builtin `json:"builtins,omitempty"`

	// approvals raise an approval request before a matching tool runs.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Approvals []ApprovalGate `json:"approvals,omitempty"`

	// suspension governs the run's PendingRequests: timeout, what expiry does, who may answer.
	// +optional
	Suspension *SuspensionPolicy `json:"suspension,omitempty"`
}

// AgentReference names an Agent in the run's namespace.
type AgentReference struct {
	// name of the Agent.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// AgentRunSpec is one agent run: a prompt, and either the agent's fields inline or a reference to
// an Agent. It is immutable after creation, except cancel: changing, adding or removing any other
// field is refused with a message naming the field.
// +kubebuilder:validation:XValidation:rule="has(self.agentRef) != has(self.model)",message="set exactly one of spec.agentRef (run an Agent) or spec.model (an inline agent)"
// +kubebuilder:validation:XValidation:rule="!has(self.agentRef) || !(has(self.systemPrompt) || has(self.tools) || has(self.mcpServers) || has(self.builtins) || has(self.approvals) || has(self.suspension))",message="a run of an Agent (spec.agentRef) may set only prompt, maxTurns, ttlSecondsAfterFinished and cancel; systemPrompt, tools, mcpServers, builtins, approvals and suspension come from the Agent"
// +kubebuilder:validation:XValidation:rule="has(self.agentRef) == has(oldSelf.agentRef) && (!has(self.agentRef) || self.agentRef == oldSelf.agentRef)",message="spec.agentRef is immutable after creation; create a new AgentRun instead",fieldPath=".agentRef"
// +kubebuilder:validation:XValidation:rule="has(self.model) == has(oldSelf.model)",message="spec.model cannot be added or removed after creation; create a new AgentRun instead"
// +kubebuilder:validation:XValidation:rule="!has(self.model) || !has(oldSelf.model) || self.model == oldSelf.model",message="spec.model is immutable after creation; create a new AgentRun instead",fieldPath=".model"
// +kubebuilder:validation:XValidation:rule="has(self.systemPrompt) == has(oldSelf.systemPrompt)",message="spec.systemPrompt cannot be added or removed after creation; create a new AgentRun instead"
// +kubebuilder:validation:XValidation:rule="!has(self.systemPrompt) || !has(oldSelf.systemPrompt) || self.systemPrompt == oldSelf.systemPrompt",message="spec.systemPrompt is immutable after creation; create a new AgentRun instead",fieldPath=".systemPrompt"
// +kubebuilder:validation:XValidation:rule="has(self.maxTurns) == has(oldSelf.maxTurns)",message="spec.maxTurns cannot be added or removed after creation; create a new AgentRun instead"
// +kubebuilder:validation:XValidation:rule="!has(self.maxTurns) || !has(oldSelf.maxTurns) || self.maxTurns == oldSelf.maxTurns",message="spec.maxTurns is immutable after creation; create a new AgentRun instead",fieldPath=".maxTurns"
// +kubebuilder:validation:XValidation:rule="has(self.tools) == has(oldSelf.tools)",message="spec.tools cannot be added or removed after creation; create a new AgentRun instead"
// +kubebuilder:validation:XValidation:rule="!has(self.tools) || !has(oldSelf.tools) || self.tools == oldSelf.tools",message="spec.tools is immutable after creation; create a new AgentRun instead",fieldPath=".tools"
// +kubebuilder:validation:XValidation:rule="has(self.mcpServers) == has(oldSelf.mcpServers)",message="spec.mcpServers cannot be added or removed after creation; create a new AgentRun instead"
// +kubebuilder:validation:XValidation:rule="!has(self.mcpServers) || !has(oldSelf.mcpServers) || self.mcpServers == oldSelf.mcpServers",message="spec.mcpServers is immutable after creation; create a new AgentRun instead",fieldPath=".mcpServers"
// +kubebuilder:validation:XValidation:rule="has(self.builtins) == has(oldSelf.builtins)",message="spec.builtins cannot be added or removed after creation; create a new AgentRun instead"
// +kubebuilder:validation:XValidation:rule="!has(self.builtins) || !has(oldSelf.builtins) || self.builtins == oldSelf.builtins",message="spec.builtins is immutable after creation; create a new AgentRun instead",fieldPath=".builtins"
// +kubebuilder:validation:XValidation:rule="has(self.approvals) == has(oldSelf.approvals)",message="spec.approvals cannot be added or removed after creation; create a new AgentRun instead"
// +kubebuilder:validation:XValidation:rule="!has(self.approvals) || !has(oldSelf.approvals) || self.approvals == oldSelf.approvals",message="spec.approvals is immutable after creation; create a new AgentRun instead",fieldPath=".approvals"
// +kubebuilder:validation:XValidation:rule="has(self.suspension) == has(oldSelf.suspension)",message="spec.suspension cannot be added or removed after creation; create a new AgentRun instead"
// +kubebuilder:validation:XValidation:rule="!has(self.suspension) || !has(oldSelf.suspension) || self.suspension == oldSelf.suspension",message="spec.suspension is immutable after creation; create a new AgentRun instead",fieldPath=".suspension"
// +kubebuilder:validation:XValidation:rule="has(self.ttlSecondsAfterFinished) == has(oldSelf.ttlSecondsAfterFinished)",message="spec.ttlSecondsAfterFinished cannot be added or removed after creation; create a new AgentRun instead"
// +kubebuilder:validation:XValidation:rule="has(self.requestedBy) == has(oldSelf.requestedBy)",message="spec.requestedBy cannot be added or removed after creation: it records who created the run"
// +kubebuilder:validation:XValidation:rule="has(self.delegatedBy) == has(oldSelf.delegatedBy)",message="spec.delegatedBy cannot be added or removed after creation: the operator sets it when a sub-agent call creates the run"
type AgentRunSpec struct {
	// agentRef names the Agent this run runs. At its first step the run snapshots the Agent's
	// spec; editing or deleting the Agent afterwards does not change the run. Exactly one of
	// agentRef or model.
	// +optional
	AgentRef *AgentReference `json:"agentRef,omitempty"`

	// The agent's fields, inline; with agentRef only maxTurns may be set among them.
	AgentSpec `json:",inline"`

	// prompt is the first user turn.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=65536
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.prompt is immutable after creation; create a new AgentRun instead"
	Prompt string `json:"prompt"`

	// ttlSecondsAfterFinished deletes the run (and its requests) this long after it finished (at
	// most 365 days). Unset: the run is kept.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=31536000
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.ttlSecondsAfterFinished is immutable after creation; create a new AgentRun instead"
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`

	// cancel stops the run: it ends with reason Cancelled and its open requests are cancelled.
	// +optional
	Cancel bool `json:"cancel,omitempty"`

	// requestedBy is the user who created the run, stamped by the API server on creation (the
	// toolnexus-requester-stamp MutatingAdmissionPolicy) and copied into each of its
	// PendingRequests. Leave it out: a value other than the creator's own user name is refused.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.requestedBy is immutable: it records who created the run"
	RequestedBy string `json:"requestedBy,omitempty"`

	// delegatedBy names the runs that delegated this one, when a sub-agent call (tools[].agentRef)
	// created it. The operator sets it; a create by anyone else that sets it is refused (the
	// toolnexus-requester-rules admission policy).
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.delegatedBy is immutable: it records which run created this one"
	DelegatedBy *Delegation `json:"delegatedBy,omitempty"`
}

// RunPhase is a display summary of the run's conditions.
// +kubebuilder:validation:Enum=Pending;Running;Suspended;Succeeded;Incomplete;Failed
type RunPhase string

// Run phases.
const (
	RunPhasePending    RunPhase = "Pending"
	RunPhaseRunning    RunPhase = "Running"
	RunPhaseSuspended  RunPhase = "Suspended"
	RunPhaseSucceeded  RunPhase = "Succeeded"
	RunPhaseIncomplete RunPhase = "Incomplete"
	RunPhaseFailed     RunPhase = "Failed"
)

// Usage counts model tokens. The counts are what the endpoint reported, unchecked, so they carry
// no minimum: a status the API server refuses would hide the run's progress.
type Usage struct {
	// promptTokens is the sum of the prompt tokens the endpoint reported.
	// +optional
	PromptTokens int64 `json:"promptTokens,omitempty"`
	// completionTokens is the sum of the completion tokens the endpoint reported.
	// +optional
	CompletionTokens int64 `json:"completionTokens,omitempty"`
	// totalTokens is the sum of the total tokens the endpoint reported.
	// +optional
	TotalTokens int64 `json:"totalTokens,omitempty"`
}

// PendingSummary is one open PendingRequest of the run. Its bounds are those of the
// PendingRequest it summarises, except the prompt, which is cut shorter.
type PendingSummary struct {
	// name of the PendingRequest.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// kind of the request (approval, authorization, input, question, ...).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Kind string `json:"kind,omitempty"`
	// prompt of the request, truncated to 1024 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Prompt string `json:"prompt,omitempty"`
	// url of an authorization request.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	URL string `json:"url,omitempty"`
	// toolCallID is the model's id of the suspended call.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	ToolCallID string `json:"toolCallID,omitempty"`
	// run is the sub-run whose request this is, when it is not this run's own: a root run lists
	// the open requests of every run its sub-agent calls created, at any depth.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Run string `json:"run,omitempty"`
}

// ToolCallSummary is one finished tool call, with its arguments and output truncated. The full
// record is in the transcript.
type ToolCallSummary struct {
	// id the model gave the call.
	// +required
	// +kubebuilder:validation:MaxLength=256
	ID string `json:"id"`
	// name of the tool the model called.
	// +required
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`
	// arguments as the model sent them (a JSON object, as a string), truncated to 512 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Arguments string `json:"arguments,omitempty"`
	// output of the tool, truncated to 1024 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Output string `json:"output,omitempty"`
	// isError is true when the output reports a failure.
	// +optional
	IsError bool `json:"isError,omitempty"`
	// turn (1-based) in which the model made the call.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Turn int32 `json:"turn,omitempty"`
}

// TranscriptReference names the object holding the run's full transcript and state.
type TranscriptReference struct {
	// name of the AgentRunRecord holding the head of the record.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// AgentRunStatus mirrors the toolnexus RunResult. Conditions are the truth; phase summarises them.
type AgentRunStatus struct {
	// conditions are the truth of the run: Succeeded (the terminal summary), Suspended, ToolsReady,
	// and Reconciling or Stalled for kstatus.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// phase is a display summary: Pending, Running, Suspended, Succeeded, Incomplete or Failed.
	// +optional
	Phase RunPhase `json:"phase,omitempty"`

	// result in the toolnexus vocabulary: done, pending or incomplete.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Result string `json:"result,omitempty"`

	// limit that ended an incomplete run: maxTurns or timeout.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Limit string `json:"limit,omitempty"`

	// text is the final assistant text, or while suspended the prompt of the first open request,
	// truncated to 8192 bytes; the transcript holds it whole.
	// +optional
	// +kubebuilder:validation:MaxLength=8192
	Text string `json:"text,omitempty"`

	// turns is the number of model turns taken.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Turns int32 `json:"turns,omitempty"`

	// toolCallCount is the number of tool calls made.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ToolCallCount int32 `json:"toolCallCount,omitempty"`

	// model is the model id last sent (spec.model.name).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Model string `json:"model,omitempty"`

	// usage sums the tokens of every model turn.
	// +optional
	Usage Usage `json:"usage,omitzero"`

	// pendingCount is the number of open PendingRequests (the PENDING column).
	// +optional
	// +kubebuilder:validation:Minimum=0
	PendingCount int32 `json:"pendingCount,omitempty"`

	// pending lists the run's open PendingRequests.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Pending []PendingSummary `json:"pending,omitempty"`

	// toolCalls summarises the most recent tool calls, newest last.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	ToolCalls []ToolCallSummary `json:"toolCalls,omitempty"`

	// transcriptRef names the object, owned by the run, that holds the full transcript.
	// +optional
	TranscriptRef *TranscriptReference `json:"transcriptRef,omitempty"`

	// modelFailures counts consecutive transient model failures (reset by a success).
	// +optional
	// +kubebuilder:validation:Minimum=0
	ModelFailures int32 `json:"modelFailures,omitempty"`

	// startTime is when the run took its first step.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// completionTime is when the run finished.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// observedGeneration is the generation this status describes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// agent names the Agent, and the generation of it, whose spec the run snapshotted at its first
	// step and runs with.
	// +optional
	Agent *AgentSnapshotReference `json:"agent,omitempty"`
}

// AgentSnapshotReference names the Agent a run snapshotted, and which generation of it.
type AgentSnapshotReference struct {
	// name of the Agent.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// generation of the Agent the run snapshotted.
	// +required
	// +kubebuilder:validation:Minimum=0
	Generation int64 `json:"generation"`
}

// AgentRun runs one LLM tool-calling agent, step by step, parking on a PendingRequest whenever a
// tool needs a person.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ar,categories=toolnexus
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Turns",type=integer,JSONPath=`.status.turns`
// +kubebuilder:printcolumn:name="Pending",type=integer,JSONPath=`.status.pendingCount`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AgentRun struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitzero"`

	// spec is the run: model, prompt, tools and policies. Only spec.cancel may change after
	// creation.
	// +required
	Spec AgentRunSpec `json:"spec"`

	// status is what the manager observed of the run; only the manager writes it.
	// +optional
	Status AgentRunStatus `json:"status,omitzero"`
}

// AgentRunList is a list of AgentRuns.
// +kubebuilder:object:root=true
type AgentRunList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitzero"`
	Items           []AgentRun `json:"items"`
}

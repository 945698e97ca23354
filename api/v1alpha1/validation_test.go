package v1alpha1_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

// A valid AgentRun with every field the README documents set.
const fullRun = `
apiVersion: toolnexus.dev/v1alpha1
kind: AgentRun
metadata: {name: buy-gpu}
spec:
  model:
    style: openai
    name: gpt-4o-mini
    baseURL: https://api.openai.com/v1
    apiKeySecretRef: {name: llm, key: apiKey}
    retries: 5
    requestTimeout: 120s
  systemPrompt: You are a purchasing assistant.
  prompt: buy a gpu
  maxTurns: 10
  tools:
  - name: approve_purchase
    description: Requests spend approval
    parameters: {type: object, properties: {item: {type: string}}, required: [item]}
    http:
      url: http://purchasing.team-a.svc/approve
      method: POST
      headers:
      - {name: Authorization, valueFrom: {secretKeyRef: {name: purchasing, key: token}}}
      timeout: 30s
  mcpServers:
  - name: github
    url: http://github-mcp.tools.svc/mcp
    tools: [create_issue, list_issues]
  builtins: [question]
  approvals:
  - tools: ["delete_*", approve_purchase]
    when: "args.amount > 1000"
    prompt: "Approve {{.tool}} with {{.arguments}}?"
  suspension:
    timeout: 24h
    onTimeout: Decline
    approvers: {users: [alice], groups: [purchasing-approvers]}
  ttlSecondsAfterFinished: 86400
  cancel: false
`

const minimalRun = `
apiVersion: toolnexus.dev/v1alpha1
kind: AgentRun
metadata: {name: minimal}
spec:
  model: {name: llama3}
  prompt: hello
`

const request = `
apiVersion: toolnexus.dev/v1alpha1
kind: PendingRequest
metadata: {name: buy-gpu-1-call-1}
spec:
  runRef: {name: buy-gpu}
  toolCall: {id: call_1, name: approve_purchase, arguments: '{"item":"gpu"}'}
  request:
    id: pnd-lx2k1-1
    kind: approval
    prompt: Approve purchase of gpu?
    data: {}
`

// newNamespace creates a namespace for one test and returns its name.
func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "validation-"}}
	Expect(k8sClient.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// object parses a manifest, applies edit (a dotted path → value map; a nil value removes the
// field) and places it in ns.
func object(manifest, ns string, edits map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	Expect(yaml.Unmarshal([]byte(manifest), &u.Object)).To(Succeed())
	u.SetNamespace(ns)
	for path, value := range edits {
		fields := strings.Split(path, ".")
		if value == nil {
			unstructured.RemoveNestedField(u.Object, fields...)
			continue
		}
		Expect(unstructured.SetNestedField(u.Object, value, fields...)).To(Succeed())
	}
	return u
}

func mergePatch(obj client.Object, patch string, opts ...client.SubResourcePatchOption) error {
	p := client.RawPatch(types.MergePatchType, []byte(patch))
	if len(opts) > 0 || strings.Contains(patch, `"status"`) {
		return k8sClient.Status().Patch(ctx, obj, p)
	}
	return k8sClient.Patch(ctx, obj, p)
}

var _ = Describe("AgentRun admission", func() {
	DescribeTable("refuses an invalid manifest with an actionable message",
		func(edits map[string]any, wantMessage string) {
			err := k8sClient.Create(ctx, object(fullRun, newNamespace(), edits))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(wantMessage))
		},
		Entry("missing prompt", map[string]any{"spec.prompt": nil}, "spec.prompt: Required value"),
		Entry("empty prompt", map[string]any{"spec.prompt": ""}, "spec.prompt: Invalid value"),
		Entry("missing model name", map[string]any{"spec.model.name": nil}, "spec.model.name: Required value"),
		Entry("unknown model style", map[string]any{"spec.model.style": "gemini"},
			`spec.model.style: Unsupported value: "gemini": supported values: "openai", "anthropic"`),
		Entry("over-long model name", map[string]any{"spec.model.name": strings.Repeat("m", 257)},
			"spec.model.name: Too long: may not be more than 256"),
		Entry("baseURL that is not http", map[string]any{"spec.model.baseURL": "ftp://models"},
			"model.baseURL must start with http:// or https://"),
		Entry("maxTurns 0", map[string]any{"spec.maxTurns": int64(0)},
			"spec.maxTurns: Invalid value: 0: spec.maxTurns in body should be greater than or equal to 1"),
		Entry("maxTurns 1001", map[string]any{"spec.maxTurns": int64(1001)},
			"spec.maxTurns in body should be less than or equal to 1000"),
		Entry("duplicate tool names", map[string]any{"spec.tools": []any{
			map[string]any{"name": "lookup", "http": map[string]any{"url": "http://a"}},
			map[string]any{"name": "lookup", "http": map[string]any{"url": "http://b"}},
		}}, "tool names must be unique within spec.tools"),
		Entry("tool name with a space", map[string]any{"spec.tools": []any{
			map[string]any{"name": "look up", "http": map[string]any{"url": "http://a"}},
		}}, `spec.tools[0].name in body should match '^[a-zA-Z0-9_-]{1,64}$'`),
		Entry("tool with no implementation", map[string]any{"spec.tools": []any{
			map[string]any{"name": "lookup"},
		}}, "a tool needs exactly one implementation: set one of http, agentRef or a2a"),
		Entry("tool that is both an HTTP call and an agent", map[string]any{"spec.tools": []any{
			map[string]any{"name": "lookup", "http": map[string]any{"url": "http://a"}, "agentRef": map[string]any{"name": "research"}},
		}}, "a tool needs exactly one implementation: set one of http, agentRef or a2a"),
		Entry("agent tool without an agent name", map[string]any{"spec.tools": []any{
			map[string]any{"name": "research", "agentRef": map[string]any{"name": ""}},
		}}, "spec.tools[0].agentRef.name in body should be at least 1 chars long"),
		Entry("a delegation deeper than the bound", map[string]any{"spec.delegatedBy": map[string]any{
			"path": pathOf(toolnexusv1alpha1.MaxDelegationDepth + 1), "parentUID": "u-e", "rootUID": "u-a", "callID": "call_1",
		}}, fmt.Sprintf("spec.delegatedBy.path: Too many: %d: must have at most %d items",
			toolnexusv1alpha1.MaxDelegationDepth+1, toolnexusv1alpha1.MaxDelegationDepth)),
		Entry("a delegation without its parent", map[string]any{"spec.delegatedBy": map[string]any{
			"path": []any{"a"}, "rootUID": "u-a", "callID": "call_1",
		}}, "spec.delegatedBy.parentUID: Required value"),
		Entry("header with both value and valueFrom", map[string]any{"spec.tools": []any{
			map[string]any{"name": "lookup", "http": map[string]any{"url": "http://a", "headers": []any{
				map[string]any{"name": "X-Token", "value": "v", "valueFrom": map[string]any{
					"secretKeyRef": map[string]any{"name": "s", "key": "k"}}},
			}}},
		}}, "a header needs exactly one of value or valueFrom"),
		Entry("auth.oauth with an Authorization header of its own", map[string]any{"spec.tools": []any{
			map[string]any{"name": "lookup", "http": map[string]any{"url": "http://a",
				"headers": []any{map[string]any{"name": "authorization", "value": "Bearer x"}},
				"auth":    map[string]any{"oauth": map[string]any{"clientID": "toolnexus"}}}},
		}}, "auth.oauth sends the Authorization header: remove it from headers"),
		Entry("auth.oauth without a client", map[string]any{"spec.mcpServers": []any{
			map[string]any{"name": "gh", "url": "http://a", "auth": map[string]any{"oauth": map[string]any{}}},
		}}, "spec.mcpServers[0].auth.oauth.clientID: Required value"),
		Entry("auth.oauth with a scope holding a space", map[string]any{"spec.tools": []any{
			map[string]any{"name": "lookup", "http": map[string]any{"url": "http://a",
				"auth": map[string]any{"oauth": map[string]any{"clientID": "c", "scopes": []any{"read write"}}}}},
		}}, "spec.tools[0].http.auth.oauth.scopes[0] in body should match"),
		Entry("auth.oauth with an unknown token scope", map[string]any{"spec.tools": []any{
			map[string]any{"name": "lookup", "http": map[string]any{"url": "http://a",
				"auth": map[string]any{"oauth": map[string]any{"clientID": "c", "tokenScope": "Namespace"}}}},
		}}, `Unsupported value: "Namespace": supported values: "Requester", "Agent", "Run"`),
		Entry("unknown HTTP method", map[string]any{"spec.tools": []any{
			map[string]any{"name": "lookup", "http": map[string]any{"url": "http://a", "method": "TRACE"}},
		}}, `Unsupported value: "TRACE"`),
		Entry("duration that does not parse", map[string]any{"spec.suspension.timeout": "tomorrow"},
			"spec.suspension.timeout in body should match"),
		Entry("unknown onTimeout", map[string]any{"spec.suspension.onTimeout": "Retry"},
			`spec.suspension.onTimeout: Unsupported value: "Retry"`),
		Entry("unknown builtin", map[string]any{"spec.builtins": []any{"shell"}},
			`spec.builtins[0]: Unsupported value: "shell"`),
		Entry("approval gate without tools", map[string]any{"spec.approvals": []any{map[string]any{"when": "true"}}},
			"spec.approvals[0].tools: Required value"),
		Entry("over-long when expression", map[string]any{"spec.approvals": []any{
			map[string]any{"tools": []any{"x"}, "when": strings.Repeat("a", 1025)}}},
			"spec.approvals[0].when: Too long"),
		Entry("duplicate MCP server names", map[string]any{"spec.mcpServers": []any{
			map[string]any{"name": "gh", "url": "http://a"}, map[string]any{"name": "gh", "url": "http://b"},
		}}, "mcpServers names must be unique"),
		Entry("tool name shadowing an MCP server prefix", map[string]any{"spec.tools": []any{
			map[string]any{"name": "github_create_issue", "http": map[string]any{"url": "http://a"}},
		}}, "a tool name must not start with '<mcpServer name>_'"),
		Entry("negative ttl", map[string]any{"spec.ttlSecondsAfterFinished": int64(-1)},
			"spec.ttlSecondsAfterFinished in body should be greater than or equal to 0"),
		Entry("notify sink with both url and urlFrom", map[string]any{"spec.suspension.notify": []any{
			map[string]any{"name": "chat", "url": "http://a", "urlFrom": map[string]any{
				"secretKeyRef": map[string]any{"name": "slack", "key": "url"}}},
		}}, "a notify sink needs exactly one of url or urlFrom"),
		Entry("notify sink with neither url nor urlFrom", map[string]any{"spec.suspension.notify": []any{
			map[string]any{"name": "chat"},
		}}, "a notify sink needs exactly one of url or urlFrom"),
		Entry("duplicate notify sink names", map[string]any{"spec.suspension.notify": []any{
			map[string]any{"name": "chat", "url": "http://a"}, map[string]any{"name": "chat", "url": "http://b"},
		}}, "suspension.notify names must be unique"),
		Entry("notify sink url that is not http", map[string]any{"spec.suspension.notify": []any{
			map[string]any{"name": "chat", "url": "mailto:ops@example.com"},
		}}, "notify[].url must start with http:// or https://"),
		Entry("unknown notify format", map[string]any{"spec.suspension.notify": []any{
			map[string]any{"name": "chat", "url": "http://a", "format": "teams"},
		}}, `spec.suspension.notify[0].format: Unsupported value: "teams"`),
		Entry("unknown notify event", map[string]any{"spec.suspension.notify": []any{
			map[string]any{"name": "chat", "url": "http://a", "on": []any{"Resolved"}},
		}}, `spec.suspension.notify[0].on[0]: Unsupported value: "Resolved"`),
		Entry("nine notify sinks", map[string]any{"spec.suspension.notify": nineSinks()},
			"spec.suspension.notify: Too many: 9: must have at most 8 items"),
	)

	It("fills in a notify sink's format and events", func() {
		run := object(fullRun, newNamespace(), map[string]any{"spec.suspension.notify": []any{
			map[string]any{"name": "ops", "url": "http://receiver/events"},
		}})
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		sinks, _, _ := unstructured.NestedSlice(run.Object, "spec", "suspension", "notify")
		Expect(sinks).To(Equal([]any{map[string]any{"name": "ops", "url": "http://receiver/events",
			"format": "cloudevents", "on": []any{"Opened", "Answered", "Expired"}}}))
	})

	It("accepts the full example and a minimal run, with defaults filled in (maxTurns is left to the controller)", func() {
		ns := newNamespace()
		Expect(k8sClient.Create(ctx, object(fullRun, ns, nil))).To(Succeed())
		minimal := object(minimalRun, ns, nil)
		Expect(k8sClient.Create(ctx, minimal)).To(Succeed())
		style, _, _ := unstructured.NestedString(minimal.Object, "spec", "model", "style")
		turns, _, _ := unstructured.NestedInt64(minimal.Object, "spec", "maxTurns")
		retries, _, _ := unstructured.NestedInt64(minimal.Object, "spec", "model", "retries")
		Expect([]any{style, turns, retries}).To(Equal([]any{"openai", int64(0), int64(5)}))
	})

	DescribeTable("after creation",
		func(patch string, wantMessage string) {
			run := object(fullRun, newNamespace(), nil)
			Expect(k8sClient.Create(ctx, run)).To(Succeed())
			err := mergePatch(run, patch)
			if wantMessage == "" {
				Expect(err).NotTo(HaveOccurred())
				return
			}
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(wantMessage))
		},
		Entry("refuses a prompt change", `{"spec":{"prompt":"buy two gpus"}}`,
			"spec.prompt is immutable after creation; create a new AgentRun instead"),
		Entry("refuses a new tool", `{"spec":{"tools":null}}`,
			"spec.tools cannot be added or removed after creation; create a new AgentRun instead"),
		Entry("refuses removing the system prompt", `{"spec":{"systemPrompt":null}}`,
			"spec.systemPrompt cannot be added or removed after creation"),
		Entry("refuses a model change", `{"spec":{"model":{"name":"gpt-5"}}}`,
			"spec.model is immutable after creation"),
		Entry("refuses a system prompt change, naming it", `{"spec":{"systemPrompt":"You are a pirate."}}`,
			`spec.systemPrompt: Invalid value: spec.systemPrompt is immutable after creation`),
		Entry("refuses a maxTurns change, naming it", `{"spec":{"maxTurns":11}}`,
			"spec.maxTurns is immutable after creation"),
		Entry("refuses a changed tool, naming spec.tools", `{"spec":{"tools":[{"name":"lookup","http":{"url":"http://a"}}]}}`,
			"spec.tools is immutable after creation"),
		Entry("refuses a changed MCP server, naming spec.mcpServers", `{"spec":{"mcpServers":[{"name":"github","url":"http://other/mcp"}]}}`,
			"spec.mcpServers is immutable after creation"),
		Entry("refuses removing builtins, naming spec.builtins", `{"spec":{"builtins":null}}`,
			"spec.builtins cannot be added or removed after creation"),
		Entry("refuses a changed approval gate, naming spec.approvals", `{"spec":{"approvals":[{"tools":["*"]}]}}`,
			"spec.approvals is immutable after creation"),
		Entry("refuses a suspension change, naming it", `{"spec":{"suspension":{"onTimeout":"Fail"}}}`,
			"spec.suspension is immutable after creation"),
		Entry("refuses removing the suspension policy", `{"spec":{"suspension":null}}`,
			"spec.suspension cannot be added or removed after creation"),
		Entry("refuses a ttl change, naming it", `{"spec":{"ttlSecondsAfterFinished":60}}`,
			"spec.ttlSecondsAfterFinished is immutable after creation"),
		Entry("refuses removing the ttl", `{"spec":{"ttlSecondsAfterFinished":null}}`,
			"spec.ttlSecondsAfterFinished cannot be added or removed after creation"),
		Entry("accepts cancel with the rest of the spec restated unchanged",
			`{"spec":{"cancel":true,"prompt":"buy a gpu","maxTurns":10}}`, ""),
		Entry("refuses a delegation added afterwards",
			`{"spec":{"delegatedBy":{"path":["root"],"parentUID":"u-root","rootUID":"u-root","callID":"call_1"}}}`,
			"spec.delegatedBy cannot be added or removed after creation: the operator sets it when a sub-agent call creates the run"),
		Entry("accepts cancel", `{"spec":{"cancel":true}}`, ""),
		Entry("accepts label changes", `{"metadata":{"labels":{"team":"a"}}}`, ""),
	)

	DescribeTable("after creation, adding an optional field that was left out",
		func(patch string, wantMessage string) {
			run := object(minimalRun, newNamespace(), nil)
			Expect(k8sClient.Create(ctx, run)).To(Succeed())
			err := mergePatch(run, patch)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(wantMessage))
		},
		Entry("refuses a system prompt", `{"spec":{"systemPrompt":"You are a pirate."}}`,
			"spec.systemPrompt cannot be added or removed after creation; create a new AgentRun instead"),
		Entry("refuses tools", `{"spec":{"tools":[{"name":"lookup","http":{"url":"http://a"}}]}}`,
			"spec.tools cannot be added or removed after creation"),
		Entry("refuses MCP servers", `{"spec":{"mcpServers":[{"name":"gh","url":"http://gh"}]}}`,
			"spec.mcpServers cannot be added or removed after creation"),
		Entry("refuses builtins", `{"spec":{"builtins":["question"]}}`,
			"spec.builtins cannot be added or removed after creation"),
		Entry("refuses approval gates", `{"spec":{"approvals":[{"tools":["*"]}]}}`,
			"spec.approvals cannot be added or removed after creation"),
		Entry("refuses a suspension policy", `{"spec":{"suspension":{"timeout":"1h"}}}`,
			"spec.suspension cannot be added or removed after creation"),
		Entry("refuses a ttl", `{"spec":{"ttlSecondsAfterFinished":60}}`,
			"spec.ttlSecondsAfterFinished cannot be added or removed after creation"),
		Entry("refuses a maxTurns", `{"spec":{"maxTurns":3}}`,
			"spec.maxTurns cannot be added or removed after creation"),
		Entry("refuses an api key reference, naming spec.model", `{"spec":{"model":{"apiKeySecretRef":{"name":"llm","key":"apiKey"}}}}`,
			"spec.model is immutable after creation"),
	)
})

// A valid Agent, and a run of it.
const (
	fullAgent = `
apiVersion: toolnexus.dev/v1alpha1
kind: Agent
metadata: {name: purchasing}
spec:
  model: {name: gpt-4o-mini, apiKeySecretRef: {name: llm, key: apiKey}}
  systemPrompt: You are a purchasing assistant.
  maxTurns: 10
  tools:
  - name: approve_purchase
    http: {url: http://purchasing.team-a.svc/approve}
  mcpServers:
  - {name: github, url: http://github-mcp.tools.svc/mcp}
  builtins: [question]
  approvals:
  - tools: [approve_purchase]
  suspension: {timeout: 24h, approvers: {users: [alice]}}
`
	agentRun = `
apiVersion: toolnexus.dev/v1alpha1
kind: AgentRun
metadata: {name: buy-gpu}
spec:
  agentRef: {name: purchasing}
  prompt: buy a gpu
`
)

const (
	exactlyOneMessage = "set exactly one of spec.agentRef (run an Agent) or spec.model (an inline agent)"
	agentRunMessage   = "a run of an Agent (spec.agentRef) may set only prompt, maxTurns, ttlSecondsAfterFinished and cancel"
)

var _ = Describe("Agent admission", func() {
	DescribeTable("refuses a run that is not exactly one of an inline agent or a run of an Agent",
		func(manifest string, edits map[string]any, wantMessage string) {
			err := k8sClient.Create(ctx, object(manifest, newNamespace(), edits))
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(wantMessage))
		},
		Entry("both agentRef and model", agentRun, map[string]any{"spec.model": map[string]any{"name": "llama3"}}, exactlyOneMessage),
		Entry("neither agentRef nor model", agentRun, map[string]any{"spec.agentRef": nil}, exactlyOneMessage),
		Entry("a run of an Agent that sets tools", agentRun, map[string]any{"spec.tools": []any{
			map[string]any{"name": "lookup", "http": map[string]any{"url": "http://a"}}}}, agentRunMessage),
		Entry("a run of an Agent that sets a system prompt", agentRun, map[string]any{"spec.systemPrompt": "be nice"}, agentRunMessage),
		Entry("an Agent without a model", fullAgent, map[string]any{"spec.model": nil}, "spec.model is required on an Agent"),
		Entry("an Agent with a bad tool name", fullAgent, map[string]any{"spec.tools": []any{
			map[string]any{"name": "bad name!", "http": map[string]any{"url": "http://a"}}}}, "spec.tools[0].name in body should match"),
		Entry("an Agent with duplicate tool names", fullAgent, map[string]any{"spec.tools": []any{
			map[string]any{"name": "a", "http": map[string]any{"url": "http://a"}},
			map[string]any{"name": "a", "http": map[string]any{"url": "http://b"}}}}, "tool names must be unique within spec.tools"),
		Entry("an Agent whose tool takes an MCP server's prefix", fullAgent, map[string]any{"spec.tools": []any{
			map[string]any{"name": "github_x", "http": map[string]any{"url": "http://a"}}}}, "a tool name must not start with '<mcpServer name>_'"),
		Entry("an Agent with maxTurns 0", fullAgent, map[string]any{"spec.maxTurns": int64(0)},
			"spec.maxTurns in body should be greater than or equal to 1"),
	)

	It("accepts a run of an Agent with its own maxTurns, ttl and cancel", func() {
		Expect(k8sClient.Create(ctx, object(agentRun, newNamespace(), map[string]any{
			"spec.maxTurns": int64(3), "spec.ttlSecondsAfterFinished": int64(60), "spec.cancel": true}))).To(Succeed())
	})

	It("refuses a change of a run's agentRef", func() {
		run := object(agentRun, newNamespace(), nil)
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		err := mergePatch(run, `{"spec":{"agentRef":{"name":"other"}}}`)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("spec.agentRef is immutable after creation"))
		Expect(mergePatch(run, `{"spec":{"cancel":true}}`)).To(Succeed())
	})

	It("lets an Agent's spec be edited: immutability is the run's, not the agent's", func() {
		agent := object(fullAgent, newNamespace(), nil)
		Expect(k8sClient.Create(ctx, agent)).To(Succeed())
		Expect(mergePatch(agent, `{"spec":{"model":{"name":"gpt-5"},"systemPrompt":"You are terse.","maxTurns":3,`+
			`"tools":null,"mcpServers":null,"builtins":null,"approvals":null,"suspension":null}}`)).To(Succeed())
		Expect(mergePatch(agent, `{"spec":{"systemPrompt":null,"tools":[{"name":"lookup","http":{"url":"http://a"}}]}}`)).To(Succeed())
	})
})

var _ = Describe("PendingRequest admission", func() {
	var preq *unstructured.Unstructured

	BeforeEach(func() {
		preq = object(request, newNamespace(), nil)
		Expect(k8sClient.Create(ctx, preq)).To(Succeed())
	})

	DescribeTable("refuses an invalid answer",
		func(first, second, wantMessage string) {
			if first != "" {
				Expect(mergePatch(preq, first)).To(Succeed())
			}
			err := mergePatch(preq, second)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(wantMessage))
		},
		Entry("changed after it was set", `{"status":{"answer":{"ok":true}}}`,
			`{"status":{"answer":{"ok":false,"reason":"declined"}}}`, "status.answer cannot be changed or removed once set"),
		Entry("data added after it was set", `{"status":{"answer":{"ok":true}}}`,
			`{"status":{"answer":{"data":{"output":"x"}}}}`, "status.answer cannot be changed or removed once set"),
		Entry("removed after it was set", `{"status":{"answer":{"ok":true}}}`,
			`{"status":{"answer":null}}`, "status.answer cannot be changed or removed once set"),
		Entry("id not echoing the request id", "",
			`{"status":{"answer":{"id":"pnd-other","ok":true}}}`, "status.answer.id must equal spec.request.id"),
		Entry("reason with ok true", "",
			`{"status":{"answer":{"ok":true,"reason":"declined"}}}`, "answer.reason is only allowed when ok is false"),
		Entry("ok missing", "", `{"status":{"answer":{"data":{"output":"x"}}}}`, "status.answer.ok: Required value"),
	)

	It("refuses a spec change", func() {
		err := mergePatch(preq, `{"spec":{"request":{"prompt":"Approve everything?"}}}`)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("spec is immutable: it is written once by the controller"))
	})

	It("refuses a request without a kind", func() {
		err := k8sClient.Create(ctx, object(request, preq.GetNamespace(), map[string]any{
			"metadata.name": "no-kind", "spec.request.kind": nil}))
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("spec.request.kind: Required value"))
	})

	DescribeTable("accepts a valid answer, and later status writes that keep it",
		func(answer string) {
			Expect(mergePatch(preq, answer)).To(Succeed())
			Expect(mergePatch(preq, `{"status":{"phase":"Answered"}}`)).To(Succeed())
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(preq.GroupVersionKind())
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(preq), got)).To(Succeed())
			phase, _, _ := unstructured.NestedString(got.Object, "status", "phase")
			Expect(phase).To(Equal("Answered"))
		},
		Entry("approve", `{"status":{"answer":{"ok":true}}}`),
		Entry("approve echoing the id", `{"status":{"answer":{"id":"pnd-lx2k1-1","ok":true}}}`),
		Entry("free-text input", `{"status":{"answer":{"ok":true,"data":{"output":"staging"}}}}`),
		Entry("decline with a reason", `{"status":{"answer":{"ok":false,"reason":"too expensive"}}}`),
	)
})

var _ = Describe("kubectl explain", func() {
	It("prints the field docs of agentrun.spec.tools", func() {
		dir := GinkgoT().TempDir()
		kubeconfig, err := testenv.WriteKubeconfig(env, testenv.Admin, dir)
		Expect(err).NotTo(HaveOccurred())
		kubectl := filepath.Join(env.BinaryAssetsDirectory, "kubectl")

		// envtest returns once the CRDs are in discovery, but the API server publishes their
		// OpenAPI schema, which explain reads, a moment later: until then explain says it
		// "couldn't find resource". A cache of our own keeps other runs' discovery out.
		var out []byte
		Eventually(func() error {
			out, err = exec.Command(kubectl, "--kubeconfig", kubeconfig, "--cache-dir", filepath.Join(dir, "cache"),
				"explain", "agentrun.spec.tools").CombinedOutput()
			if err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			return nil
		}).WithTimeout(time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
		for _, want := range []string{
			"tools the model may call",
			"name	<string> -required-",
			"http	<Object>",
			"makes the tool an HTTP call",
			"parameters	<Object>",
		} {
			Expect(string(out)).To(ContainSubstring(want), fmt.Sprintf("kubectl explain output:\n%s", out))
		}
	})
})

// nineSinks is one notify sink more than a run may have.
func nineSinks() []any {
	out := make([]any, 9)
	for i := range out {
		out[i] = map[string]any{"name": fmt.Sprintf("sink-%d", i), "url": "http://a"}
	}
	return out
}

// pathOf is a delegation path of n runs.
func pathOf(n int) []any {
	path := make([]any, n)
	for i := range path {
		path[i] = fmt.Sprintf("run-%d", i)
	}
	return path
}

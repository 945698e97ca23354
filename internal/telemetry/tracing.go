// Package telemetry turns an AgentRun into one OpenTelemetry trace: spans per model request
// (chat), per tool execution (execute_tool) and per suspension, under a run span, following the
// GenAI semantic conventions. The controller calls it; the loop sees only its loop.Tracer.
package telemetry

import (
	"context"
	"net/url"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/loop"
)

// Attribute keys of our own, beside the semantic conventions'.
const (
	AttrRunName         = attribute.Key("toolnexus.agentrun.name")
	AttrRunUID          = attribute.Key("toolnexus.agentrun.uid")
	AttrRunReason       = attribute.Key("toolnexus.agentrun.reason")
	AttrRunTurns        = attribute.Key("toolnexus.agentrun.turns")
	AttrToolSource      = attribute.Key("toolnexus.tool.source")
	AttrToolOutcome     = attribute.Key("toolnexus.tool.outcome")
	AttrSuspensionKind  = attribute.Key("toolnexus.suspension.kind")
	AttrSuspensionOut   = attribute.Key("toolnexus.suspension.outcome")
	AttrAnsweredBy      = attribute.Key("toolnexus.suspension.answered_by")
	AttrPendingRequest  = attribute.Key("toolnexus.pendingrequest.name")
	attrGenAISystem     = attribute.Key("gen_ai.system") // the older name of gen_ai.provider.name
	instrumentationName = "github.com/toolnexus/operator"
)

// OutcomeAnswered is the outcome of a suspension answered ok; a refusal's outcome is its reason
// (declined, expired, cancelled: the suspension wire protocol's).
const OutcomeAnswered = "answered"

// Tracing writes the spans of runs. A nil *Tracing writes none, so callers need not check.
type Tracing struct {
	tracer  trace.Tracer
	content bool
}

// New writes spans with tp's tracer (built by NewProvider, which gives run spans their ids);
// content records prompts, arguments and outputs.
func New(tp trace.TracerProvider, content bool) *Tracing {
	return &Tracing{tracer: tp.Tracer(instrumentationName), content: content}
}

// Run identifies a run's trace and labels its spans.
type Run struct {
	UID, Namespace, Name string
	// Agent is the Agent the run runs, empty for a run with a spec of its own.
	Agent string
	// Caller is the span of the run's traceparent annotation; invalid when there is none.
	Caller trace.SpanContext
}

// SpanContext is the run span's: in the caller's trace when there is one, else in the trace
// derived from the UID; its span id is derived from the UID.
func (r Run) SpanContext() trace.SpanContext {
	cfg := trace.SpanContextConfig{TraceID: TraceID(r.UID), SpanID: RunSpanID(r.UID), TraceFlags: trace.FlagsSampled, Remote: true}
	if r.Caller.IsValid() {
		cfg.TraceID, cfg.TraceFlags = r.Caller.TraceID(), r.Caller.TraceFlags()
	}
	return trace.NewSpanContext(cfg)
}

func (r Run) attributes() []attribute.KeyValue {
	attrs := []attribute.KeyValue{semconv.K8SNamespaceName(r.Namespace), AttrRunName.String(r.Name)}
	if r.Agent != "" {
		attrs = append(attrs, semconv.GenAIAgentName(r.Agent))
	}
	return attrs
}

// Step is the context a step of run works in: its spans are children of the run span.
func (t *Tracing) Step(ctx context.Context, run Run) context.Context {
	if t == nil {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, run.SpanContext())
}

// Loop is the tracer of run's model requests and tool executions; nil when t is.
func (t *Tracing) Loop(run Run) loop.Tracer {
	if t == nil {
		return nil
	}
	return &runTracer{Tracing: t, attrs: run.attributes()}
}

// Suspension is a PendingRequest from its creation to its end.
type Suspension struct {
	Kind, Tool, CallID, Request string
	// Outcome is OutcomeAnswered or the reason of a refusal (tools.ReasonDeclined, ...).
	Outcome, AnsweredBy string
	Start, End          time.Time
}

// Suspended writes the span of a suspension that ended.
func (t *Tracing) Suspended(run Run, s Suspension) {
	if t == nil {
		return
	}
	attrs := append(run.attributes(), AttrSuspensionKind.String(s.Kind), semconv.GenAIToolName(s.Tool),
		semconv.GenAIToolCallID(short(s.CallID)), AttrPendingRequest.String(s.Request), AttrSuspensionOut.String(s.Outcome))
	if s.AnsweredBy != "" {
		attrs = append(attrs, AttrAnsweredBy.String(s.AnsweredBy))
	}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), run.SpanContext())
	_, span := t.tracer.Start(ctx, "toolnexus.suspension "+s.Kind, trace.WithTimestamp(s.Start), trace.WithAttributes(attrs...))
	span.End(trace.WithTimestamp(s.End))
}

// RunEnd is how a run ended.
type RunEnd struct {
	Start, End time.Time
	// Reason is the Succeeded condition's reason; Failed is set when the run failed, Message then
	// says why.
	Reason, Message           string
	Failed                    bool
	Model                     string
	Turns                     int
	InputTokens, OutputTokens int64
}

// Ended writes the run span, once, when the run has ended: with the derived ids, the caller's
// span as parent when there is one, and the run's start time.
func (t *Tracing) Ended(run Run, e RunEnd) {
	if t == nil {
		return
	}
	ctx := context.WithValue(context.Background(), runSpanKey{}, run.SpanContext())
	if run.Caller.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, run.Caller)
	}
	agent := run.Agent
	if agent == "" {
		agent = run.Name
	}
	attrs := append(run.attributes(), semconv.GenAIOperationNameInvokeAgent, AttrRunUID.String(run.UID),
		AttrRunReason.String(e.Reason), AttrRunTurns.Int(e.Turns), semconv.GenAIRequestModel(e.Model),
		semconv.GenAIUsageInputTokensKey.Int64(e.InputTokens), semconv.GenAIUsageOutputTokensKey.Int64(e.OutputTokens))
	if run.Agent == "" {
		attrs = append(attrs, semconv.GenAIAgentName(agent))
	}
	_, span := t.tracer.Start(ctx, "invoke_agent "+agent, trace.WithTimestamp(e.Start), trace.WithAttributes(attrs...))
	if e.Failed {
		span.SetAttributes(semconv.ErrorTypeKey.String(e.Reason))
		span.SetStatus(codes.Error, e.Message)
	}
	span.End(trace.WithTimestamp(e.End))
}

// What a model or a tool names (a tool, a model, a finish reason, a call id, a suspension's kind)
// goes into span names and attributes cut to maxName bytes, an error into a span's status cut to
// maxStatusMessage: the SDK's attribute limit bounds neither a span's name nor its status.
const (
	maxName          = 256
	maxStatusMessage = 1024
)

func short(s string) string { return clip.Bytes(s, maxName) }

// runTracer is the loop.Tracer of one run.
type runTracer struct {
	*Tracing
	attrs []attribute.KeyValue
}

func (t *runTracer) Content() bool { return t.content }

func (t *runTracer) StartModel(ctx context.Context, s loop.ModelSpan) (context.Context, func(loop.ModelSpanEnd)) {
	attrs := append(t.attrs[:len(t.attrs):len(t.attrs)], semconv.GenAIOperationNameChat,
		semconv.GenAIProviderNameKey.String(s.Style), attrGenAISystem.String(s.Style), semconv.GenAIRequestModel(s.Model))
	if u, err := url.Parse(s.BaseURL); err == nil {
		attrs = append(attrs, semconv.ServerAddress(u.Hostname()))
		if port, err := strconv.Atoi(u.Port()); err == nil {
			attrs = append(attrs, semconv.ServerPort(port))
		}
	}
	if t.content {
		attrs = append(attrs, semconv.GenAISystemInstructionsKey.String(s.System), semconv.GenAIInputMessagesKey.String(s.Input))
	}
	ctx, span := t.tracer.Start(ctx, "chat "+short(s.Model), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	return ctx, func(e loop.ModelSpanEnd) {
		if e.Err != nil {
			span.SetAttributes(semconv.ErrorTypeKey.String(e.ErrorType))
			span.SetStatus(codes.Error, clip.Bytes(e.Err.Error(), maxStatusMessage))
		} else {
			span.SetAttributes(semconv.GenAIResponseModel(short(e.Model)), semconv.GenAIResponseFinishReasons(short(e.FinishReason)),
				semconv.GenAIUsageInputTokens(e.Usage.PromptTokens), semconv.GenAIUsageOutputTokens(e.Usage.CompletionTokens))
			if t.content {
				span.SetAttributes(semconv.GenAIOutputMessagesKey.String(e.Output))
			}
		}
		span.End()
	}
}

func (t *runTracer) StartTool(ctx context.Context, s loop.ToolSpan) (context.Context, func(loop.ToolSpanEnd)) {
	attrs := append(t.attrs[:len(t.attrs):len(t.attrs)], semconv.GenAIOperationNameExecuteTool,
		semconv.GenAIToolName(short(s.Name)), semconv.GenAIToolCallID(short(s.CallID)), AttrToolSource.String(string(s.Source)))
	if t.content {
		attrs = append(attrs, semconv.GenAIToolCallArgumentsKey.String(s.Arguments))
	}
	ctx, span := t.tracer.Start(ctx, "execute_tool "+short(s.Name), trace.WithAttributes(attrs...))
	return ctx, func(e loop.ToolSpanEnd) {
		span.SetAttributes(AttrToolOutcome.String(e.Outcome))
		switch {
		case e.Err != nil:
			span.SetAttributes(semconv.ErrorTypeKey.String("hook_error"))
			span.SetStatus(codes.Error, clip.Bytes(e.Err.Error(), maxStatusMessage))
		case e.Outcome == loop.ToolError:
			span.SetAttributes(semconv.ErrorTypeKey.String("tool_error"))
			span.SetStatus(codes.Error, "the tool returned an error result")
		case e.Outcome == loop.ToolPending:
			span.SetAttributes(AttrSuspensionKind.String(short(e.Kind)))
		}
		if t.content {
			span.SetAttributes(semconv.GenAIToolCallResultKey.String(e.Output))
		}
		span.End()
	}
}

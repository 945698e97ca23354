package telemetry_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/telemetry"
	"github.com/toolnexus/operator/internal/tools"
)

const (
	uid    = "3f0c2a4e-8d1b-4c6a-9e2f-5b7d8a9c0e1f"
	apiKey = "sk-test-key-that-must-not-leak"
)

var testRun = telemetry.Run{UID: uid, Namespace: "team-a", Name: "triage", Agent: "triager"}

// recorder is a tracing whose spans land in memory, synchronously.
func recorder(t *testing.T, content bool) (*telemetry.Tracing, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := telemetry.NewProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return telemetry.New(tp, content), exp
}

func attrs(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

func byName(t *testing.T, exp *tracetest.InMemoryExporter, name string) []tracetest.SpanStub {
	t.Helper()
	var out []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// runLoop takes every step of a run whose model calls lookup once and then answers.
func runLoop(t *testing.T, tracing *telemetry.Tracing, lookup func() (any, error)) (*looptest.Server, *loop.State) {
	t.Helper()
	model := looptest.New(t,
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "lookup", Arguments: `{"q":"` + apiKey + `"}`}),
		looptest.OpenAIText("done"))
	tk, err := tools.NewToolkit(tools.NativeTool("lookup", "looks up", nil,
		func(context.Context, map[string]any, *tools.ToolContext) (any, error) { return lookup() }))
	if err != nil {
		t.Fatal(err)
	}
	c, err := loop.New(loop.Options{BaseURL: model.URL, Model: "gpt-test", APIKey: apiKey, SystemPrompt: "be brief",
		Tracer: tracing.Loop(testRun), HTTPClient: telemetry.Propagating(&http.Client{})})
	if err != nil {
		t.Fatal(err)
	}
	st := loop.NewState("what is up?")
	ctx := tracing.Step(t.Context(), testRun)
	for range 3 {
		if _, err := c.Step(ctx, st, tk); err != nil {
			t.Fatal(err)
		}
	}
	return model, st
}

func TestModelAndToolSpansJoinTheRunAndPropagate(t *testing.T) {
	tracing, exp := recorder(t, false)
	model, st := runLoop(t, tracing, func() (any, error) { return "42", nil })
	if st.Status != loop.StatusDone {
		t.Fatalf("run status %q, want done", st.Status)
	}
	chats := byName(t, exp, "chat gpt-test")
	tools := byName(t, exp, "execute_tool lookup")
	if len(chats) != 2 || len(tools) != 1 || len(exp.GetSpans()) != 3 {
		t.Fatalf("spans %d (chat %d, execute_tool %d), want 2 chat and 1 execute_tool", len(exp.GetSpans()), len(chats), len(tools))
	}
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID() != telemetry.TraceID(uid) || s.Parent.SpanID() != telemetry.RunSpanID(uid) || !s.Parent.IsRemote() {
			t.Errorf("%s: trace %s parent %s, want trace %s under the run span %s", s.Name, s.SpanContext.TraceID(), s.Parent.SpanID(),
				telemetry.TraceID(uid), telemetry.RunSpanID(uid))
		}
		a := attrs(s)
		if a["k8s.namespace.name"].AsString() != "team-a" || a["toolnexus.agentrun.name"].AsString() != "triage" || a["gen_ai.agent.name"].AsString() != "triager" {
			t.Errorf("%s: run attributes %v", s.Name, s.Attributes)
		}
		for _, key := range []attribute.Key{"gen_ai.input.messages", "gen_ai.system_instructions", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"} {
			if _, ok := a[key]; ok {
				t.Errorf("%s records %s without --trace-content", s.Name, key)
			}
		}
	}
	first := attrs(chats[0])
	for key, want := range map[attribute.Key]string{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.system": "openai",
		"gen_ai.request.model": "gpt-test", "gen_ai.response.model": "fake", "server.address": "127.0.0.1"} {
		if got := first[key].AsString(); got != want {
			t.Errorf("chat %s = %q, want %q", key, got, want)
		}
	}
	if got := first["gen_ai.response.finish_reasons"].AsStringSlice(); len(got) != 1 || got[0] != "tool_calls" {
		t.Errorf("finish reasons %v, want [tool_calls]", got)
	}
	if first["gen_ai.usage.input_tokens"].AsInt64() != looptest.PromptTokens || first["gen_ai.usage.output_tokens"].AsInt64() != looptest.CompletionTokens {
		t.Errorf("usage %v/%v", first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"])
	}
	if chats[0].SpanKind != trace.SpanKindClient {
		t.Errorf("chat span kind %v, want client", chats[0].SpanKind)
	}
	tool := attrs(tools[0])
	for key, want := range map[attribute.Key]string{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
		"gen_ai.tool.call.id": "call_1", "toolnexus.tool.outcome": "ok", "toolnexus.tool.source": "native"} {
		if got := tool[key].AsString(); got != want {
			t.Errorf("execute_tool %s = %q, want %q", key, got, want)
		}
	}
	// Each model request carries the traceparent of its own chat span.
	reqs := model.Requests()
	for i, s := range chats {
		want := "00-" + s.SpanContext.TraceID().String() + "-" + s.SpanContext.SpanID().String() + "-01"
		if got := reqs[i].Header.Get("traceparent"); got != want {
			t.Errorf("model request %d traceparent %q, want %q", i, got, want)
		}
	}
}

func TestContentIsRecordedOnlyWhenAskedAndRedacted(t *testing.T) {
	tracing, exp := recorder(t, true)
	runLoop(t, tracing, func() (any, error) { return "the answer is 42", nil })
	chat := attrs(byName(t, exp, "chat gpt-test")[1])
	tool := attrs(byName(t, exp, "execute_tool lookup")[0])
	if got := chat["gen_ai.system_instructions"].AsString(); got != "be brief" {
		t.Errorf("system instructions %q", got)
	}
	if got := chat["gen_ai.input.messages"].AsString(); !strings.Contains(got, "what is up?") || !strings.Contains(got, "the answer is 42") {
		t.Errorf("input messages %q, want the transcript", got)
	}
	if got := chat["gen_ai.output.messages"].AsString(); !strings.Contains(got, `"done"`) {
		t.Errorf("output messages %q, want the answer", got)
	}
	if got := tool["gen_ai.tool.call.result"].AsString(); got != "the answer is 42" {
		t.Errorf("tool result %q", got)
	}
	if got := tool["gen_ai.tool.call.arguments"].AsString(); !strings.Contains(got, "«redacted»") {
		t.Errorf("tool arguments %q, want the API key redacted", got)
	}
	for _, s := range exp.GetSpans() {
		for _, kv := range s.Attributes {
			if strings.Contains(kv.Value.String(), apiKey) {
				t.Errorf("%s: attribute %s holds the API key", s.Name, kv.Key)
			}
		}
	}
}

func TestToolOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name        string
		lookup      func() (any, error)
		wantOutcome string
		wantKind    string
		wantStatus  codes.Code
	}{
		{name: "error", lookup: func() (any, error) { return nil, errors.New("down") }, wantOutcome: "error", wantStatus: codes.Error},
		{name: "pending", lookup: func() (any, error) {
			return tools.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "ok?"}), nil
		}, wantOutcome: "pending", wantKind: "approval", wantStatus: codes.Unset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tracing, exp := recorder(t, false)
			model := looptest.New(t, looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "lookup", Arguments: "{}"}))
			tk, err := tools.NewToolkit(tools.NativeTool("lookup", "", nil,
				func(context.Context, map[string]any, *tools.ToolContext) (any, error) { return tc.lookup() }))
			if err != nil {
				t.Fatal(err)
			}
			c, err := loop.New(loop.Options{BaseURL: model.URL, Model: "m", Tracer: tracing.Loop(testRun)})
			if err != nil {
				t.Fatal(err)
			}
			st := loop.NewState("go")
			for range 2 {
				if _, err := c.Step(t.Context(), st, tk); err != nil {
					t.Fatal(err)
				}
			}
			spans := byName(t, exp, "execute_tool lookup")
			if len(spans) != 1 {
				t.Fatalf("%d execute_tool spans, want 1", len(spans))
			}
			a := attrs(spans[0])
			if a["toolnexus.tool.outcome"].AsString() != tc.wantOutcome || a["toolnexus.suspension.kind"].AsString() != tc.wantKind || spans[0].Status.Code != tc.wantStatus {
				t.Errorf("outcome %q kind %q status %v, want %q %q %v", a["toolnexus.tool.outcome"].AsString(),
					a["toolnexus.suspension.kind"].AsString(), spans[0].Status.Code, tc.wantOutcome, tc.wantKind, tc.wantStatus)
			}
		})
	}
}

func TestModelErrorSpan(t *testing.T) {
	tracing, exp := recorder(t, false)
	model := looptest.New(t, looptest.OpenAIError(http.StatusTooManyRequests, "slow down"))
	c, err := loop.New(loop.Options{BaseURL: model.URL, Model: "m", Tracer: tracing.Loop(testRun)})
	if err != nil {
		t.Fatal(err)
	}
	tk, _ := tools.NewToolkit()
	if _, err := c.Step(t.Context(), loop.NewState("go"), tk); err == nil {
		t.Fatal("the step succeeded against a 429")
	}
	s := byName(t, exp, "chat m")[0]
	if got := attrs(s)["error.type"].AsString(); got != "429" || s.Status.Code != codes.Error {
		t.Errorf("error.type %q status %v, want 429 and Error", got, s.Status.Code)
	}
}

func TestRunAndSuspensionSpans(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	answered := created.Add(48 * time.Hour)
	caller, err := telemetry.ParseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		run        telemetry.Run
		wantTrace  trace.TraceID
		wantParent trace.SpanID // of the run span; invalid for a root
	}{
		{name: "on its own", run: testRun, wantTrace: telemetry.TraceID(uid)},
		{name: "a caller's child", run: telemetry.Run{UID: uid, Namespace: "team-a", Name: "triage", Caller: caller},
			wantTrace: caller.TraceID(), wantParent: caller.SpanID()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tracing, exp := recorder(t, false)
			tracing.Suspended(tc.run, telemetry.Suspension{Kind: "approval", Tool: "deploy", CallID: "call_1", Request: "triage-1-call-1",
				Outcome: telemetry.OutcomeAnswered, AnsweredBy: "alice", Start: created, End: answered})
			tracing.Ended(tc.run, telemetry.RunEnd{Start: created.Add(-time.Minute), End: answered.Add(time.Minute),
				Reason: "RequestExpired", Message: "nobody answered", Failed: true, Turns: 2, InputTokens: 20, OutputTokens: 10})
			spans := exp.GetSpans()
			if len(spans) != 2 {
				t.Fatalf("%d spans, want 2", len(spans))
			}
			susp, run := spans[0], spans[1]
			if susp.Name != "toolnexus.suspension approval" || !susp.StartTime.Equal(created) || !susp.EndTime.Equal(answered) {
				t.Errorf("suspension span %q from %s to %s", susp.Name, susp.StartTime, susp.EndTime)
			}
			a := attrs(susp)
			if a["toolnexus.suspension.outcome"].AsString() != "answered" || a["toolnexus.suspension.answered_by"].AsString() != "alice" ||
				a["gen_ai.tool.name"].AsString() != "deploy" || a["toolnexus.pendingrequest.name"].AsString() != "triage-1-call-1" {
				t.Errorf("suspension attributes %v", susp.Attributes)
			}
			if susp.SpanContext.TraceID() != tc.wantTrace || susp.Parent.SpanID() != telemetry.RunSpanID(uid) {
				t.Errorf("suspension in trace %s under %s, want %s under the run span", susp.SpanContext.TraceID(), susp.Parent.SpanID(), tc.wantTrace)
			}
			if run.SpanContext.TraceID() != tc.wantTrace || run.SpanContext.SpanID() != telemetry.RunSpanID(uid) || run.Parent.SpanID() != tc.wantParent {
				t.Errorf("run span %s/%s under %s, want %s/%s under %s", run.SpanContext.TraceID(), run.SpanContext.SpanID(), run.Parent.SpanID(),
					tc.wantTrace, telemetry.RunSpanID(uid), tc.wantParent)
			}
			if run.Name != "invoke_agent triage" && run.Name != "invoke_agent triager" {
				t.Errorf("run span name %q", run.Name)
			}
			if !run.StartTime.Equal(created.Add(-time.Minute)) || run.Status.Code != codes.Error || attrs(run)["error.type"].AsString() != "RequestExpired" {
				t.Errorf("run span from %s status %v error.type %q", run.StartTime, run.Status, attrs(run)["error.type"].AsString())
			}
		})
	}
}

// A model names tools, models and finish reasons as it likes: spans carry them bounded, in their
// names too, which the SDK's attribute limit does not cover.
func TestWhatAModelNamesIsBounded(t *testing.T) {
	tracing, exp := recorder(t, false)
	long := strings.Repeat("x", 100_000)
	model := looptest.New(t, looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_" + long, Name: long, Arguments: "{}"}))
	c, err := loop.New(loop.Options{BaseURL: model.URL, Model: "m", Tracer: tracing.Loop(testRun)})
	if err != nil {
		t.Fatal(err)
	}
	tk, _ := tools.NewToolkit()
	st := loop.NewState("go")
	for range 2 {
		if _, err := c.Step(t.Context(), st, tk); err != nil {
			t.Fatal(err)
		}
	}
	spans := exp.GetSpans()
	var tool bool
	for _, s := range spans {
		if len(s.Name) > 300 || len(s.Status.Description) > 1024 {
			t.Errorf("span name of %d bytes, status of %d bytes", len(s.Name), len(s.Status.Description))
		}
		for _, kv := range s.Attributes {
			if v := kv.Value.String(); len(v) > 256 && kv.Key != "gen_ai.input.messages" {
				t.Errorf("span %.40s: %s of %d bytes", s.Name, kv.Key, len(v))
			}
		}
		tool = tool || strings.HasPrefix(s.Name, "execute_tool xxx")
	}
	if !tool {
		t.Fatalf("no execute_tool span for the unknown tool among %d spans", len(spans))
	}
}

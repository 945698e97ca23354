//go:build e2e

package e2e

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/pkg/toolnexustest"
)

// exportedSpan is a span the receiver got, with the service.name of its resource.
type exportedSpan struct {
	service string
	*tracepb.Span
}

func (s exportedSpan) attr(key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.GetStringValue()
		}
	}
	return ""
}

// otlpReceiver is a fake OpenTelemetry collector on loopback: it takes OTLP/HTTP protobuf trace
// exports, as a collector's otlp receiver does, and keeps their spans.
type otlpReceiver struct {
	url   string
	mu    sync.Mutex
	spans []exportedSpan
}

func startReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("otlp receiver: unexpected %s %s (%s)", req.Method, req.URL.Path, req.Header.Get("Content-Type"))
			http.Error(w, "want POST /v1/traces application/x-protobuf", http.StatusBadRequest)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		raw, err := io.ReadAll(io.LimitReader(body, 16<<20))
		export := &coltracepb.ExportTraceServiceRequest{}
		if err == nil {
			err = proto.Unmarshal(raw, export)
		}
		if err != nil {
			t.Errorf("otlp receiver: undecodable export: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range export.ResourceSpans {
			service := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					service = kv.Value.GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					r.spans = append(r.spans, exportedSpan{service: service, Span: s})
				}
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

// named returns the spans received so far, by name.
func (r *otlpReceiver) named() map[string][]exportedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]exportedSpan{}
	for _, s := range r.spans {
		out[s.Name] = append(out[s.Name], s)
	}
	return out
}

func traceparentOf(s exportedSpan) string {
	return "00-" + hex.EncodeToString(s.TraceId) + "-" + hex.EncodeToString(s.SpanId) + "-01"
}

// TestTraces runs the manager binary with the standard OTEL_* environment pointing at a receiver
// in the test: a run started by a caller's traceparent parks on an approval across a manager
// restart, and its spans, flushed when each manager stops, form one trace under the caller's
// span; the model and the tool server see the traceparent of the spans that called them.
func TestTraces(t *testing.T) {
	tmp := t.TempDir()
	bin, logs := filepath.Join(tmp, "bin"), filepath.Join(tmp, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	assetsDir := assets(t)
	if _, err := testenv.Build(bin, "./cmd/manager", "./hack/localcluster"); err != nil {
		t.Fatal(err)
	}
	clusterDir := startCluster(t, bin, filepath.Join(tmp, "cluster"), logs, assetsDir)
	k := kubectl{bin: filepath.Join(assetsDir, "kubectl"), dir: clusterDir, namespace: "traces"}

	const (
		key         = "e2e-trace-key-not-real"
		callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
		callerSpan  = "00f067aa0ba902b7"
	)
	receiver := startReceiver(t)
	model := toolnexustest.NewModel(t,
		toolnexustest.ToolCalls(toolnexustest.ToolCall{ID: "call_1", Name: "deploy", Arguments: `{"service":"checkout"}`}),
		// A model that echoes the run's API key: the recorded output must not.
		toolnexustest.Text("deployed with key "+key))
	toolServer := toolnexustest.NewToolServer(t, func(c toolnexustest.Call) toolnexustest.ToolReply {
		if c.Answer != nil {
			return toolnexustest.OK("deployed")
		}
		return toolnexustest.NeedsApproval("Deploy checkout?")
	})

	probeAddr := freeAddr(t)
	env := []string{"KUBECONFIG=" + filepath.Join(clusterDir, "kubeconfig-manager"),
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + receiver.url, "OTEL_SERVICE_NAME=toolnexus-e2e",
		// Spans wait in the batch until the manager stops: only the flush on shutdown sends them.
		"OTEL_BSP_SCHEDULE_DELAY=600000"}
	startManager := func() *process { return runManager(t, bin, logs, probeAddr, env, "--trace-content") }
	manager := startManager()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("manager log (tail):\n%s", manager.tail(40))
		}
	})

	k.must(t, "create", "namespace", k.namespace)
	k.must(t, "create", "secret", "generic", "llm", "--from-literal=apiKey="+key)
	manifest := fmt.Sprintf(`apiVersion: toolnexus.dev/v1alpha1
kind: AgentRun
metadata:
  name: traced
  annotations: {toolnexus.dev/traceparent: "00-%s-%s-01"}
spec:
  prompt: deploy checkout
  model: {name: e2e-model, baseURL: "%s", apiKeySecretRef: {name: llm, key: apiKey}}
  tools:
  - name: deploy
    description: Deploys a service.
    parameters: {type: object, properties: {service: {type: string}}}
    http: {url: "%s/deploy"}
`, callerTrace, callerSpan, model.URL(), toolServer.URL())
	if out, err := k.as("admin", manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	k.must(t, "wait", "--for=condition=Suspended", "--timeout=90s", "ar/traced")
	k.must(t, "wait", "--for=create", "--timeout=30s", "preq/"+preqName("traced"))

	t.Run("the spans of the first step are flushed when the manager stops", func(t *testing.T) {
		manager.stop(syscall.SIGTERM)
		got := receiver.named()
		if len(got["chat e2e-model"]) != 1 || len(got["execute_tool deploy"]) != 1 {
			t.Fatalf("after the first stop: %d chat and %d execute_tool spans, want 1 each", len(got["chat e2e-model"]), len(got["execute_tool deploy"]))
		}
		if s := got["execute_tool deploy"][0]; s.attr("toolnexus.tool.outcome") != "pending" || s.attr("toolnexus.suspension.kind") != "approval" {
			t.Errorf("the suspended call's span: outcome %q kind %q, want pending approval", s.attr("toolnexus.tool.outcome"), s.attr("toolnexus.suspension.kind"))
		}
	})

	manager = startManager()
	// A cluster this young may still answer ServiceUnavailable for the kind's status subresource.
	eventually(t, time.Minute, "answering the request", func() error {
		_, err := k.as("admin", "", "patch", "preq", preqName("traced"), "--subresource=status", "--type=merge",
			"-p", `{"status":{"answer":{"ok":true}}}`)
		return err
	})
	waitSucceeded(t, k, "traced")
	manager.stop(syscall.SIGTERM)

	got := receiver.named()
	t.Run("one trace under the caller's span", func(t *testing.T) {
		for name, want := range map[string]int{"chat e2e-model": 2, "execute_tool deploy": 2, "toolnexus.suspension approval": 1, "invoke_agent traced": 1} {
			if len(got[name]) != want {
				t.Errorf("%d %q spans, want %d", len(got[name]), name, want)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
		run := got["invoke_agent traced"][0]
		if hex.EncodeToString(run.ParentSpanId) != callerSpan {
			t.Errorf("the run span's parent is %x, want the caller's span %s", run.ParentSpanId, callerSpan)
		}
		for name, spans := range got {
			for _, s := range spans {
				if hex.EncodeToString(s.TraceId) != callerTrace || s.service != "toolnexus-e2e" {
					t.Errorf("%s: trace %x service %q, want the caller's trace %s from toolnexus-e2e", name, s.TraceId, s.service, callerTrace)
				}
				if name != "invoke_agent traced" && string(s.ParentSpanId) != string(run.SpanId) {
					t.Errorf("%s: parent %x, want the run span %x", name, s.ParentSpanId, run.SpanId)
				}
			}
		}
		if s := got["toolnexus.suspension approval"][0]; s.attr("toolnexus.suspension.outcome") != "answered" || s.attr("k8s.namespace.name") != "traces" {
			t.Errorf("suspension span: outcome %q namespace %q", s.attr("toolnexus.suspension.outcome"), s.attr("k8s.namespace.name"))
		}
	})

	t.Run("the model and the tool server saw the traceparent of the spans that called them", func(t *testing.T) {
		calls := toolServer.Calls()
		if len(calls) != 2 {
			t.Fatalf("%d tool calls, want 2", len(calls))
		}
		for i, c := range calls {
			if want := traceparentOf(got["execute_tool deploy"][i]); c.Header.Get("traceparent") != want {
				t.Errorf("tool call %d traceparent %q, want %q", i, c.Header.Get("traceparent"), want)
			}
		}
		for i, r := range model.Requests() {
			if want := traceparentOf(got["chat e2e-model"][i]); r.Header.Get("traceparent") != want {
				t.Errorf("model request %d traceparent %q, want %q", i, r.Header.Get("traceparent"), want)
			}
		}
	})

	t.Run("content is recorded with the run's Secret redacted", func(t *testing.T) {
		out := got["chat e2e-model"][1].attr("gen_ai.output.messages")
		if !strings.Contains(out, "deployed with key «redacted»") {
			t.Errorf("the last model output %q, want the key redacted", out)
		}
		if args := got["execute_tool deploy"][0].attr("gen_ai.tool.call.arguments"); !strings.Contains(args, "checkout") {
			t.Errorf("tool arguments %q, want the model's", args)
		}
		for name, spans := range got {
			for _, s := range spans {
				for _, kv := range s.Attributes {
					if strings.Contains(kv.Value.GetStringValue(), key) {
						t.Errorf("%s: attribute %s holds the API key", name, kv.Key)
					}
				}
			}
		}
	})
}

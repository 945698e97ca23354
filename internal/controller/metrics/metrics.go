// Package metrics holds the operator's Prometheus metrics, toolnexus names where toolnexus has one,
// shared by the AgentRun controller, the notifier and the executor.
package metrics

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/executor"
	"github.com/toolnexus/operator/internal/loop"
)

// buckets are the toolnexus histogram buckets.
var buckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// Metrics are the manager's Prometheus metrics, with toolnexus names where toolnexus has one.
type Metrics struct {
	llmRequests  *prometheus.CounterVec
	llmTokens    *prometheus.CounterVec
	llmDuration  *prometheus.HistogramVec
	toolCalls    *prometheus.CounterVec
	toolDuration *prometheus.HistogramVec
	// RunErrors counts runs that failed, by reason (toolnexus_run_errors_total).
	RunErrors *prometheus.CounterVec
	// SuspensionWait observes how long requests waited, by kind and outcome
	// (toolnexus_suspension_wait_seconds).
	SuspensionWait *prometheus.HistogramVec
	inflight       *prometheus.GaugeVec
	queued         *prometheus.GaugeVec
	inflightBytes  prometheus.Gauge
	queueWait      prometheus.Histogram
	// Notifications counts notification attempts, by format, event and outcome
	// (toolnexus_notifications_total).
	Notifications *prometheus.CounterVec
	// AuditEvents counts audit event attempts, by type and outcome (toolnexus_audit_events_total).
	AuditEvents *prometheus.CounterVec
	// Waits counts the external work runs wait on now (MCP tasks), by namespace and kind.
	Waits *WaitGauge
	polls *prometheus.CounterVec
}

// New registers the metrics with reg. Open PendingRequests are counted from reader (the
// manager's cache) at scrape time, so the gauge can never drift from the cluster.
func New(reg prometheus.Registerer, reader client.Reader) *Metrics {
	m := &Metrics{
		llmRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "toolnexus_llm_requests_total", Help: "Total LLM requests."}, []string{"model", "status"}),
		llmTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "toolnexus_llm_tokens_total", Help: "Total tokens, by type."}, []string{"model", "type"}),
		llmDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "toolnexus_llm_request_duration_seconds", Help: "LLM request duration in seconds.", Buckets: buckets},
			[]string{"model"}),
		toolCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "toolnexus_tool_calls_total", Help: "Total tool calls."}, []string{"tool", "source", "is_error", "pending"}),
		toolDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "toolnexus_tool_duration_seconds", Help: "Tool execution duration in seconds.", Buckets: buckets},
			[]string{"tool", "source"}),
		RunErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "toolnexus_run_errors_total", Help: "Total run errors."}, []string{"reason"}),
		SuspensionWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "toolnexus_suspension_wait_seconds", Help: "Time from a PendingRequest's creation to its answer, in seconds.",
			Buckets: []float64{1, 10, 60, 300, 1800, 3600, 14400, 86400, 604800}}, []string{"kind", "outcome"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "toolnexus_inflight_steps", Help: "Steps (model requests and tool calls) in flight, by namespace."}, []string{"namespace"}),
		inflightBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "toolnexus_inflight_step_bytes", Help: "Memory the steps in flight hold, and the outcomes not saved yet, against --max-inflight-memory."}),
		queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "toolnexus_queued_steps", Help: "Steps waiting for a slot of their namespace's share or of the total, by namespace."}, []string{"namespace"}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "toolnexus_step_queue_wait_seconds", Help: "Time a step waited for a slot before it started, in seconds.",
			Buckets: []float64{0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300}}),
		Notifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "toolnexus_notifications_total", Help: "Attempts to deliver PendingRequest notifications, by sink format, event and outcome (delivered, retried, failed)."},
			[]string{"format", "event", "outcome"}),
		AuditEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "toolnexus_audit_events_total", Help: "Attempts to deliver audit events to --audit-sink-url, by type and outcome (delivered, retried)."},
			[]string{"type", "outcome"}),
	}
	reg.MustRegister(m.llmRequests, m.llmTokens, m.llmDuration, m.toolCalls, m.toolDuration, m.RunErrors,
		m.SuspensionWait, m.inflight, m.inflightBytes, m.queued, m.queueWait, &pendingCollector{reader: reader})
	m.Waits = &WaitGauge{gauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "toolnexus_external_waits", Help: "Tool calls waiting on external work (MCP tasks) now, holding no executor slot, by namespace and kind."},
		[]string{"namespace", "kind"}), runs: map[string]runWaits{}}
	m.polls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "toolnexus_external_wait_polls_total", Help: "Looks at external work a tool call waits on (tasks/get), by tool, source and outcome (waiting, failed, pending, done)."},
		[]string{"tool", "source", "outcome"})
	reg.MustRegister(m.Notifications, m.AuditEvents, m.Waits.gauge, m.polls)
	return m
}

// WaitGauge is toolnexus_external_waits: what each run waits on, summed by namespace and kind.
type WaitGauge struct {
	gauge *prometheus.GaugeVec
	mu    sync.Mutex
	runs  map[string]runWaits
}

type runWaits struct {
	namespace string
	kinds     map[string]int
}

// Set records that the run named key in namespace waits on kinds (kind: count) now; nil or empty
// when it waits on nothing.
func (g *WaitGauge) Set(namespace, key string, kinds map[string]int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	touched := map[string]bool{}
	for kind := range g.runs[key].kinds {
		touched[kind] = true
	}
	if len(kinds) == 0 {
		delete(g.runs, key)
	} else {
		g.runs[key] = runWaits{namespace: namespace, kinds: kinds}
	}
	for kind := range kinds {
		touched[kind] = true
	}
	for kind := range touched {
		n := 0
		for _, r := range g.runs {
			if r.namespace == namespace {
				n += r.kinds[kind]
			}
		}
		if n == 0 {
			g.gauge.DeleteLabelValues(namespace, kind)
			continue
		}
		g.gauge.WithLabelValues(namespace, kind).Set(float64(n))
	}
}

// ExecutorObserver feeds the executor's figures into the metrics. A namespace's series go away
// when it has nothing in flight or waiting.
func (m *Metrics) ExecutorObserver() executor.Observer {
	gauge := func(g *prometheus.GaugeVec) func(string, int) {
		return func(ns string, n int) {
			if n == 0 {
				g.DeleteLabelValues(ns)
				return
			}
			g.WithLabelValues(ns).Set(float64(n))
		}
	}
	return executor.Observer{
		Inflight: gauge(m.inflight),
		Queued:   gauge(m.queued),
		Waited:   func(_ string, d time.Duration) { m.queueWait.Observe(d.Seconds()) },
		Bytes:    func(n int64) { m.inflightBytes.Set(float64(n)) },
	}
}

// Observe records one loop event.
func (m *Metrics) Observe(ev loop.Event) {
	switch ev.Kind {
	case loop.EventLLM:
		status := strconv.Itoa(ev.StatusCode)
		if ev.StatusCode == 0 {
			status = "error"
		}
		m.llmRequests.WithLabelValues(ev.Model, status).Inc()
		m.llmDuration.WithLabelValues(ev.Model).Observe(ev.Duration.Seconds())
		m.llmTokens.WithLabelValues(ev.Model, "prompt").Add(float64(ev.PromptTokens))
		m.llmTokens.WithLabelValues(ev.Model, "completion").Add(float64(ev.CompletionTokens))
	case loop.EventTool:
		if ev.Poll {
			outcome := "done"
			switch {
			case ev.Waiting:
				outcome = "waiting"
			case ev.Pending:
				outcome = "pending"
			case ev.IsError:
				outcome = "failed"
			}
			m.polls.WithLabelValues(ev.Tool, string(ev.Source), outcome).Inc()
			return
		}
		m.toolCalls.WithLabelValues(ev.Tool, string(ev.Source), strconv.FormatBool(ev.IsError), strconv.FormatBool(ev.Pending)).Inc()
		m.toolDuration.WithLabelValues(ev.Tool, string(ev.Source)).Observe(ev.Duration.Seconds())
	}
}

var pendingDesc = prometheus.NewDesc("toolnexus_pending_requests", "PendingRequests open now, by kind.", []string{"kind"}, nil)

// pendingCollector counts unanswered PendingRequests from the cache when scraped.
type pendingCollector struct {
	reader client.Reader
	mu     sync.Mutex
}

func (c *pendingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- pendingDesc }

func (c *pendingCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var list toolnexusv1alpha1.PendingRequestList
	if err := c.reader.List(context.Background(), &list); err != nil {
		return
	}
	counts := map[string]int{}
	for i := range list.Items {
		p := &list.Items[i]
		if p.Status.Answer == nil && p.Status.Phase != toolnexusv1alpha1.RequestPhaseCancelled {
			counts[p.Spec.Request.Kind]++
		}
	}
	for kind, n := range counts {
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(n), kind)
	}
}

package controller_test

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/telemetry"
	"github.com/toolnexus/operator/internal/tools"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// The values a leak search looks for.
const (
	leakedAPIKey = "kQ7xSEARCHMEzx93vW"
	leakedHeader = "Hq9jSEARCHMEb41dZ2"
)

var _ = Describe("Secrets", func() {
	It("never appear in status, events, requests, the transcript, spans (content recorded) or any log line", func() {
		ns := newNamespace()
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llm"},
			StringData: map[string]string{"apiKey": leakedAPIKey}})).To(Succeed())
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tool-token"},
			StringData: map[string]string{"token": leakedHeader}})).To(Succeed())
		// A careless tool server that echoes the request's headers, in an error and in a success.
		ts := toolstest.Serve(GinkgoT(), func(c toolstest.Call) (int, string) {
			echo := "you sent Authorization=" + c.Header.Get("Authorization") + " X-Key=" + c.Header.Get("X-Key")
			if c.Path == "/fails" {
				return http.StatusForbidden, echo
			}
			return 200, toolstest.Pending(tools.Request{Kind: tools.KindApproval, Prompt: "approve? " + echo})
		})
		// A careless model endpoint: it echoes the key in its error, then behaves.
		model := looptest.New(GinkgoT(),
			looptest.Reply{Status: http.StatusInternalServerError, Body: `{"error":{"message":"upstream said: key ` + leakedAPIKey + ` is rate limited"}}`},
			looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "fails", Arguments: "{}"}, looptest.ToolCall{ID: "call_2", Name: "asks", Arguments: "{}"}),
			looptest.Reply{Status: http.StatusUnauthorized, Body: `{"error":{"message":"invalid key ` + leakedAPIKey + `"}}`})
		run := newRun(ns, "leaky", model.URL, ts, "fails", "asks")
		run.Spec.Model.APIKeySecretRef = &toolnexusv1alpha1.SecretKeyReference{Name: "llm", Key: "apiKey"}
		for i := range run.Spec.Tools {
			run.Spec.Tools[i].HTTP.Headers = []toolnexusv1alpha1.HTTPHeader{
				{Name: "Authorization", ValueFrom: &toolnexusv1alpha1.SecretValueSource{SecretKeyRef: toolnexusv1alpha1.SecretKeyReference{Name: "tool-token", Key: "token"}}},
				{Name: "X-Key", ValueFrom: &toolnexusv1alpha1.SecretValueSource{SecretKeyRef: toolnexusv1alpha1.SecretKeyReference{Name: "llm", Key: "apiKey"}}},
			}
		}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		reqs := waitSuspended(run, 1)
		answer(&reqs[0], `{"ok":false,"reason":"no"}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseFailed))
		// The secrets did reach the wire, where they belong.
		Expect(model.Requests()[0].Header.Get("Authorization")).To(Equal("Bearer " + leakedAPIKey))
		Expect(ts.Calls()[0].Header.Get("Authorization")).To(Equal(leakedHeader))

		tid := telemetry.TraceID(string(getRun(run).UID))
		Eventually(func() map[string][]tracetest.SpanStub { return spansOf(tid) }, eventually).Should(HaveKey("invoke_agent leaky"))
		haystack := haystackOf(run)
		Expect(haystack).To(ContainElement(ContainSubstring("you sent Authorization=")),
			"the echo itself is kept, redacted, in the transcript and the spans")
		Expect(managerLog.String()).To(ContainSubstring("leaky"), "the manager logged about this run")
		for _, hay := range haystack {
			Expect(strings.Contains(hay, leakedAPIKey)).To(BeFalse(), "the API key leaked into:\n%.2000s", hay)
			Expect(strings.Contains(hay, leakedHeader)).To(BeFalse(), "the header secret leaked into:\n%.2000s", hay)
		}
	})
})

// haystackOf is everything a secret of run must never reach: the run and its requests as stored,
// the events of its namespace, its record's transcript, its trace's spans so far (content on) and the
// manager's log at full verbosity (client-go's hexdumps of bodies reassembled).
func haystackOf(run *toolnexusv1alpha1.AgentRun) []string {
	GinkgoHelper()
	var haystack []string
	raw, err := json.Marshal(getRun(run))
	Expect(err).NotTo(HaveOccurred())
	haystack = append(haystack, string(raw))
	for _, p := range requestsOf(run) {
		raw, err := json.Marshal(p)
		Expect(err).NotTo(HaveOccurred())
		haystack = append(haystack, string(raw))
	}
	var events eventsv1.EventList
	Expect(k8sClient.List(ctx, &events, client.InNamespace(run.Namespace))).To(Succeed())
	Expect(events.Items).NotTo(BeEmpty())
	for _, e := range events.Items {
		haystack = append(haystack, e.Note, e.Reason)
	}
	var recs toolnexusv1alpha1.AgentRunRecordList
	Expect(k8sClient.List(ctx, &recs, client.InNamespace(run.Namespace), client.MatchingLabels{toolnexusv1alpha1.RunLabel: run.Name})).To(Succeed())
	Expect(recs.Items).NotTo(BeEmpty())
	for _, rec := range recs.Items {
		zr, err := gzip.NewReader(bytes.NewReader(rec.Data))
		Expect(err).NotTo(HaveOccurred())
		transcript, err := io.ReadAll(zr)
		Expect(err).NotTo(HaveOccurred())
		haystack = append(haystack, string(transcript))
	}
	for _, ss := range spansOf(telemetry.TraceID(string(getRun(run).UID))) {
		for _, s := range ss {
			haystack = append(haystack, s.Status.Description)
			for _, kv := range s.Attributes {
				haystack = append(haystack, kv.Value.String())
			}
		}
	}
	for _, line := range strings.Split(managerLog.String(), "\n") {
		haystack = append(haystack, line)
		if strings.Contains(line, `"body": "00000000  `) {
			haystack = append(haystack, undump(line))
		}
	}
	return haystack
}

// hexRow is one row of the hexdumps client-go logs request and response bodies as, at high
// verbosity: an offset, then up to 16 bytes in hex.
var hexRow = regexp.MustCompile(`[0-9a-f]{8}  ((?:[0-9a-f]{2} {1,2}){1,16})`)

// undump reassembles the bytes of the hexdumps in a log line, so a secret split across rows of a
// dump is found whole.
func undump(line string) string {
	var out []byte
	for _, row := range hexRow.FindAllStringSubmatch(line, -1) {
		for _, pair := range strings.Fields(row[1]) {
			b, err := hex.DecodeString(pair)
			if err == nil {
				out = append(out, b...)
			}
		}
	}
	return string(out)
}

package trust_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
)

// The manager runs in this process with ordinary logging, so the heap it shows is the manager's
// (plus the suite's clients and fakes, which stream what they send instead of holding it).
// maxHeap is the bound every hostile input below must stay under, with the figures measured
// here in the comments.
const maxHeap = 192 << 20

// repeat is an endless stream of one byte.
type repeat byte

func (r repeat) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}

// sampleHeap samples the heap in use every 5 ms until the test ends; the returned function
// reports the peak so far.
func sampleHeap() func() uint64 {
	var peak atomic.Uint64
	done := make(chan struct{})
	DeferCleanup(func() { close(done) })
	go func() {
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return func() uint64 {
		GinkgoWriter.Printf("peak heap in use: %d MiB\n", peak.Load()>>20)
		return peak.Load()
	}
}

// plainRun is a run with one ungated HTTP tool.
func plainRun(ns, name, modelURL, toolURL string) *toolnexusv1alpha1.AgentRun {
	return &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "go", AgentSpec: toolnexusv1alpha1.AgentSpec{
			Model: toolnexusv1alpha1.ModelSpec{Name: "m", BaseURL: modelURL},
			Tools: []toolnexusv1alpha1.ToolSpec{{Name: "dump",
				Parameters: &apiextensionsv1.JSON{Raw: []byte(`{"type":"object"}`)},
				HTTP:       &toolnexusv1alpha1.HTTPToolSpec{URL: toolURL}}},
		}},
	}
}

// expectServing shows the manager still serves other runs: a run in another namespace finishes.
func expectServing() {
	GinkgoHelper()
	model := looptest.New(GinkgoT(), looptest.OpenAIText("still here"))
	run := plainRun(newNamespace(), "bystander", model.URL, "http://127.0.0.1:1/unused")
	Expect(admin.Create(ctx, run)).To(Succeed())
	Eventually(succeeded(run), eventually).Should(Equal("True/" + toolnexusv1alpha1.ReasonCompleted))
}

var _ = Describe("Hostile inputs", func() {
	It("120 MB of compressible tool output ends the run TranscriptTooLarge; the manager holds little of it", func() {
		ns := newNamespace()
		var served atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			n, _ := io.CopyN(w, repeat('a'), 10<<20)
			served.Add(n)
		}))
		DeferCleanup(srv.Close)
		calls := make([]looptest.ToolCall, 12)
		for i := range calls {
			calls[i] = looptest.ToolCall{ID: fmt.Sprintf("call_%d", i+1), Name: "dump", Arguments: "{}"}
		}
		model := looptest.New(GinkgoT(), looptest.OpenAIToolCalls(calls...))
		run := plainRun(ns, "compressible", model.URL, srv.URL)
		peak := sampleHeap()
		Expect(admin.Create(ctx, run)).To(Succeed())
		Eventually(succeeded(run), eventually).Should(Equal("False/" + toolnexusv1alpha1.ReasonTranscriptTooLarge))
		Expect(getRun(run).Status.Conditions).To(ContainElement(HaveField("Message", ContainSubstring("8 MiB decoded"))))
		// Each output is cut at 1 MiB: 12 MiB of transcript, past the 8 MiB this suite allows.
		// Measured: peak heap in use 97-102 MiB for the whole test process.
		Expect(peak()).To(BeNumerically("<", maxHeap))
		Expect(model.Requests()).To(HaveLen(1), "the run stopped instead of sending it all to the model")
		expectServing()
	})

	It("a gzip bomb in the record ends the run TranscriptCorrupt without inflating it", func() {
		ns, run, preq, ts, _ := parkedGatedRun()
		// Only the manager can write records: admin stands in for a bug or a disk fault.
		rec := &toolnexusv1alpha1.AgentRunRecord{}
		Expect(admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: "buy"}, rec)).To(Succeed())
		var bomb bytes.Buffer
		zw, err := gzip.NewWriterLevel(&bomb, gzip.BestCompression)
		Expect(err).NotTo(HaveOccurred())
		_, err = io.CopyN(zw, repeat(0), 512<<20)
		Expect(err).NotTo(HaveOccurred())
		Expect(zw.Close()).To(Succeed())
		rec.Data = bomb.Bytes()
		Expect(admin.Update(ctx, rec)).To(Succeed())
		// The manager reads a record it saw from the API server's watch cache (docs/design.md): wait
		// until the cache holds the bomb, as it does a moment after any write, so that the answer
		// below meets the damaged record and not the one just replaced.
		Expect(admin.Get(ctx, client.ObjectKeyFromObject(rec), &toolnexusv1alpha1.AgentRunRecord{},
			&client.GetOptions{Raw: &metav1.GetOptions{ResourceVersion: rec.ResourceVersion}})).To(Succeed())
		peak := sampleHeap()
		approve(preq)
		Eventually(succeeded(run), eventually).Should(Equal("False/" + toolnexusv1alpha1.ReasonTranscriptCorrupt))
		Expect(getRun(run).Status.Conditions).To(ContainElement(HaveField("Message", ContainSubstring("decoded size exceeds the limit"))))
		// 512 MiB once inflated; measured: peak heap in use 122 MiB for the whole test process,
		// garbage of the previous specs included.
		Expect(peak()).To(BeNumerically("<", maxHeap))
		Expect(ts.Calls()).To(BeEmpty(), "nothing runs from a damaged record")
		expectServing()
	})
})

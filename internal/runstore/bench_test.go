package runstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/state"
)

// The benchmarks here measure what persisting a run's state costs per step as its transcript
// grows (issue 9: "state persistence cost per turn that does not grow with transcript length
// beyond linear"). Run them with
//
//	go test ./internal/runstore -run '^$' -bench 'SaveRecord' -benchmem
//
// They need no control plane: the record goes through controller-runtime's fake client, which
// serializes objects as the real client does.

var benchWords = strings.Fields("the quick brown fox jumps over a lazy dog while tool output " +
	"carries ids 3f9a 77c1 e0b2 and numbers 1024 4096 65536 status ok pending retry answer")

// benchText is n bytes of word salad: compressible like real tool output, not like one repeated
// string.
func benchText(rng *rand.Rand, n int) string {
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(benchWords[rng.IntN(len(benchWords))])
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

// addTurn appends one model turn that called one tool, with its result out, as the loop does.
func addTurn(st *state.State, rng *rand.Rand, out string) {
	st.Turn++
	id := fmt.Sprintf("call_%d", st.Turn)
	args := fmt.Sprintf(`{"k":%d,"query":%q}`, st.Turn, benchText(rng, 40))
	st.Messages = append(st.Messages,
		state.Message{Role: state.RoleAssistant, Content: benchText(rng, 120), ToolCalls: []state.MessageToolCall{{ID: id, Name: "work", Arguments: args}}},
		state.Message{Role: state.RoleTool, ToolCallID: id, Content: out})
	st.ToolCalls = append(st.ToolCalls, state.ToolCall{ID: id, Name: "work", Arguments: args, Output: out, Turn: st.Turn})
	st.ToolCallCount++
	st.Usage.PromptTokens += 1000 * st.Turn
	st.Usage.CompletionTokens += 50
	st.Usage.TotalTokens = st.Usage.PromptTokens + st.Usage.CompletionTokens
}

// benchRun builds a store over a fake client and a run whose record has the given number of
// turns, saved turn by turn as the controller saves them (so the head is sealed into segments the
// way a real run's is).
func benchRun(b *testing.B, turns, outputBytes int) (*Store, *toolnexusv1alpha1.AgentRun, *Record) {
	b.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		b.Fatal(err)
	}
	if err := toolnexusv1alpha1.AddToScheme(scheme); err != nil {
		b.Fatal(err)
	}
	run := &toolnexusv1alpha1.AgentRun{ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: "default", UID: "bench-uid"},
		Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "benchmark"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(run).Build()
	r := New(c, c, scheme, Limits{})
	rec := &Record{State: state.New(run.Spec.Prompt)}
	rng := rand.New(rand.NewPCG(1, uint64(turns)))
	ctx := context.Background()
	for range turns {
		addTurn(rec.State, rng, benchText(rng, outputBytes))
		if err := r.Save(ctx, run, rec); err != nil {
			b.Fatal(err)
		}
	}
	return r, run, rec
}

var benchTurns = []int{10, 100, 500, 2000}

// BenchmarkSaveRecord reports, per transcript length (turns of one tool call with 1 KiB of
// output each), the cost of one step's persistence:
//   - encode: JSON + gzip of the head (the CPU the manager spends per save);
//   - save: encode plus the AgentRunRecord update through the (fake) client;
//   - load: the uncached read at the start of every reconcile, which also reads every sealed
//     segment, so it grows linearly with the transcript.
//
// headKiB is the compressed head written per save; segments the sealed segments behind it.
func BenchmarkSaveRecord(b *testing.B) {
	ctx := context.Background()
	for _, turns := range benchTurns {
		r, run, rec := benchRun(b, turns, 1024)
		head, _, err := encodeHead(rec.State, rec.segments, rec.Agent, rec.spill)
		if err != nil {
			b.Fatal(err)
		}
		report := func(b *testing.B) {
			b.ReportMetric(float64(len(head))/1024, "headKiB")
			b.ReportMetric(float64(len(rec.segments)), "segments")
		}
		b.Run(fmt.Sprintf("encode/turns=%d", turns), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := encodeHead(rec.State, rec.segments, rec.Agent, rec.spill); err != nil {
					b.Fatal(err)
				}
			}
			report(b)
		})
		b.Run(fmt.Sprintf("save/turns=%d", turns), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := r.Save(ctx, run, rec); err != nil {
					b.Fatal(err)
				}
			}
			report(b)
		})
		b.Run(fmt.Sprintf("load/turns=%d", turns), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Load(ctx, run); err != nil {
					b.Fatal(err)
				}
			}
			report(b)
		})
	}
}

package runstore

import (
	"context"
	"errors"
	mathrand "math/rand/v2"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/testenv"
)

// The split against a real kube-apiserver and etcd: what the CRD accepts of one object (data's
// maxLength, the index bound) and what etcd stores, not what a fake client lets through.
func TestAgainstTheAPIServer(t *testing.T) {
	env, err := testenv.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	// newRun creates a run as a user would and returns it as the API server has it.
	newRun := func(t *testing.T) *toolnexusv1alpha1.AgentRun {
		t.Helper()
		run := &toolnexusv1alpha1.AgentRun{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "big-", Namespace: ns.Name},
			Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "dump it", AgentSpec: toolnexusv1alpha1.AgentSpec{
				Model: toolnexusv1alpha1.ModelSpec{Name: "m"}}},
		}
		if err := c.Create(ctx, run); err != nil {
			t.Fatal(err)
		}
		return run
	}
	// twoOutputs is a record holding two tool messages of 1 MiB that do not compress.
	twoOutputs := func(t *testing.T) *Record {
		rec := &Record{State: state.New("dump it")}
		rng := mathrand.New(mathrand.NewPCG(11, 12))
		addTurn(rec.State, rng, incompressible(t, 1<<20))
		addTurn(rec.State, rng, incompressible(t, 1<<20))
		return rec
	}

	t.Run("two tool outputs of 1 MiB are stored and read back whole", func(t *testing.T) {
		run := newRun(t)
		rec := twoOutputs(t)
		if err := New(c, c, scheme, Limits{}).Save(ctx, run, rec); err != nil {
			t.Fatal(err)
		}
		if parts := rec.segments[0].parts(); parts < 2 {
			t.Fatalf("the segment is in %d part, want it split", parts)
		}
		loaded, err := New(c, c, scheme, Limits{}).Load(ctx, started(run))
		if err != nil {
			t.Fatal(err)
		}
		sameState(t, rec.State, loaded.State)
		read, err := Read(ctx, c, run, DefaultMaxRawBytes)
		if err != nil {
			t.Fatal(err)
		}
		sameState(t, rec.State, read.State)
		if got, want := len(records(t, c, run)), 1+rec.segments[0].parts(); got != want {
			t.Errorf("%d AgentRunRecords, want the head and %d parts", got, want-1)
		}
	})

	t.Run("a turn with two finished outputs of 1 MiB and a call that waits is stored and read back whole", func(t *testing.T) {
		run := newRun(t)
		rec := &Record{State: bigTurn(t, run.Spec.Prompt)}
		if err := New(c, c, scheme, Limits{}).Save(ctx, run, rec); err != nil {
			t.Fatal(err)
		}
		if rec.spill == nil || len(rec.Head.Data) > sealAt {
			t.Fatalf("spill %+v, head of %d bytes: want a spill and a head within %d", rec.spill, len(rec.Head.Data), sealAt)
		}
		loaded, err := Read(ctx, c, run, DefaultMaxRawBytes)
		if err != nil {
			t.Fatal(err)
		}
		sameState(t, rec.State, loaded.State)
	})

	t.Run("a missing part is named", func(t *testing.T) {
		run := newRun(t)
		rec := twoOutputs(t)
		if err := New(c, c, scheme, Limits{}).Save(ctx, run, rec); err != nil {
			t.Fatal(err)
		}
		gone := partName(run.Name, rec.segments[0].Index+1)
		if err := c.Delete(ctx, &toolnexusv1alpha1.AgentRunRecord{ObjectMeta: metav1.ObjectMeta{Namespace: run.Namespace, Name: gone}}); err != nil {
			t.Fatal(err)
		}
		_, err := New(c, c, scheme, Limits{}).Load(ctx, started(run))
		var bad *CorruptError
		if !errors.As(err, &bad) || !strings.Contains(err.Error(), "AgentRunRecord "+gone+" (part 2 of") ||
			!strings.Contains(err.Error(), "is gone") {
			t.Fatalf("loading with part %s deleted = %v, want a CorruptError naming it", gone, err)
		}
	})

	for name, tc := range map[string]struct {
		limits Limits
		record func(t *testing.T) *Record
		bound  Bound
		says   string
	}{
		"the run's compressed total": {
			limits: Limits{MaxBytes: 1 << 20}, record: twoOutputs, bound: BoundStored,
			says: "the 1 MiB compressed a run may store (--max-transcript-size)",
		},
		"the run's decoded total": {
			limits: Limits{MaxRawBytes: 2 << 20}, record: twoOutputs, bound: BoundDecoded,
			says: "the 2 MiB decoded a run may hold (--max-transcript-decoded-size)",
		},
		"one object": {
			record: func(t *testing.T) *Record {
				return &Record{State: state.New("dump it"),
					Agent: &AgentSnapshot{Name: "big", Spec: []byte(`{"systemPrompt":"` + incompressible(t, 1<<20) + `"}`)}}
			},
			bound: BoundObject, says: "the 768 KiB one AgentRunRecord may hold",
		},
	} {
		t.Run("passing "+name+" is named", func(t *testing.T) {
			run := newRun(t)
			err := New(c, c, scheme, tc.limits).Save(ctx, run, tc.record(t))
			var tl *TooLargeError
			if !errors.As(err, &tl) || tl.Bound != tc.bound || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("save = %v, want a TooLargeError of bound %s saying %q", err, tc.bound, tc.says)
			}
			if objs := records(t, c, run); len(objs) > 0 {
				t.Errorf("%d AgentRunRecords were written", len(objs))
			}
		})
	}
}

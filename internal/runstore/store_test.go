package runstore

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	mathrand "math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// testRun is a run that has not started, as the API server shows it.
func testRun() *toolnexusv1alpha1.AgentRun {
	return &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Name: "deploy", Namespace: "tenant", UID: "run-uid", Generation: 1},
		Spec:       toolnexusv1alpha1.AgentRunSpec{Prompt: "ship it"},
	}
}

// started is run as its status shows it once the record was saved.
func started(run *toolnexusv1alpha1.AgentRun) *toolnexusv1alpha1.AgentRun {
	run = run.DeepCopy()
	run.Status.StartTime = &metav1.Time{}
	return run
}

// incompressible is n bytes of base64 of random bytes: what gzip cannot shrink below 3/4.
func incompressible(t testing.TB, n int) string {
	t.Helper()
	raw := make([]byte, n*3/4+3)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(raw)[:n]
}

func fakeClient(t testing.TB, objs ...client.Object) client.WithWatch {
	t.Helper()
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
}

func newStore(c client.Client, limits Limits) *Store { return New(c, c, c.Scheme(), limits) }

// sameState fails t unless got holds what want does.
func sameState(t testing.TB, want, got *state.State) {
	t.Helper()
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("the record read back differs (-saved +read):\n%.2000s", diff)
	}
}

// records lists the run's AgentRunRecords, and fails t if one holds more than an object may.
func records(t testing.TB, c client.Reader, run *toolnexusv1alpha1.AgentRun) map[string]*toolnexusv1alpha1.AgentRunRecord {
	t.Helper()
	var list toolnexusv1alpha1.AgentRunRecordList
	if err := c.List(context.Background(), &list, client.InNamespace(run.Namespace)); err != nil {
		t.Fatal(err)
	}
	out := map[string]*toolnexusv1alpha1.AgentRunRecord{}
	for i := range list.Items {
		r := &list.Items[i]
		if len(r.Data) > toolnexusv1alpha1.MaxRecordDataBytes {
			t.Errorf("AgentRunRecord %s holds %d bytes, more than %d", r.Name, len(r.Data), toolnexusv1alpha1.MaxRecordDataBytes)
		}
		if r.Run.UID == string(run.UID) {
			out[r.Name] = r
		}
	}
	return out
}

// A record this process wrote or read is read again as "not older than" that version (from the API
// server's watch cache); one it never saw, or whose save failed, from etcd; and a run whose status
// says it never started, not at all: its first save creates the head, and finds one that exists.
func TestLoadReadsWhatItMust(t *testing.T) {
	run := testRun()
	const none = "no read"
	var reads []string // the resourceVersion each read of the head asked for
	conflict := false
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(run).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*toolnexusv1alpha1.AgentRunRecord); ok {
				o := &client.GetOptions{}
				o.ApplyOptions(opts)
				rv := ""
				if o.Raw != nil {
					rv = o.Raw.ResourceVersion
				}
				reads = append(reads, rv)
			}
			return c.Get(ctx, key, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if conflict {
				return apierrors.NewConflict(recordsResource, obj.GetName(), nil)
			}
			return c.Update(ctx, obj, opts...)
		},
	}).Build()
	ctx := context.Background()
	var s *Store
	restart := func() { s = newStore(c, Limits{}) }
	load := func(run *toolnexusv1alpha1.AgentRun, want string) *Record {
		t.Helper()
		reads = nil
		rec, err := s.Load(ctx, run)
		if err != nil {
			t.Fatal(err)
		}
		if (want == none && len(reads) > 0) || (want != none && (len(reads) != 1 || reads[0] != want)) {
			t.Fatalf("the head was read asking for resourceVersions %q, want %q", reads, want)
		}
		return rec
	}
	save := func(run *toolnexusv1alpha1.AgentRun, rec *Record) {
		t.Helper()
		if err := s.Save(ctx, run, rec); err != nil {
			t.Fatal(err)
		}
	}

	restart()
	rec := load(run, none) // never started: not read
	if rec.Started() {
		t.Fatal("a record before the first save")
	}
	save(run, rec)
	created := rec.Head.ResourceVersion
	rec = load(run, created) // as this process wrote it, or newer
	save(run, rec)
	if rec.Head.ResourceVersion == created {
		t.Fatal("the update kept the resourceVersion")
	}
	rec = load(run, rec.Head.ResourceVersion)

	conflict = true
	if err := s.Save(ctx, run, rec); !apierrors.IsConflict(err) {
		t.Fatalf("save = %v, want a conflict", err)
	}
	conflict = false
	rec = load(run, "") // another writer may have moved it on: from etcd
	load(run, rec.Head.ResourceVersion)

	restart()
	load(started(run), "") // started, new to this process: from etcd

	restart()
	rec = load(run, none) // the status does not show the start an earlier process saved
	// A reconcile that waits before saving (a Secret is missing) checks before it reports.
	if err := s.CheckUnread(ctx, run, rec); !apierrors.IsConflict(err) {
		t.Fatalf("checking a record taken for new that an earlier process saved = %v, want a conflict", err)
	}
	restart()
	rec = load(run, none)
	if err := s.Save(ctx, run, rec); !apierrors.IsConflict(err) {
		t.Fatalf("creating the head over this run's = %v, want a conflict", err)
	}
	if rec = load(run, ""); !rec.Started() || len(rec.State.Messages) == 0 {
		t.Fatalf("after the conflict the record the earlier process saved was not read: %+v", rec)
	}

	restart()
	again := run.DeepCopy()
	again.UID = "a-new-run-of-that-name"
	rec = load(again, none)
	// A stale copy of a deleted run (again, to a cache that lags) never deletes the record of the
	// run that exists under the name.
	if err := s.Save(ctx, again, rec); err == nil || !strings.Contains(err.Error(), "belongs to run "+run.Name+" (uid run-uid)") {
		t.Fatalf("saving over the record of a run that exists = %v, want a mismatch naming it", err)
	}
	if err := c.Delete(ctx, run); err != nil {
		t.Fatal(err)
	}
	restart()
	rec = load(again, none)
	save(again, rec) // replaces the record the deleted run left
	if rec.Head.Run.UID != string(again.UID) {
		t.Fatalf("the head names run uid %s, want %s", rec.Head.Run.UID, again.UID)
	}
	// Segments are read not older than the head as it was found: another writer may have moved it
	// past the version this process saw, and the segments it refers to were written before it.
	rng := mathrand.New(mathrand.NewPCG(1, 2))
	for len(rec.segments) == 0 {
		addTurn(rec.State, rng, benchText(rng, 32<<10))
		save(again, rec)
	}
	seen := rec.Head.ResourceVersion
	moved := rec.Head.DeepCopy()
	moved.Labels = map[string]string{"backup": "done"}
	if err := c.Update(ctx, moved); err != nil {
		t.Fatal(err)
	}
	reads = nil
	if rec, err = s.Load(ctx, again); err != nil {
		t.Fatal(err)
	}
	want := []string{seen}
	for range rec.segments {
		want = append(want, moved.ResourceVersion)
	}
	if diff := cmp.Diff(want, reads); diff != "" {
		t.Fatalf("the head and its segments were read asking for (-want +got):\n%s", diff)
	}

	fresh := again.DeepCopy()
	fresh.Name, fresh.UID = "new", "new-uid"
	rec = load(fresh, none)
	reads = nil
	if err := s.CheckUnread(ctx, fresh, rec); err != nil || len(reads) != 1 || reads[0] != "" {
		t.Fatalf("checking a new run's record = %v after reads %q, want one read from etcd", err, reads)
	}
	other := started(again)
	other.UID = "a-started-run"
	restart()
	if _, err := s.Load(ctx, other); err == nil || !strings.Contains(err.Error(), "belongs to run "+run.Name+" (uid a-new-run-of-that-name)") {
		t.Fatalf("a started run loading another run's record: %v", err)
	}
	// The plugin's reader refuses it the same way.
	if _, err := Read(ctx, c, other, DefaultMaxRawBytes); err == nil || !strings.Contains(err.Error(), "belongs to run "+run.Name) {
		t.Fatalf("reading another run's record: %v", err)
	}
}

// Two tool outputs of 1 MiB that do not compress pass what one object holds: their segment spans
// parts, the head stays within sealAt, and the record reads back whole, for the manager and for
// the plugin. So does a model response of 16 MiB when the run's bounds allow it.
func TestSaveSplitsWhatOneObjectCannotHold(t *testing.T) {
	ctx := context.Background()
	run := testRun()
	c := fakeClient(t, run)
	s := newStore(c, Limits{})
	rng := mathrand.New(mathrand.NewPCG(3, 4))
	rec := &Record{State: state.New(run.Spec.Prompt)}
	addTurn(rec.State, rng, incompressible(t, 1<<20))
	addTurn(rec.State, rng, incompressible(t, 1<<20))
	if err := s.Save(ctx, run, rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.segments) != 1 || rec.segments[0].parts() < 2 || rec.spill != nil {
		t.Fatalf("segments %+v, spill %+v: want one segment in parts and no spill", rec.segments, rec.spill)
	}
	if n := len(rec.Head.Data); n > sealAt {
		t.Fatalf("the head holds %d bytes, past %d", n, sealAt)
	}
	if got, want := len(records(t, c, run)), 1+rec.segments[0].parts(); got != want {
		t.Fatalf("%d AgentRunRecords, want the head and %d parts", got, want-1)
	}
	loaded, err := newStore(c, Limits{}).Load(ctx, started(run))
	if err != nil {
		t.Fatal(err)
	}
	sameState(t, rec.State, loaded.State)
	read, err := Read(ctx, c, run, DefaultMaxRawBytes)
	if err != nil {
		t.Fatal(err)
	}
	sameState(t, rec.State, read.State)

	// The final answer of a 16 MiB response is held twice, as the message and as the run's text:
	// past the default decoded total, named as such, and stored whole when the bound allows it.
	answer := incompressible(t, 16<<20)
	rec.State.Turn++
	rec.State.Messages = append(rec.State.Messages, state.Message{Role: state.RoleAssistant, Content: answer})
	rec.State.Status, rec.State.Text = state.StatusDone, answer
	var tl *TooLargeError
	if err := s.Save(ctx, run, rec); !errors.As(err, &tl) || tl.Bound != BoundDecoded {
		t.Fatalf("saving a final answer of 16 MiB within the default bounds = %v, want the decoded total named", err)
	}
	s = newStore(c, Limits{MaxRawBytes: 40 << 20})
	if err := s.Save(ctx, run, rec); err != nil {
		t.Fatalf("saving a final answer of 16 MiB within a decoded total of 40 MiB: %v", err)
	}
	if len(rec.segments) != 2 || rec.segments[1].Index != rec.segments[0].last()+1 || rec.spill == nil {
		t.Fatalf("segments %+v, spill %+v: want a second segment after the first, and the text spilled", rec.segments, rec.spill)
	}
	records(t, c, run)
	if loaded, err = newStore(c, Limits{MaxRawBytes: 40 << 20}).Load(ctx, started(run)); err != nil {
		t.Fatal(err)
	}
	sameState(t, rec.State, loaded.State)
}

// bigTurn is a state whose current turn holds two finished calls with 1 MiB of output that does
// not compress, and one call that waits for an answer.
func bigTurn(t testing.TB, prompt string) *state.State {
	st := state.New(prompt)
	st.Turn = 1
	st.Messages = append(st.Messages, state.Message{Role: state.RoleAssistant, ToolCalls: []state.MessageToolCall{
		{ID: "c1", Name: "dump", Arguments: "{}"}, {ID: "c2", Name: "dump", Arguments: "{}"}, {ID: "c3", Name: "ask", Arguments: "{}"}}})
	st.Calls = []state.Call{
		{ID: "c1", Name: "dump", Arguments: "{}", Phase: state.PhaseDone, Result: &wire.ToolResult{Output: incompressible(t, 1<<20)}},
		{ID: "c2", Name: "dump", Arguments: "{}", Phase: state.PhaseDone, Result: &wire.ToolResult{Output: incompressible(t, 1<<20)}},
		{ID: "c3", Name: "ask", Arguments: "{}", Args: "{}", Phase: state.PhaseSuspended, Request: &wire.Request{ID: "r3", Kind: "input", Prompt: "Which?"}},
	}
	return st
}

// finishTurn answers bigTurn's last call and ends the turn as the loop does: the results become
// the transcript's tool messages.
func finishTurn(st *state.State) {
	st.Calls[2].Phase, st.Calls[2].Result = state.PhaseDone, &wire.ToolResult{Output: "eu-west"}
	for _, c := range st.Calls {
		st.Messages = append(st.Messages, state.Message{Role: state.RoleTool, ToolCallID: c.ID, Content: c.Result.Output})
		st.ToolCalls = append(st.ToolCalls, state.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments, Output: c.Result.Output, Turn: st.Turn})
	}
	st.ToolCallCount += len(st.Calls)
	st.Calls = nil
}

// A turn whose finished calls hold more than the head may, while another call waits, moves the
// state into a spill: the head stays small, the record reads back whole, and once the turn is
// over the spill is dropped and its parts deleted.
func TestSaveSpillsTheCallsOfABigTurn(t *testing.T) {
	ctx := context.Background()
	run := testRun()
	c := fakeClient(t, run)
	s := newStore(c, Limits{})
	rec := &Record{State: bigTurn(t, run.Spec.Prompt)}
	if err := s.Save(ctx, run, rec); err != nil {
		t.Fatal(err)
	}
	if rec.spill == nil || rec.spill.parts() < 2 || len(rec.Head.Data) > sealAt {
		t.Fatalf("spill %+v, head of %d bytes: want a spill in parts and a head within %d", rec.spill, len(rec.Head.Data), sealAt)
	}
	spill := *rec.spill
	loaded, err := newStore(c, Limits{}).Load(ctx, started(run))
	if err != nil {
		t.Fatal(err)
	}
	sameState(t, rec.State, loaded.State)

	// The answer is saved on the record as loaded: the state still does not fit, a new spill
	// past the one the saved head names replaces it.
	loaded.State.Calls[2].Answer = &wire.Answer{ID: "r3", OK: true}
	loaded.State.Calls[2].Phase = state.PhaseAnswered
	if err := s.Save(ctx, run, loaded); err != nil {
		t.Fatal(err)
	}
	if loaded.spill == nil || loaded.spill.Index <= spill.last() {
		t.Fatalf("the new spill %+v does not follow the saved one %+v", loaded.spill, spill)
	}
	objs := records(t, c, run)
	for i := spill.Index; i <= spill.last(); i++ {
		if objs[partName(run.Name, i)] != nil {
			t.Errorf("part %s of the dropped spill is left", partName(run.Name, i))
		}
	}
	spill = *loaded.spill

	finishTurn(loaded.State)
	if err := s.Save(ctx, run, loaded); err != nil {
		t.Fatal(err)
	}
	// The first spill sealed the messages before it (the prompt and the turn's calls).
	if n := len(loaded.segments); loaded.spill != nil || n != 2 || loaded.segments[1].Index <= spill.last() {
		t.Fatalf("spill %+v, segments %+v: want no spill and a second segment past the spill the saved head named", loaded.spill, loaded.segments)
	}
	objs = records(t, c, run)
	if got, want := len(objs), 2+loaded.segments[1].parts(); got != want {
		t.Errorf("%d AgentRunRecords are left, want the head and the segments' %d parts", got, want-1)
	}
	again, err := newStore(c, Limits{}).Load(ctx, started(run))
	if err != nil {
		t.Fatal(err)
	}
	sameState(t, loaded.State, again.State)
}

// A part that is missing, out of order or not the run's is named, and the run fails closed.
func TestLoadNamesTheDamagedPart(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		damage     func(t *testing.T, c client.Client, parts []*toolnexusv1alpha1.AgentRunRecord)
		reason     string
		mentioning []string
	}{
		"a part is gone": {
			damage: func(t *testing.T, c client.Client, parts []*toolnexusv1alpha1.AgentRunRecord) {
				if err := c.Delete(ctx, parts[1]); err != nil {
					t.Fatal(err)
				}
			},
			reason:     toolnexusv1alpha1.ReasonStateMismatch,
			mentioning: []string{"AgentRunRecord deploy.seg-2 (part 2 of", "of the segment deploy.seg-1) of the run's record is gone"},
		},
		"two parts swapped": {
			damage: func(t *testing.T, c client.Client, parts []*toolnexusv1alpha1.AgentRunRecord) {
				parts[0].Data, parts[1].Data = parts[1].Data, parts[0].Data
				for _, p := range parts[:2] {
					if err := c.Update(ctx, p); err != nil {
						t.Fatal(err)
					}
				}
			},
			reason:     toolnexusv1alpha1.ReasonTranscriptCorrupt,
			mentioning: []string{"parts of the segment deploy.seg-1", "out of order"},
		},
		"a part at another index": {
			damage: func(t *testing.T, c client.Client, parts []*toolnexusv1alpha1.AgentRunRecord) {
				parts[1].Index = 7
				if err := c.Update(ctx, parts[1]); err != nil {
					t.Fatal(err)
				}
			},
			reason:     toolnexusv1alpha1.ReasonStateMismatch,
			mentioning: []string{"AgentRunRecord deploy.seg-2 is not part 2 of"},
		},
		"a part of another run": {
			damage: func(t *testing.T, c client.Client, parts []*toolnexusv1alpha1.AgentRunRecord) {
				parts[2].Run.UID = "other"
				if err := c.Update(ctx, parts[2]); err != nil {
					t.Fatal(err)
				}
			},
			reason:     toolnexusv1alpha1.ReasonStateMismatch,
			mentioning: []string{"AgentRunRecord deploy.seg-3 is not part 3 of"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			run := testRun()
			c := fakeClient(t, run)
			rng := mathrand.New(mathrand.NewPCG(5, 6))
			rec := &Record{State: state.New(run.Spec.Prompt)}
			addTurn(rec.State, rng, incompressible(t, 1<<20))
			addTurn(rec.State, rng, incompressible(t, 1<<20))
			if err := newStore(c, Limits{}).Save(ctx, run, rec); err != nil {
				t.Fatal(err)
			}
			if rec.segments[0].parts() < 3 {
				t.Fatalf("the segment has %d parts, the test needs 3", rec.segments[0].parts())
			}
			objs := records(t, c, run)
			var parts []*toolnexusv1alpha1.AgentRunRecord
			for i := 1; i <= rec.segments[0].last(); i++ {
				parts = append(parts, objs[partName(run.Name, i)])
			}
			tc.damage(t, c, parts)
			_, loadErr := newStore(c, Limits{}).Load(ctx, started(run))
			_, readErr := Read(ctx, c, run, DefaultMaxRawBytes)
			for who, err := range map[string]error{"the manager": loadErr, "the plugin": readErr} {
				var bad *CorruptError
				if !errors.As(err, &bad) || bad.Reason != tc.reason {
					t.Fatalf("%s read %v, want a CorruptError with reason %s", who, err, tc.reason)
				}
				for _, m := range tc.mentioning {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("%s read %q, want it to mention %q", who, err, m)
					}
				}
			}
		})
	}
}

// Every bound a save can hit is named, with its numbers, and nothing is written.
func TestSaveNamesTheBoundItHits(t *testing.T) {
	ctx := context.Background()
	rng := mathrand.New(mathrand.NewPCG(7, 8))
	for name, tc := range map[string]struct {
		limits Limits
		record func(t *testing.T) *Record
		want   TooLargeError
		says   []string
	}{
		"the run's compressed total": {
			limits: Limits{MaxBytes: 1 << 20},
			record: func(t *testing.T) *Record {
				rec := &Record{State: state.New("x")}
				addTurn(rec.State, rng, incompressible(t, 1<<20))
				addTurn(rec.State, rng, incompressible(t, 1<<20))
				return rec
			},
			want: TooLargeError{Bound: BoundStored, Limit: 1 << 20},
			says: []string{"more than the 1 MiB compressed a run may store (--max-transcript-size)"},
		},
		"the run's decoded total": {
			limits: Limits{MaxRawBytes: 1 << 20},
			record: func(t *testing.T) *Record {
				rec := &Record{State: state.New("x")}
				addTurn(rec.State, rng, strings.Repeat("a", 2<<20))
				return rec
			},
			want: TooLargeError{Bound: BoundDecoded, Limit: 1 << 20},
			says: []string{"more than the 1 MiB decoded a run may hold (--max-transcript-decoded-size)"},
		},
		"one object": {
			record: func(t *testing.T) *Record {
				spec, err := json.Marshal(map[string]string{"systemPrompt": incompressible(t, 1<<20)})
				if err != nil {
					t.Fatal(err)
				}
				return &Record{State: state.New("x"), Agent: &AgentSnapshot{Name: "big", Spec: spec}}
			},
			want: TooLargeError{Bound: BoundObject, Limit: toolnexusv1alpha1.MaxRecordDataBytes, Object: "deploy"},
			says: []string{"head AgentRunRecord deploy needs", "more than the 768 KiB one AgentRunRecord may hold"},
		},
		"the record's last index": {
			record: func(t *testing.T) *Record {
				rec := &Record{State: state.New("x")}
				addTurn(rec.State, rng, incompressible(t, 512<<10))
				rec.segments = []SegmentRef{{Blob: Blob{Name: partName("deploy", maxIndex), Index: maxIndex}, Messages: 1}}
				return rec
			},
			want: TooLargeError{Bound: BoundIndex, Need: maxIndex + 1, Limit: maxIndex, Object: "deploy.seg-100001"},
			says: []string{"AgentRunRecord deploy.seg-100001 at index 100001, past 100000"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			run := testRun()
			c := fakeClient(t, run)
			err := newStore(c, tc.limits).Save(ctx, run, tc.record(t))
			var tl *TooLargeError
			if !errors.As(err, &tl) {
				t.Fatalf("save = %v, want a TooLargeError", err)
			}
			if tc.want.Need == 0 {
				tc.want.Need = tl.Need
			}
			if diff := cmp.Diff(&tc.want, tl); diff != "" || tl.Need <= tl.Limit {
				t.Errorf("save = %q (-want +got):\n%s", err, diff)
			}
			for _, m := range tc.says {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("save = %q, want it to say %q", err, m)
				}
			}
			if objs := records(t, c, run); len(objs) > 0 {
				t.Errorf("%d AgentRunRecords were written", len(objs))
			}
		})
	}
}

// gzipped encodes raw JSON as a record part's data.
func gzipped(t *testing.T, raw string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write([]byte(raw)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A record as the manager wrote it before parts could span objects (segments named by their
// place, no index, parts or digest) loads, and the next seal goes on after its last segment.
func TestLoadReadsRecordsWrittenBeforeParts(t *testing.T) {
	ctx := context.Background()
	run := testRun()
	c := fakeClient(t, run)
	s := newStore(c, Limits{})
	st := state.New(run.Spec.Prompt)
	rng := mathrand.New(mathrand.NewPCG(9, 10))
	for range 3 {
		addTurn(st, rng, benchText(rng, 100))
	}
	raw := func(v any) string {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	headState := *st
	headState.Messages, headState.ToolCalls = st.Messages[5:], st.ToolCalls[2:]
	seg1 := gzipped(t, `{"messages":`+raw(st.Messages[:3])+`,"toolCalls":`+raw(st.ToolCalls[:1])+`}`)
	seg2 := gzipped(t, `{"messages":`+raw(st.Messages[3:5])+`,"toolCalls":`+raw(st.ToolCalls[1:2])+`}`)
	head := gzipped(t, `{"state":`+raw(&headState)+`,"segments":[`+
		`{"name":"deploy.seg-1","messages":3,"toolCalls":1,"bytes":`+raw(len(seg1))+`,"rawBytes":1},`+
		`{"name":"deploy.seg-2","messages":2,"toolCalls":1,"bytes":`+raw(len(seg2))+`,"rawBytes":1}]}`)
	for n, data := range [][]byte{head, seg1, seg2} {
		obj, err := s.object(run, n, data)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	rec, err := s.Load(ctx, started(run))
	if err != nil {
		t.Fatal(err)
	}
	sameState(t, st, rec.State)
	for rec.segments[len(rec.segments)-1].Index == 2 {
		addTurn(rec.State, rng, benchText(rng, 64<<10))
		if err := s.Save(ctx, run, rec); err != nil {
			t.Fatal(err)
		}
	}
	if got := rec.segments[2].Blob; got.Index != 3 || got.Name != "deploy.seg-3" {
		t.Fatalf("the next segment is %+v, want deploy.seg-3 at index 3", got)
	}
	again, err := newStore(c, Limits{}).Load(ctx, started(run))
	if err != nil {
		t.Fatal(err)
	}
	sameState(t, rec.State, again.State)
}

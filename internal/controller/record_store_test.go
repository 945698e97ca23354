package controller

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

// A record this process wrote or read is read again as "not older than" that version (from the API
// server's watch cache); one it never saw, or whose save failed, from etcd; and a run whose status
// says it never started, not at all: its first save creates the head, and finds one that exists.
func TestLoadRecordReadsWhatItMust(t *testing.T) {
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	run := decisionRun(toolnexusv1alpha1.OnTimeoutDecline)
	const none = "no read"
	var reads []string // the resourceVersion each read of the head asked for
	conflict := false
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
				return apierrors.NewConflict(toolnexusv1alpha1.GroupVersion.WithResource("agentrunrecords").GroupResource(), obj.GetName(), nil)
			}
			return c.Update(ctx, obj, opts...)
		},
	}).Build()
	ctx := context.Background()
	var r *AgentRunReconciler
	restart := func() { r = &AgentRunReconciler{Client: c, APIReader: c, Scheme: scheme, steps: newSteps()} }
	load := func(run *toolnexusv1alpha1.AgentRun, want string) *runRecord {
		t.Helper()
		reads = nil
		rec, err := r.loadRecord(ctx, run, nil)
		if err != nil {
			t.Fatal(err)
		}
		if (want == none && len(reads) > 0) || (want != none && (len(reads) != 1 || reads[0] != want)) {
			t.Fatalf("the head was read asking for resourceVersions %q, want %q", reads, want)
		}
		return rec
	}
	save := func(run *toolnexusv1alpha1.AgentRun, rec *runRecord) {
		t.Helper()
		if err := r.saveRecord(ctx, run, rec); err != nil {
			t.Fatal(err)
		}
	}

	restart()
	rec := load(run, none) // never started: not read
	if rec.started() {
		t.Fatal("a record before the first save")
	}
	save(run, rec)
	created := rec.head.ResourceVersion
	rec = load(run, created) // as this process wrote it, or newer
	save(run, rec)
	if rec.head.ResourceVersion == created {
		t.Fatal("the update kept the resourceVersion")
	}
	rec = load(run, rec.head.ResourceVersion)

	conflict = true
	if err := r.saveRecord(ctx, run, rec); !apierrors.IsConflict(err) {
		t.Fatalf("save = %v, want a conflict", err)
	}
	conflict = false
	rec = load(run, "") // another writer may have moved it on: from etcd
	load(run, rec.head.ResourceVersion)

	restart()
	started := run.DeepCopy()
	started.Status.StartTime = &metav1.Time{Time: decisionNow}
	load(started, "") // started, new to this process: from etcd

	restart()
	rec = load(run, none) // the status does not show the start an earlier process saved
	// A reconcile that waits before saving (a Secret is missing) checks before it reports.
	if err := r.checkUnread(ctx, run, rec); !apierrors.IsConflict(err) {
		t.Fatalf("checking a record taken for new that an earlier process saved = %v, want a conflict", err)
	}
	restart()
	rec = load(run, none)
	if err := r.saveRecord(ctx, run, rec); !apierrors.IsConflict(err) {
		t.Fatalf("creating the head over this run's = %v, want a conflict", err)
	}
	if rec = load(run, ""); !rec.started() || len(rec.State.Messages) == 0 {
		t.Fatalf("after the conflict the record the earlier process saved was not read: %+v", rec)
	}

	restart()
	again := run.DeepCopy()
	again.UID = "a-new-run-of-that-name"
	rec = load(again, none)
	// A stale copy of a deleted run (again, to a cache that lags) never deletes the record of the
	// run that exists under the name.
	if err := r.saveRecord(ctx, again, rec); err == nil || !strings.Contains(err.Error(), "belongs to run "+run.Name+" (uid run-uid)") {
		t.Fatalf("saving over the record of a run that exists = %v, want a mismatch naming it", err)
	}
	if err := c.Delete(ctx, run); err != nil {
		t.Fatal(err)
	}
	restart()
	rec = load(again, none)
	save(again, rec) // replaces the record the deleted run left
	if rec.head.Run.UID != string(again.UID) {
		t.Fatalf("the head names run uid %s, want %s", rec.head.Run.UID, again.UID)
	}
	// Segments are read not older than the head as it was found: another writer may have moved it
	// past the version this process saw, and the segments it refers to were written before it.
	rng := rand.New(rand.NewPCG(1, 2))
	for len(rec.segments) == 0 {
		addTurn(rec.State, rng, 32<<10)
		save(again, rec)
	}
	seen := rec.head.ResourceVersion
	moved := rec.head.DeepCopy()
	moved.Labels = map[string]string{"backup": "done"}
	if err := c.Update(ctx, moved); err != nil {
		t.Fatal(err)
	}
	reads = nil
	if rec, err = r.loadRecord(ctx, again, nil); err != nil {
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
	if err := r.checkUnread(ctx, fresh, rec); err != nil || len(reads) != 1 || reads[0] != "" {
		t.Fatalf("checking a new run's record = %v after reads %q, want one read from etcd", err, reads)
	}
	other := again.DeepCopy()
	other.UID, other.Status.StartTime = "a-started-run", &metav1.Time{Time: decisionNow}
	restart()
	if _, err := r.loadRecord(ctx, other, nil); err == nil || !strings.Contains(err.Error(), "belongs to run "+run.Name+" (uid a-new-run-of-that-name)") {
		t.Fatalf("a started run loading another run's record: %v", err)
	}
}

package controller

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/testenv"
)

// A record this process wrote or read is read again as "not older than" that version (from the API
// server's watch cache); a record it never saw, or one whose save failed, from etcd.
func TestLoadRecordReadsNotOlderThanWhatItSaw(t *testing.T) {
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	run := decisionRun(toolnexusv1alpha1.OnTimeoutDecline)
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
	r := &AgentRunReconciler{Client: c, APIReader: c, Scheme: scheme, steps: newSteps()}
	ctx := context.Background()
	load := func(want string) *runRecord {
		t.Helper()
		reads = nil
		rec, err := r.loadRecord(ctx, run, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(reads) != 1 || reads[0] != want {
			t.Fatalf("the head was read asking for resourceVersion %q, want one read asking for %q", reads, want)
		}
		return rec
	}

	rec := load("") // never seen: from etcd
	if rec.started() {
		t.Fatal("a record before the first save")
	}
	rec.State = loop.NewState(run.Spec.Prompt)
	if err := r.saveRecord(ctx, run, rec); err != nil {
		t.Fatal(err)
	}
	created := rec.head.ResourceVersion
	rec = load(created) // as this process wrote it, or newer
	if err := r.saveRecord(ctx, run, rec); err != nil {
		t.Fatal(err)
	}
	if rec.head.ResourceVersion == created {
		t.Fatal("the update kept the resourceVersion")
	}
	rec = load(rec.head.ResourceVersion)

	conflict = true
	if err := r.saveRecord(ctx, run, rec); !apierrors.IsConflict(err) {
		t.Fatalf("save = %v, want a conflict", err)
	}
	conflict = false
	rec = load("") // another writer moved it on: from etcd
	load(rec.head.ResourceVersion)

	other := *run
	other.UID = "another-run-of-that-name"
	reads = nil
	if rec, err := r.loadRecord(ctx, &other, nil); err != nil || rec.started() {
		t.Fatalf("a new run of the same name loaded the earlier run's record: %v", err)
	}
	if len(reads) != 1 || reads[0] != "" {
		t.Fatalf("a run of the same name with another uid read asking for %q, want etcd", reads)
	}
}

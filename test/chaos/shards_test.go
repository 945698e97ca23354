//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

const (
	shardRuns  = 24
	shardKills = 3
)

// chaosShards runs two shards, a and b, each a leader-elected manager of its own namespace's
// runs. Shard a is SIGKILLed mid-run again and again; its runs all finish exactly as the kills
// test demands, and shard b, never killed, finishes its own runs and writes nothing of shard a's
// (nor a of b's): every write is attributed by its field manager, the name each shard's binary
// runs under.
func chaosShards(t *testing.T, cl *cluster, bin, logs string, model *fakeModel, tools *fakeTools, ans *answerer) {
	const leases = "chaos-shards-system"
	cl.namespace(t, leases)
	shards := []string{"a", "b"}
	managers := map[string]*supervised{}
	for _, shard := range shards {
		ns := "chaos-shard-" + shard
		if err := cl.client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: ns, Labels: map[string]string{toolnexusv1alpha1.ShardLabel: shard}}}); err != nil {
			t.Fatal(err)
		}
		ans.enabled.Store(ns, true)
		// The API server names a write's field manager after the client's program name.
		named := filepath.Join(filepath.Dir(bin), "manager-shard-"+shard)
		if err := os.Symlink(bin, named); err != nil {
			t.Fatal(err)
		}
		managers[shard] = supervise(t, "shard-"+shard, named, logs, "--kubeconfig="+cl.kubeconfig, "--shard="+shard,
			"--leader-elect", "--leader-election-namespace="+leases)
	}
	for _, shard := range shards {
		if err := managers[shard].waitReady(60 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// Each shard leads by its own lease: both start their controllers, neither waits for the other.
	deadline := time.Now().Add(60 * time.Second)
	for managers["a"].count(t, "Starting workers") == 0 || managers["b"].count(t, "Starting workers") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("both shards should lead at once:\n%s\n%s", managers["a"].tail(t, 20), managers["b"].tail(t, 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
	var list coordinationv1.LeaseList
	if err := cl.client.List(context.Background(), &list, client.InNamespace(leases)); err != nil {
		t.Fatal(err)
	}
	var held []string
	for _, l := range list.Items {
		held = append(held, l.Name)
	}
	if want := []string{"toolnexus-operator-shard-a.toolnexus.dev", "toolnexus-operator-shard-b.toolnexus.dev"}; fmt.Sprint(held) != fmt.Sprint(want) {
		t.Errorf("leases %v, want %v", held, want)
	}

	phaseStart := time.Now()
	for i := range shardRuns {
		for _, shard := range shards {
			// As toolnexus-shard-stamp labels a run from its namespace (config/policies; this
			// cluster has no admission policies installed).
			run := newRun("chaos-shard-"+shard, fmt.Sprintf("s%s-%02d", shard, i), model.URL, tools.URL)
			run.Labels = map[string]string{toolnexusv1alpha1.ShardLabel: shard}
			if err := cl.client.Create(context.Background(), run); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Shard a is killed while it leads and steps runs: a killed leader keeps its lease until the
	// lease expires, so each new process first waits to take it over.
	const leaseA = "toolnexus-operator-shard-a.toolnexus.dev"
	kills, killedHolder := 0, ""
	for kills < shardKills {
		deadline := time.Now().Add(90 * time.Second)
		holder := leaseHolder(t, cl.client, leases, leaseA)
		for holder == "" || holder == killedHolder {
			if time.Now().After(deadline) {
				t.Fatalf("shard a did not lead again within 90s after kill %d:\n%s", kills, managers["a"].tail(t, 40))
			}
			time.Sleep(200 * time.Millisecond)
			holder = leaseHolder(t, cl.client, leases, leaseA)
		}
		// Soon after it leads, while it catches up with the answers given meanwhile.
		time.Sleep(time.Duration(300+rand.IntN(1200)) * time.Millisecond)
		if unfinished(t, cl.client, "chaos-shard-a") == 0 {
			break
		}
		managers["a"].kill()
		kills++
		killedHolder = holder
	}
	if kills < 2 {
		t.Fatalf("shard a finished its runs after %d kills: too few to prove anything", kills)
	}
	figuresOf := map[string]figures{}
	for _, shard := range shards {
		ns := "chaos-shard-" + shard
		runs := waitTerminal(t, cl.client, ns, shardRuns, 4*time.Minute)
		waitResolved(cl.client, ns, 30*time.Second)
		figuresOf[shard] = verify(t, cl.client, model, tools, ns, runs)
		if panics := managers[shard].count(t, "panic"); panics > 0 {
			t.Errorf("shard %s's log mentions a panic %d times", shard, panics)
		}
	}
	total := time.Since(phaseStart)

	for _, shard := range shards {
		other := "b"
		if shard == "b" {
			other = "a"
		}
		own, foreign := writersOf(t, cl.client, "chaos-shard-"+shard, "manager-shard-"+shard, "manager-shard-"+other)
		if own == 0 {
			t.Errorf("no object of chaos-shard-%s was written by manager-shard-%s: the attribution checks nothing", shard, shard)
		}
		for _, obj := range foreign {
			t.Errorf("%s of shard %s was written by shard %s", obj, shard, other)
		}
	}
	startsA, killsA, crashesA := managers["a"].stats()
	startsB, _, crashesB := managers["b"].stats()
	if startsB != 1 || crashesB != 0 {
		t.Errorf("shard b started %d times and exited %d times by itself; it was never killed", startsB, crashesB)
	}
	if crashesA != 0 {
		t.Errorf("shard a exited %d times the test did not cause", crashesA)
	}
	t.Logf("CHAOS shards: %d runs per shard; shard a SIGKILLed %d times (%d starts), shard b untouched (%d start); all terminal after %s",
		shardRuns, killsA, startsA, startsB, total.Round(time.Second))
	for _, shard := range shards {
		f := figuresOf[shard]
		t.Logf("CHAOS shards: shard %s: %d tool calls, %d suspended (%d approved, %d declined); duplicates: %d tool executions, %d answer retries, %d repeated model turns",
			shard, f.calls, f.suspended, f.approved, f.declined, f.toolDuplicates, f.answerDuplicates, f.repeatedTurns)
	}
}

// leaseHolder is who holds the lease name of ns now, "" when nobody does yet.
func leaseHolder(t *testing.T, c client.Client, ns, name string) string {
	var l coordinationv1.Lease
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &l); err != nil {
		if apierrors.IsNotFound(err) {
			return ""
		}
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// unfinished counts the runs of ns that are not terminal.
func unfinished(t *testing.T, c client.Client, ns string) int {
	var list toolnexusv1alpha1.AgentRunList
	if err := c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range list.Items {
		if !terminal(r.Status.Phase) {
			n++
		}
	}
	return n
}

// writersOf counts the AgentRuns, PendingRequests and AgentRunRecords of ns that own wrote
// (by their managed fields' manager), and names those foreign wrote.
func writersOf(t *testing.T, c client.Client, ns, own, foreign string) (int, []string) {
	t.Helper()
	var objs []client.Object
	var runs toolnexusv1alpha1.AgentRunList
	var reqs toolnexusv1alpha1.PendingRequestList
	var recs toolnexusv1alpha1.AgentRunRecordList
	for _, l := range []client.ObjectList{&runs, &reqs, &recs} {
		if err := c.List(context.Background(), l, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range runs.Items {
		objs = append(objs, &runs.Items[i])
	}
	for i := range reqs.Items {
		objs = append(objs, &reqs.Items[i])
	}
	for i := range recs.Items {
		objs = append(objs, &recs.Items[i])
	}
	ownWrites, foreignWrites := 0, []string{}
	for _, o := range objs {
		for _, e := range o.GetManagedFields() {
			switch e.Manager {
			case own:
				ownWrites++
			case foreign:
				foreignWrites = append(foreignWrites, fmt.Sprintf("%T %s", o, o.GetName()))
			}
		}
	}
	return ownWrites, foreignWrites
}

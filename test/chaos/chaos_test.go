//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

const (
	runCount = 100
	minKills = 20
	// declineReason is what the answerer says when it declines.
	declineReason = "no thanks"
)

// cluster is the control plane the test owns: the API server can be stopped and started again
// while etcd keeps the data.
type cluster struct {
	env        *envtest.Environment
	client     client.Client
	kubeconfig string
}

func startCluster(t *testing.T, dir string) *cluster {
	t.Helper()
	env, err := testenv.New()
	if err != nil {
		t.Fatal(err)
	}
	// A directory of our own keeps the API server's serving certificate across a restart (envtest
	// generates a new CA in a directory it allocated), so clients keep trusting it.
	certDir := filepath.Join(dir, "apiserver")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	env.ControlPlane.APIServer = &envtest.APIServer{CertDir: certDir}
	// A stopping API server waits for its open watches (the manager's among them) for over 20s;
	// three seconds of grace, then SIGKILL, is closer to the crash this test is about.
	env.ControlPlaneStopTimeout = 3 * time.Second
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := testenv.WriteKubeconfig(env, envtest.User{Name: "chaos-admin", Groups: []string{"system:masters"}}, dir)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{env: env, client: c, kubeconfig: kubeconfig}
}

// restartAPIServer stops the API server, keeps it down for downtime, and starts it again. It gets
// ControlPlaneStopTimeout to shut down gracefully before envtest SIGKILLs it.
func (c *cluster) restartAPIServer(t *testing.T, downtime time.Duration) {
	api := c.env.ControlPlane.APIServer
	t0 := time.Now()
	if err := api.Stop(); err != nil && !strings.Contains(err.Error(), "timeout waiting for process") {
		t.Errorf("stopping the API server: %v", err)
	}
	stopped := time.Since(t0)
	time.Sleep(downtime)
	t1 := time.Now()
	if err := api.Start(); err != nil {
		t.Fatalf("starting the API server again: %v", err)
	}
	t.Logf("API server: stopped in %s, kept down %s, healthy again %s after its start",
		stopped.Round(100*time.Millisecond), downtime, time.Since(t1).Round(100*time.Millisecond))
}

func (c *cluster) namespace(t *testing.T, name string) {
	t.Helper()
	if err := c.client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
}

func newRun(ns, name, modelURL, toolsURL string) *toolnexusv1alpha1.AgentRun {
	return &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "chaos " + name, AgentSpec: toolnexusv1alpha1.AgentSpec{
			Model:    toolnexusv1alpha1.ModelSpec{Name: "chaos-model", BaseURL: modelURL},
			MaxTurns: 10,
			Tools: []toolnexusv1alpha1.ToolSpec{{
				Name: "work", Description: "does some work, sometimes after an approval",
				Parameters: &apiextensionsv1.JSON{Raw: []byte(`{"type":"object","properties":{"run":{"type":"string"},"call":{"type":"string"}}}`)},
				HTTP:       &toolnexusv1alpha1.HTTPToolSpec{URL: toolsURL + "/work"},
			}},
		}},
	}
}

// approves is the answerer's decision for a request: about 70% are approved.
func approves(name string) bool { return hash("answer/"+name)%10 < 7 }

// answerer answers every PendingRequest of the namespaces it is enabled for, after a random
// delay, the way a person or a bot would with kubectl patch. It retries through API outages.
type answerer struct {
	c       client.Client
	enabled sync.Map // namespace → true
	mu      sync.Mutex
	due     map[string]time.Time
	patched atomic.Int32
	errors  atomic.Int32
}

func (a *answerer) run(ctx context.Context) {
	a.due = map[string]time.Time{}
	for ctx.Err() == nil {
		var list toolnexusv1alpha1.PendingRequestList
		if err := a.c.List(ctx, &list); err != nil {
			a.errors.Add(1)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		now := time.Now()
		for i := range list.Items {
			p := &list.Items[i]
			if _, on := a.enabled.Load(p.Namespace); !on || p.Status.Answer != nil {
				continue
			}
			a.mu.Lock()
			due, seen := a.due[p.Namespace+"/"+p.Name]
			if !seen {
				due = now.Add(time.Duration(100+rand.IntN(2400)) * time.Millisecond)
				a.due[p.Namespace+"/"+p.Name] = due
			}
			a.mu.Unlock()
			if now.Before(due) {
				continue
			}
			body := `{"status":{"answer":{"ok":true}}}`
			if !approves(p.Name) {
				body = fmt.Sprintf(`{"status":{"answer":{"ok":false,"reason":%q}}}`, declineReason)
			}
			if err := a.c.Status().Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(body))); err != nil {
				a.errors.Add(1)
				continue
			}
			a.patched.Add(1)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func terminal(phase toolnexusv1alpha1.RunPhase) bool {
	return phase == toolnexusv1alpha1.RunPhaseSucceeded || phase == toolnexusv1alpha1.RunPhaseFailed ||
		phase == toolnexusv1alpha1.RunPhaseIncomplete
}

// waitTerminal waits until every run of ns is terminal, and returns them.
func waitTerminal(t *testing.T, c client.Client, ns string, want int, timeout time.Duration) []toolnexusv1alpha1.AgentRun {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var open []string
	for time.Now().Before(deadline) {
		var list toolnexusv1alpha1.AgentRunList
		if err := c.List(context.Background(), &list, client.InNamespace(ns)); err == nil && len(list.Items) == want {
			open = nil
			for _, r := range list.Items {
				if !terminal(r.Status.Phase) {
					open = append(open, fmt.Sprintf("%s (%s)", r.Name, r.Status.Phase))
				}
			}
			if len(open) == 0 {
				return list.Items
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("runs of %s not terminal after %s: %v", ns, timeout, open)
	return nil
}

// waitResolved waits until every PendingRequest of ns is Resolved, for at most timeout: the
// manager writes a request's conditions apart from its run's status, so a terminal run does not
// mean its requests are up to date yet. It does not fail the test; verify reports what is not
// Resolved.
func waitResolved(c client.Client, ns string, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		var reqs toolnexusv1alpha1.PendingRequestList
		if err := c.List(context.Background(), &reqs, client.InNamespace(ns)); err == nil {
			resolved := 0
			for _, p := range reqs.Items {
				if meta.IsStatusConditionTrue(p.Status.Conditions, toolnexusv1alpha1.ConditionResolved) {
					resolved++
				}
			}
			if resolved == len(reqs.Items) {
				return
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// figures are what a verification counted.
type figures struct {
	calls, suspended, approved, declined int
	// toolDuplicates are first executions beyond one per call; answerDuplicates are retries with
	// the answer beyond one per approved call. Both are at-least-once re-executions, with the
	// same Idempotency-Key as the execution they repeat.
	toolDuplicates, answerDuplicates int
	// repeatedTurns are model requests beyond one per run and turn.
	repeatedTurns int
}

// verify checks the loop rule and the durability guarantees (README, docs/design.md) on finished runs: each ended Succeeded with the
// model's final text; the model's last conversation holds exactly one result per call, and it is
// the one the answer implies (so every answer was consumed exactly once: an approval ran the tool
// with the answer, a decline never did); each suspended call has exactly one PendingRequest, and
// no other call has one; the tool saw every call, with the answer header only on the retry.
func verify(t *testing.T, c client.Client, model *fakeModel, tools *fakeTools, ns string, runs []toolnexusv1alpha1.AgentRun) figures {
	t.Helper()
	var reqs toolnexusv1alpha1.PendingRequestList
	if err := c.List(context.Background(), &reqs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	byCall := map[string][]toolnexusv1alpha1.PendingRequest{}
	for _, p := range reqs.Items {
		k := p.Spec.RunRef.Name + "/" + p.Spec.ToolCall.ID
		byCall[k] = append(byCall[k], p)
	}
	first, retried := tools.counts()
	model.mu.Lock()
	defer model.mu.Unlock()
	var f figures
	for _, run := range runs {
		name := run.Name
		if run.Status.Phase != toolnexusv1alpha1.RunPhaseSucceeded || run.Status.Text != "done "+name {
			c := meta.FindStatusCondition(run.Status.Conditions, toolnexusv1alpha1.ConditionSucceeded)
			t.Errorf("%s ended %s with text %q (condition %+v)", name, run.Status.Phase, run.Status.Text, c)
			continue
		}
		final := model.final[name]
		p := planFor(name)
		if want := len(p.turns) + 1; int(run.Status.Turns) != want {
			t.Errorf("%s took %d turns, want %d", name, run.Status.Turns, want)
		}
		seen := 0
		for turn, n := range p.turns {
			for j := 1; j <= n; j++ {
				call := callID(turn+1, j)
				key := name + "/" + call
				idem := string(run.UID) + "/" + call
				f.calls++
				seen++
				preqs := byCall[key]
				want := "result " + call
				switch {
				case suspends(name, call):
					f.suspended++
					if len(preqs) != 1 {
						t.Errorf("%s: %d PendingRequests, want exactly one", key, len(preqs))
						continue
					}
					preq := preqs[0]
					if preq.Spec.Request.Prompt != approvalPrompt(name, call) {
						t.Errorf("%s: request prompt %q", key, preq.Spec.Request.Prompt)
					}
					a := preq.Status.Answer
					if a == nil {
						t.Errorf("%s: %s was never answered", key, preq.Name)
						continue
					}
					if r := meta.FindStatusCondition(preq.Status.Conditions, toolnexusv1alpha1.ConditionResolved); r == nil || r.Status != metav1.ConditionTrue {
						t.Errorf("%s: %s is not Resolved: %+v", key, preq.Name, r)
					}
					if a.OK {
						f.approved++
						want = "approved " + call
						if retried[idem] < 1 {
							t.Errorf("%s: approved, but the tool never ran with the answer", key)
						}
						f.answerDuplicates += max(retried[idem]-1, 0)
					} else {
						f.declined++
						want = "declined/expired: " + approvalPrompt(name, call) + "\nreason: " + declineReason
						if retried[idem] != 0 {
							t.Errorf("%s: declined, but the tool ran %d times with an answer", key, retried[idem])
						}
					}
				default:
					if len(preqs) != 0 {
						t.Errorf("%s: the call never suspended but has %d PendingRequests", key, len(preqs))
					}
					if retried[idem] != 0 {
						t.Errorf("%s: ran %d times with an answer it never asked for", key, retried[idem])
					}
				}
				if first[idem] < 1 {
					t.Errorf("%s: the tool never saw the call", key)
				}
				f.toolDuplicates += max(first[idem]-1, 0)
				if got, ok := final[call]; !ok || got != want {
					t.Errorf("%s: the model was sent %q, want %q", key, got, want)
				}
			}
		}
		if len(final) != seen {
			t.Errorf("%s: the model saw %d results, want %d", name, len(final), seen)
		}
		for turn := 1; turn <= len(p.turns)+1; turn++ {
			n := model.turnRequests[fmt.Sprintf("%s/%d", name, turn)]
			if n < 1 {
				t.Errorf("%s: turn %d never reached the model", name, turn)
			}
			f.repeatedTurns += max(n-1, 0)
		}
	}
	for k, ps := range byCall {
		if !suspends(strings.SplitN(k, "/", 2)[0], strings.SplitN(k, "/", 2)[1]) {
			t.Errorf("PendingRequest %s for %s, a call that never suspended", ps[0].Name, k)
		}
	}
	for _, p := range model.problems {
		t.Errorf("model: %s", p)
	}
	tools.mu.Lock()
	for _, p := range tools.problems {
		t.Errorf("tools: %s", p)
	}
	tools.mu.Unlock()
	return f
}

// TestChaos runs 100 runs through a manager that is SIGKILLed at least 20 times at random moments
// and an API server that is restarted once, then fails a leader-elected pair over, then kills one
// of two shards mid-run.
func TestChaos(t *testing.T) {
	start := time.Now()
	tmp := t.TempDir()
	logs := filepath.Join(tmp, "logs")
	if dir := os.Getenv("CHAOS_LOG_DIR"); dir != "" {
		logs = dir
	}
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	var bin string
	var buildErr error
	built := make(chan struct{})
	go func() { defer close(built); bin, buildErr = buildManager(tmp) }()
	cl := startCluster(t, tmp)
	<-built
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	t.Logf("control plane up and manager built after %s", time.Since(start).Round(time.Second))

	model, tools := startFakeModel(t), startFakeTools(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ans := &answerer{c: cl.client}
	go ans.run(ctx)

	t.Run("kills", func(t *testing.T) { chaosKills(t, cl, bin, logs, model, tools, ans) })
	t.Run("leader election", func(t *testing.T) { chaosLeaderElection(t, cl, bin, logs, model, tools, ans) })
	t.Run("shards", func(t *testing.T) { chaosShards(t, cl, bin, logs, model, tools, ans) })
	t.Logf("chaos done after %s; manager logs in %s", time.Since(start).Round(time.Second), logs)
}

func chaosKills(t *testing.T, cl *cluster, bin, logs string, model *fakeModel, tools *fakeTools, ans *answerer) {
	const ns = "chaos"
	cl.namespace(t, ns)
	ans.enabled.Store(ns, true)
	mgr := supervise(t, "manager", bin, logs, "--kubeconfig="+cl.kubeconfig, "--max-concurrent-reconciles=8")
	if err := mgr.waitReady(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	phaseStart := time.Now()

	var created atomic.Int32
	go func() {
		for i := range runCount {
			run := newRun(ns, fmt.Sprintf("run-%03d", i), model.URL, tools.URL)
			for cl.client.Create(context.Background(), run) != nil {
				time.Sleep(200 * time.Millisecond) // the API server may be restarting
			}
			created.Add(1)
			time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
		}
	}()

	var apiDowntime time.Duration
	kills := 0
	for kills < minKills || created.Load() < runCount {
		if err := mgr.waitReady(90 * time.Second); err != nil {
			t.Fatalf("%v\n%s", err, mgr.tail(t, 40))
		}
		time.Sleep(time.Duration(500+rand.IntN(2000)) * time.Millisecond)
		if kills == minKills/2 {
			t0 := time.Now()
			cl.restartAPIServer(t, 3*time.Second)
			apiDowntime = time.Since(t0)
			t.Logf("API server restarted after kill %d: down for %s", kills, apiDowntime.Round(100*time.Millisecond))
		}
		mgr.kill()
		kills++
	}
	killPhase := time.Since(phaseStart)
	runs := waitTerminal(t, cl.client, ns, runCount, 3*time.Minute)
	total := time.Since(phaseStart)
	waitResolved(cl.client, ns, 30*time.Second)
	f := verify(t, cl.client, model, tools, ns, runs)
	starts, _, crashes := mgr.stats()
	panics := mgr.count(t, "panic")
	reconcileErrors, outageErrors := 0, 0
	for _, line := range strings.Split(mgr.logText(t), "\n") {
		if strings.Contains(line, "Reconciler error") {
			reconcileErrors++
			if strings.Contains(line, "connection refused") {
				outageErrors++
			}
		}
	}
	mgr.stop()
	if panics > 0 {
		t.Errorf("the manager log mentions a panic %d times", panics)
	}
	t.Logf("CHAOS kills: %d runs, %d SIGKILLs, %d manager starts, %d exits the test did not cause; API server restarted once (%s)",
		len(runs), kills, starts, crashes, apiDowntime.Round(100*time.Millisecond))
	t.Logf("CHAOS kills: %d tool calls, %d suspended (%d approved, %d declined); %d PendingRequests answered",
		f.calls, f.suspended, f.approved, f.declined, ans.patched.Load())
	t.Logf("CHAOS kills: at-least-once duplicates: %d tool executions, %d answer retries, %d repeated model turns; "+
		"%d reconciler errors logged, %d of them 'connection refused' while the API server was down",
		f.toolDuplicates, f.answerDuplicates, f.repeatedTurns, reconcileErrors, outageErrors)
	t.Logf("CHAOS kills: killing took %s, all runs terminal after %s", killPhase.Round(time.Second), total.Round(time.Second))
}

// chaosLeaderElection runs two leader-elected managers: only the leader starts its controller;
// when it is killed for good the other takes the lease over and the runs finish.
func chaosLeaderElection(t *testing.T, cl *cluster, bin, logs string, model *fakeModel, tools *fakeTools, ans *answerer) {
	const ns, leases = "chaos-le", "chaos-system"
	cl.namespace(t, ns)
	cl.namespace(t, leases)
	args := []string{"--kubeconfig=" + cl.kubeconfig, "--leader-elect", "--leader-election-namespace=" + leases}
	a := supervise(t, "replica-a", bin, logs, args...)
	b := supervise(t, "replica-b", bin, logs, args...)
	for _, m := range []*supervised{a, b} {
		if err := m.waitReady(60 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	const started = "Starting workers"
	var leader, follower *supervised
	deadline := time.Now().Add(60 * time.Second)
	for leader == nil && time.Now().Before(deadline) {
		switch na, nb := a.count(t, started), b.count(t, started); {
		case na > 0 && nb > 0:
			t.Fatalf("both replicas started their controllers")
		case na > 0:
			leader, follower = a, b
		case nb > 0:
			leader, follower = b, a
		}
		time.Sleep(200 * time.Millisecond)
	}
	if leader == nil {
		t.Fatalf("no replica became the leader:\n%s\n%s", a.tail(t, 20), b.tail(t, 20))
	}
	const n = 12
	for i := range n {
		if err := cl.client.Create(context.Background(), newRun(ns, fmt.Sprintf("le-%02d", i), model.URL, tools.URL)); err != nil {
			t.Fatal(err)
		}
	}
	// The leader takes every run to its first suspension (or its end) while nobody answers.
	waitParked := time.Now().Add(90 * time.Second)
	for {
		var list toolnexusv1alpha1.AgentRunList
		if err := cl.client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		parked := 0
		for _, r := range list.Items {
			if r.Status.Phase == toolnexusv1alpha1.RunPhaseSuspended || terminal(r.Status.Phase) {
				parked++
			}
		}
		if parked == n {
			break
		}
		if time.Now().After(waitParked) {
			t.Fatalf("only %d of %d runs parked or ended under the leader", parked, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := follower.count(t, started); got != 0 {
		t.Fatalf("the follower started its controller while the leader was alive")
	}
	killedAt := time.Now()
	leader.stop() // SIGKILL, and no restart: the lease is only given up by expiry
	ans.enabled.Store(ns, true)
	for follower.count(t, started) == 0 {
		if time.Since(killedAt) > 60*time.Second {
			t.Fatalf("the follower did not take over within 60s:\n%s", follower.tail(t, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
	takeover := time.Since(killedAt)
	runs := waitTerminal(t, cl.client, ns, n, 2*time.Minute)
	waitResolved(cl.client, ns, 30*time.Second)
	f := verify(t, cl.client, model, tools, ns, runs)
	if panics := follower.count(t, "panic"); panics > 0 {
		t.Errorf("the new leader's log mentions a panic %d times", panics)
	}
	t.Logf("CHAOS leader election: %d runs; the follower took over %s after the leader was SIGKILLed; all terminal after %s",
		len(runs), takeover.Round(100*time.Millisecond), time.Since(killedAt).Round(time.Second))
	t.Logf("CHAOS leader election: %d tool calls, %d suspended; duplicates: %d tool executions, %d answer retries, %d repeated model turns",
		f.calls, f.suspended, f.toolDuplicates, f.answerDuplicates, f.repeatedTurns)
}

package controller_test

import (
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/controller"
	"github.com/toolnexus/operator/internal/loop/looptest"
	"github.com/toolnexus/operator/internal/netguard"
	"github.com/toolnexus/operator/internal/testenv/operator"
	"github.com/toolnexus/operator/internal/tools/toolstest"
)

// sentBy records where one manager's model and tool traffic went, so a spec can tell which shard
// stepped a run.
type sentBy struct {
	next http.RoundTripper
	mu   sync.Mutex
	urls []string
}

func (s *sentBy) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.urls = append(s.urls, r.URL.String())
	s.mu.Unlock()
	return s.next.RoundTrip(r)
}

// to counts the requests sent under base (a fake server's URL).
func (s *sentBy) to(base string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, u := range s.urls {
		if strings.HasPrefix(u, base+"/") {
			n++
		}
	}
	return n
}

// startShard runs a manager of shard next to the suite's unsharded one, until the spec ends.
func startShard(shard string) (*operator.Manager, *sentBy) {
	sent := &sentBy{next: netguard.Config{}.Client().Transport}
	m := operator.New(GinkgoT(), cfg, func() controller.Options {
		return controller.Options{Registry: prometheus.NewRegistry(), MaxConcurrentReconciles: 2, MaxTranscriptBytes: 4 << 20,
			Shard: shard, HTTPClient: &http.Client{Transport: sent}}
	})
	m.Start(GinkgoT())
	DeferCleanup(m.Stop)
	return m, sent
}

// shardAdmin is the kubeconfig of a cluster administrator, written for each spec of shards.
var shardAdmin string

// shardKubectl runs kubectl as a cluster administrator, as the procedure of moving a namespace
// between shards (README) is written.
func shardKubectl(args ...string) {
	out, err := exec.Command(testEnv.Kubectl(), append([]string{"--kubeconfig", shardAdmin}, args...)...).CombinedOutput()
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), string(out))
}

// shardedRun is a run of namespace ns, which belongs to shard, labelled as toolnexus-shard-stamp
// labels it (config/policies, not installed in this suite), that parks on one approval.
func shardedRun(ns, name, shard string) (*toolnexusv1alpha1.AgentRun, *looptest.Server, *toolstest.Server) {
	shardKubectl("label", "namespace", ns, toolnexusv1alpha1.ShardLabel+"="+shard, "--overwrite")
	ts := approvalServer()
	model := looptest.New(GinkgoT(),
		looptest.OpenAIToolCalls(looptest.ToolCall{ID: "call_1", Name: "approve", Arguments: "{}"}),
		looptest.OpenAIText("approved and done"))
	run := newRun(ns, name, model.URL, ts, "approve")
	run.Labels = map[string]string{toolnexusv1alpha1.ShardLabel: shard}
	Expect(k8sClient.Create(ctx, run)).To(Succeed())
	return run, model, ts
}

// shardOf is the shard label of every PendingRequest and AgentRunRecord of run, by object.
func shardOf(run *toolnexusv1alpha1.AgentRun) map[string]string {
	out := map[string]string{}
	var reqs toolnexusv1alpha1.PendingRequestList
	Expect(k8sClient.List(ctx, &reqs, client.InNamespace(run.Namespace))).To(Succeed())
	for _, p := range reqs.Items {
		out["preq/"+p.Name] = p.Labels[toolnexusv1alpha1.ShardLabel]
	}
	var recs toolnexusv1alpha1.AgentRunRecordList
	Expect(k8sClient.List(ctx, &recs, client.InNamespace(run.Namespace))).To(Succeed())
	for _, r := range recs.Items {
		out["arrec/"+r.Name] = r.Labels[toolnexusv1alpha1.ShardLabel]
	}
	return out
}

func resolved(run *toolnexusv1alpha1.AgentRun, name string) func() bool {
	return func() bool {
		p := &toolnexusv1alpha1.PendingRequest{}
		Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: run.Namespace, Name: name}, p)).To(Succeed())
		return meta.IsStatusConditionTrue(p.Status.Conditions, toolnexusv1alpha1.ConditionResolved)
	}
}

var _ = Describe("Shards", func() {
	var (
		ns     string
		shardA *operator.Manager
		sentA  *sentBy
		sentB  *sentBy
	)
	BeforeEach(func() {
		ns, shardAdmin = newNamespace(), adminKubeconfig()
		shardA, sentA = startShard("a")
		_, sentB = startShard("b")
	})

	It("keeps a shard's run, its requests and its records to the shard's manager", func() {
		run, model, ts := shardedRun(ns, "held", "a")
		reqs := waitSuspended(run, 1)
		Expect(shardOf(run)).To(Equal(map[string]string{"preq/" + reqs[0].Name: "a", "arrec/held": "a"}),
			"the manager labels what it creates for a run with the run's shard")
		Expect(reqs[0].Labels).To(HaveKeyWithValue(toolnexusv1alpha1.RunLabel, "held"))
		Expect(sentA.to(model.URL)).To(Equal(1))
		Expect(sentA.to(ts.URL)).To(Equal(1))

		By("with shard a stopped, neither shard b nor the unsharded manager takes the answer")
		Expect(shardA.Stop()).To(Succeed())
		answer(&reqs[0], `{"ok":true}`)
		Consistently(func() int { return len(ts.Calls()) }, 3*time.Second, 100*time.Millisecond).Should(Equal(1))
		Expect(getRun(run).Status.Phase).To(Equal(toolnexusv1alpha1.RunPhaseSuspended))
		Expect(resolved(run, reqs[0].Name)()).To(BeFalse())

		By("shard a, started again, finishes it")
		shardA.Start(GinkgoT())
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Eventually(resolved(run, reqs[0].Name), eventually).Should(BeTrue())
		Expect(ts.Calls()).To(HaveLen(2), "the call ran again with its answer, once")
		Expect(sentA.to(model.URL)).To(Equal(2))
		Expect(sentA.to(ts.URL)).To(Equal(2))
		Expect(sentB.to(model.URL)+sentB.to(ts.URL)).To(BeZero(), "shard b never stepped shard a's run")
	})

	It("moves a parked run to another shard with its requests and records, where it finishes", func() {
		run, model, ts := shardedRun(ns, "moved", "a")
		reqs := waitSuspended(run, 1)
		Expect(sentA.to(model.URL)).To(Equal(1))

		By("relabelling the namespace, then its runs, requests and records (README)")
		shardKubectl("label", "namespace", ns, toolnexusv1alpha1.ShardLabel+"=b", "--overwrite")
		shardKubectl("label", "ar,preq,arrec", "-n", ns, "--all", toolnexusv1alpha1.ShardLabel+"=b", "--overwrite")
		answer(&reqs[0], `{"ok":true}`)
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("approved and done"))
		Eventually(resolved(run, reqs[0].Name), eventually).Should(BeTrue())
		Expect(ts.Calls()).To(HaveLen(2), "the call ran again with its answer, once")
		Expect(ts.Calls()[1].Answer).NotTo(BeNil())
		Expect(sentB.to(ts.URL)).To(Equal(1), "shard b made the answered call")
		Expect(sentB.to(model.URL)).To(Equal(1), "shard b asked the model for the last turn")
		Expect(sentA.to(model.URL)).To(Equal(1), "shard a stopped at the move")
		Expect(sentA.to(ts.URL)).To(Equal(1))
		Expect(shardOf(run)).To(HaveEach("b"))
	})

	It("aborts a step in flight on the old shard when its run moves, and takes it again on the new one", func() {
		shardKubectl("label", "namespace", ns, toolnexusv1alpha1.ShardLabel+"=a")
		model := newGatedModel(looptest.OpenAIText("from shard a"), looptest.OpenAIText("from shard b"))
		arrived, _ := model.hold(1)
		run := newRun(ns, "in-flight", model.URL, nil)
		run.Labels = map[string]string{toolnexusv1alpha1.ShardLabel: "a"}
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Eventually(arrived, eventually).Should(BeClosed(), "shard a's model request is in flight")

		shardKubectl("label", "namespace", ns, toolnexusv1alpha1.ShardLabel+"=b", "--overwrite")
		shardKubectl("label", "ar,preq,arrec", "-n", ns, "--all", toolnexusv1alpha1.ShardLabel+"=b", "--overwrite")
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(getRun(run).Status.Text).To(Equal("from shard b"))
		Eventually(model.aborted.Load, eventually).Should(BeEquivalentTo(1), "shard a aborted its model request when the run left it")
		Expect(sentA.to(model.URL)).To(Equal(1))
		Expect(sentB.to(model.URL)).To(Equal(1))
	})

	It("leaves runs without a shard to the manager started without --shard", func() {
		stopManager()
		DeferCleanup(func() {
			if toolnexus.Done() == nil {
				startManager()
			}
		})
		ts := approvalServer()
		model := looptest.New(GinkgoT(), looptest.OpenAIText("done"))
		run := newRun(ns, "unsharded", model.URL, ts)
		Expect(k8sClient.Create(ctx, run)).To(Succeed())
		Consistently(func() int { return len(model.Requests()) }, 2*time.Second, 100*time.Millisecond).Should(BeZero(),
			"no shard runs a run without the label")
		startManager()
		Eventually(phaseOf(run), eventually).Should(Equal(toolnexusv1alpha1.RunPhaseSucceeded))
		Expect(model.Requests()).To(HaveLen(1))
		Expect(sentA.to(model.URL) + sentB.to(model.URL)).To(BeZero())
		rec := &toolnexusv1alpha1.AgentRunRecord{}
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(run), rec)).To(Succeed())
		Expect(rec.Labels).To(Equal(map[string]string{toolnexusv1alpha1.RunLabel: "unsharded"}))
	})
})

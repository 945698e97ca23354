// Command bench measures the operator against its targets (project issues 9, 15 and 26): resume
// latency, turn throughput and API writes per turn, the same workload through internal/loop in
// process as the baseline, the cost of thousands of parked runs; with models that take their
// time, wall time against the ideal, fairness between namespaces beside slow and hung endpoints,
// and thousands of active runs; and the hostile mix (huge replies, hung endpoints across
// namespaces, a Secret's annotation flood) against the manager's memory limit. It starts a local control plane (envtest), builds and runs the
// manager as a subprocess, drives it with model and tool servers on loopback, and prints a table;
// with -doc it also writes the figures into docs/benchmarks.md.
//
//	go run ./hack/bench -scenarios=resume,throughput,parked,slow,fairness,scale,hostile,policies
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/executor"
	"github.com/toolnexus/operator/internal/testenv"
)

type config struct {
	scenarios    map[string]bool
	policies     int
	workers      int
	resumeN      int
	resumeGap    time.Duration
	runs, turns  int
	rounds       int
	parked       int
	idle, settle time.Duration
	cpuProfile   string
	profileSecs  int
	heapProfile  string
	apiProfile   string
	// profileDuring names the workload the CPU profiles cover: resume, throughput, slow-<runs> or scale.
	profileDuring string
	doc           string
	managerArgs   []string
	keep          bool
	// maxInflight and perNamespace are the manager's executor bounds (its defaults, or what
	// -manager-args sets).
	maxInflight, perNamespace int

	slowRuns           []int
	slowTurns          int
	slowDelay          time.Duration
	fairSlow, fairHung int
	fairDelay          time.Duration
	fairSamples        int
	fairGap            time.Duration
	scaleRuns          int
	scaleTurns         int
	scaleNamespaces    int
	scaleDelay         time.Duration
	scaleTimeout       time.Duration
	// goMemLimit is the manager's GOMEMLIMIT; the hostile scenario measures its RSS against
	// memoryLimit, the Deployment's limit.
	goMemLimit  string
	memoryLimit int64

	hostileBig, hostileBigSize           int
	hostileHungNamespaces, hostileHung   int
	hostileParked, hostileAnnotates      int
	hostileTranscript                    int
	hostileFifthTimeout, hostileHungWait time.Duration
}

// harness is what every scenario shares.
type harness struct {
	cfg     config
	rest    *rest.Config
	c       client.WithWatch
	mgr     *manager
	model   *modelServer
	tools   *toolServer
	results *results
}

func main() {
	var c config
	var scenarios, managerArgs, slowRuns string
	flag.StringVar(&scenarios, "scenarios", "resume,throughput,parked,slow,fairness,scale,hostile,policies",
		"Comma-separated scenarios: resume, throughput (with its in-process baseline), parked, slow, fairness, scale, hostile, policies.")
	flag.IntVar(&c.policies, "policies", 100, "policies: ApprovalPolicies installed for the throughput rounds that follow the rounds without any.")
	flag.IntVar(&c.workers, "max-concurrent-reconciles", 8, "The manager's --max-concurrent-reconciles.")
	flag.IntVar(&c.resumeN, "resume", 200, "Answers measured for resume latency (one run each, answered one at a time).")
	flag.DurationVar(&c.resumeGap, "resume-gap", 20*time.Millisecond, "Pause after a resumed run completes before the next answer.")
	flag.IntVar(&c.runs, "runs", 50, "Concurrent runs of the throughput workload.")
	flag.IntVar(&c.turns, "turns", 5, "Model turns per run of the throughput workload (turns-1 tool calls, then a final text).")
	flag.IntVar(&c.rounds, "rounds", 3, "Rounds of the throughput workload; the median is reported.")
	flag.IntVar(&c.parked, "parked", 5000, "Runs parked on one PendingRequest each.")
	flag.DurationVar(&c.idle, "idle", 60*time.Second, "How long the parked manager's CPU is measured.")
	flag.DurationVar(&c.settle, "settle", 10*time.Second, "Quiet time after the runs parked, before measuring.")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "Write a CPU profile of the manager during the -profile-during workload here.")
	flag.IntVar(&c.profileSecs, "profile-seconds", 20, "Length of the CPU profiles; throughput rounds repeat (uncounted) until they are done.")
	flag.StringVar(&c.apiProfile, "apiserver-cpuprofile", "", "Write a CPU profile of the kube-apiserver during the -profile-during workload here (-profile-seconds long).")
	flag.StringVar(&c.profileDuring, "profile-during", "throughput", "The workload -cpuprofile and -apiserver-cpuprofile cover: resume (its answers), throughput, slow-<runs> (e.g. slow-1000) or scale; they start with its first create.")
	flag.StringVar(&c.heapProfile, "heapprofile", "", "Write a heap profile of the manager with the runs parked here.")
	flag.StringVar(&c.doc, "doc", "", "Write the figures into this Markdown file (between the bench markers), e.g. docs/benchmarks.md.")
	flag.StringVar(&managerArgs, "manager-args", "", "Extra flags for the manager, space-separated.")
	flag.BoolVar(&c.keep, "keep", false, "Keep the temporary directory (manager log, kubeconfig).")
	flag.StringVar(&slowRuns, "slow-runs", "96,1000", "slow: comma-separated run counts, each measured in turn, spread over as many namespaces as the per-namespace bound needs.")
	flag.IntVar(&c.slowTurns, "slow-turns", 3, "slow: model turns per run.")
	flag.DurationVar(&c.slowDelay, "slow-delay", time.Second, "slow: how long the slow model takes to answer.")
	flag.IntVar(&c.fairSlow, "fairness-slow", 48, "fairness: runs on the slow model in their own namespace.")
	flag.DurationVar(&c.fairDelay, "fairness-delay", 5*time.Second, "fairness: how long the slow model takes to answer.")
	flag.IntVar(&c.fairHung, "fairness-hung", 16, "fairness: runs whose model never answers, in their own namespace.")
	flag.IntVar(&c.fairSamples, "fairness-samples", 9, "fairness: fast runs measured alone, beside the slow runs and beside the hung ones (one at a time).")
	flag.DurationVar(&c.fairGap, "fairness-gap", time.Second, "fairness: pause between two fast runs, so they sample the slow runs' whole life.")
	flag.IntVar(&c.scaleRuns, "scale", 5000, "scale: active runs on the slow model.")
	flag.IntVar(&c.scaleTurns, "scale-turns", 3, "scale: model turns per run.")
	flag.IntVar(&c.scaleNamespaces, "scale-namespaces", 20, "scale: namespaces the runs are spread over.")
	flag.DurationVar(&c.scaleDelay, "scale-delay", time.Second, "scale: how long the model takes to answer.")
	flag.DurationVar(&c.scaleTimeout, "scale-timeout", 15*time.Minute, "scale: the longest the runs may take; what is done by then is reported.")
	flag.StringVar(&c.goMemLimit, "manager-gomemlimit", "384MiB", "The manager's GOMEMLIMIT, as the manager sets it itself under config/manager's 512Mi limit (75%); empty runs it without.")
	var memoryLimitMiB int64
	flag.Int64Var(&memoryLimitMiB, "memory-limit", 512, "hostile: the Deployment's memory limit in MiB, that the manager's peak RSS is measured against.")
	flag.IntVar(&c.hostileBig, "hostile-big", 20, "hostile: runs in one namespace whose model answers each with -hostile-big-size of text.")
	flag.IntVar(&c.hostileBigSize, "hostile-big-size", 15<<20, "hostile: bytes of incompressible text in each big reply (the manager reads at most 16 MiB).")
	flag.IntVar(&c.hostileHungNamespaces, "hostile-hung-namespaces", 4, "hostile: namespaces whose runs' model accepts requests and never answers.")
	flag.IntVar(&c.hostileHung, "hostile-hung", 64, "hostile: hung runs in each of those namespaces (model.requestTimeout 10m).")
	flag.DurationVar(&c.hostileHungWait, "hostile-hung-wait", time.Minute, "hostile: how long to wait for the hung model to hold every hung run's request.")
	flag.DurationVar(&c.hostileFifthTimeout, "hostile-fifth-timeout", time.Minute, "hostile: how long a run in a fifth namespace may take beside the hung ones before it counts as not finished.")
	flag.IntVar(&c.hostileParked, "hostile-parked", 60, "hostile: parked runs referencing one Secret, each with a -hostile-transcript transcript.")
	flag.IntVar(&c.hostileTranscript, "hostile-transcript", 1<<20, "hostile: bytes of text in each parked run's transcript.")
	flag.IntVar(&c.hostileAnnotates, "hostile-annotates", 30, "hostile: annotations (metadata-only changes) of the Secret the parked runs reference.")
	flag.Parse()
	c.memoryLimit = memoryLimitMiB << 20
	c.scenarios = map[string]bool{}
	for _, s := range strings.Split(scenarios, ",") {
		if s = strings.TrimSpace(s); s != "" {
			c.scenarios[s] = true
		}
	}
	c.managerArgs = strings.Fields(managerArgs)
	for s := range c.scenarios {
		if !slices.Contains(scenarioNames, s) {
			fmt.Fprintf(os.Stderr, "bench: -scenarios: no scenario %q\n", s)
			os.Exit(2)
		}
	}
	for _, f := range strings.Split(slowRuns, ",") {
		if f = strings.TrimSpace(f); f != "" {
			n, err := strconv.Atoi(f)
			if err != nil || n <= 0 {
				fmt.Fprintf(os.Stderr, "bench: -slow-runs: %q is not a positive count\n", f)
				os.Exit(2)
			}
			c.slowRuns = append(c.slowRuns, n)
		}
	}
	c.maxInflight, c.perNamespace = inflightBounds(c.managerArgs)
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

func run(c config) error {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	dir, err := os.MkdirTemp("", "toolnexus-bench-")
	if err != nil {
		return err
	}
	if c.keep {
		logf("temporary directory %s", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	logf("building the manager")
	bin, err := buildManager(dir)
	if err != nil {
		return fmt.Errorf("building the manager: %w", err)
	}
	logf("starting the control plane (envtest)")
	env, err := testenv.New()
	if err != nil {
		return err
	}
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("starting envtest: %w", err)
	}
	defer func() { _ = env.Stop() }()
	admin, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kc, err := admin.KubeConfig()
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		return err
	}

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := toolnexusv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	hcfg := rest.CopyConfig(cfg)
	hcfg.QPS, hcfg.Burst = -1, 0 // the harness must never be the bottleneck
	wc, err := client.NewWithWatch(hcfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	h := &harness{cfg: c, rest: hcfg, c: wc, results: newResults(c)}
	if h.model, err = newModelServer(0); err != nil {
		return err
	}
	if h.tools, err = newToolServer(); err != nil {
		return err
	}

	logf("starting the manager (--max-concurrent-reconciles=%d %s; executor bounds %d total, %d per namespace; GOMEMLIMIT=%s)", c.workers,
		strings.Join(c.managerArgs, " "), c.maxInflight, c.perNamespace, c.goMemLimit)
	h.mgr, err = startManager(ctx, bin, kubeconfig, dir, c.workers, c.goMemLimit, c.managerArgs)
	if err != nil {
		return err
	}
	defer h.mgr.stop()
	if err := h.warmUp(ctx); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	h.results.load = loadAverage()

	for _, name := range scenarioNames {
		if !c.scenarios[name] {
			continue
		}
		if err := h.scenario(name)(ctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	h.results.managerErrors = h.mgr.errorLines()
	h.results.loadEnd = loadAverage()
	table := h.results.table()
	fmt.Println(table)
	if c.doc != "" {
		if err := h.results.writeDoc(c.doc, table); err != nil {
			return err
		}
		logf("wrote %s", c.doc)
	}
	return nil
}

// scenarioNames are what -scenarios selects from, in the order they run.
var scenarioNames = []string{"resume", "throughput", "parked", "slow", "fairness", "scale", "hostile", "policies"}

func (h *harness) scenario(name string) func(context.Context) error {
	return map[string]func(context.Context) error{"resume": h.resume, "throughput": h.throughput,
		"parked": h.parkedScale, "slow": h.slowModel, "fairness": h.fairness, "scale": h.scale, "hostile": h.hostile,
		"policies": h.policies}[name]
}

// inflightBounds are the manager's --max-inflight and --max-inflight-per-namespace: its defaults,
// or what args set (in the --flag=value form).
func inflightBounds(args []string) (total, perNamespace int) {
	total, perNamespace = executor.DefaultMaxInflight, executor.DefaultPerShare
	for _, a := range args {
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		n, err := strconv.Atoi(value)
		if !ok || err != nil {
			continue
		}
		switch name {
		case "max-inflight":
			total = n
		case "max-inflight-per-namespace":
			perNamespace = n
		}
	}
	return total, min(perNamespace, total)
}

// cleanup deletes what the runs of namespaces left (runs, requests, records), so that one
// scenario's objects do not weigh on the next (envtest runs no garbage collector).
func (h *harness) cleanup(ctx context.Context, namespaces ...string) error {
	for _, ns := range namespaces {
		for _, obj := range []client.Object{&toolnexusv1alpha1.AgentRun{}, &toolnexusv1alpha1.PendingRequest{}, &toolnexusv1alpha1.AgentRunRecord{}} {
			if err := h.c.DeleteAllOf(ctx, obj, client.InNamespace(ns)); err != nil {
				return fmt.Errorf("cleaning up %s: %w", ns, err)
			}
		}
	}
	return nil
}

func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// Command bench measures the operator against its targets (project issue 9): resume latency, turn
// throughput and API writes per turn, the same workload through internal/loop in process as the
// baseline, and the cost of thousands of parked runs. It starts a local control plane (envtest),
// builds and runs the manager as a subprocess, drives it with zero-latency model and tool
// servers, and prints a table; with -doc it also writes the figures into docs/benchmarks.md.
//
//	go run ./hack/bench -scenarios=resume,throughput,parked -parked=5000
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/testenv"
)

type config struct {
	scenarios    map[string]bool
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
	doc          string
	managerArgs  []string
	keep         bool
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
	var scenarios, managerArgs string
	flag.StringVar(&scenarios, "scenarios", "resume,throughput,parked", "Comma-separated scenarios: resume, throughput (with its in-process baseline), parked.")
	flag.IntVar(&c.workers, "max-concurrent-reconciles", 8, "The manager's --max-concurrent-reconciles.")
	flag.IntVar(&c.resumeN, "resume", 200, "Answers measured for resume latency (one run each, answered one at a time).")
	flag.DurationVar(&c.resumeGap, "resume-gap", 20*time.Millisecond, "Pause after a resumed run completes before the next answer.")
	flag.IntVar(&c.runs, "runs", 50, "Concurrent runs of the throughput workload.")
	flag.IntVar(&c.turns, "turns", 5, "Model turns per run of the throughput workload (turns-1 tool calls, then a final text).")
	flag.IntVar(&c.rounds, "rounds", 3, "Rounds of the throughput workload; the median is reported.")
	flag.IntVar(&c.parked, "parked", 5000, "Runs parked on one PendingRequest each.")
	flag.DurationVar(&c.idle, "idle", 60*time.Second, "How long the parked manager's CPU is measured.")
	flag.DurationVar(&c.settle, "settle", 10*time.Second, "Quiet time after the runs parked, before measuring.")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "Write a CPU profile of the manager during the throughput workload here.")
	flag.IntVar(&c.profileSecs, "profile-seconds", 20, "Length of the -cpuprofile; throughput rounds repeat (uncounted) until it is done.")
	flag.StringVar(&c.apiProfile, "apiserver-cpuprofile", "", "Write a CPU profile of the kube-apiserver during the throughput workload here (as long as -cpuprofile).")
	flag.StringVar(&c.heapProfile, "heapprofile", "", "Write a heap profile of the manager with the runs parked here.")
	flag.StringVar(&c.doc, "doc", "", "Write the figures into this Markdown file (between the bench markers), e.g. docs/benchmarks.md.")
	flag.StringVar(&managerArgs, "manager-args", "", "Extra flags for the manager, space-separated.")
	flag.BoolVar(&c.keep, "keep", false, "Keep the temporary directory (manager log, kubeconfig).")
	flag.Parse()
	c.scenarios = map[string]bool{}
	for _, s := range strings.Split(scenarios, ",") {
		if s = strings.TrimSpace(s); s != "" {
			c.scenarios[s] = true
		}
	}
	c.managerArgs = strings.Fields(managerArgs)
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
	if h.model, err = newModelServer(); err != nil {
		return err
	}
	if h.tools, err = newToolServer(); err != nil {
		return err
	}

	logf("starting the manager (--max-concurrent-reconciles=%d %s)", c.workers, strings.Join(c.managerArgs, " "))
	h.mgr, err = startManager(ctx, bin, kubeconfig, dir, c.workers, c.managerArgs)
	if err != nil {
		return err
	}
	defer h.mgr.stop()
	if err := h.warmUp(ctx); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	h.results.load = loadAverage()

	if c.scenarios["resume"] {
		if err := h.resume(ctx); err != nil {
			return fmt.Errorf("resume: %w", err)
		}
	}
	if c.scenarios["throughput"] {
		if err := h.throughput(ctx); err != nil {
			return fmt.Errorf("throughput: %w", err)
		}
	}
	if c.scenarios["parked"] {
		if err := h.parkedScale(ctx); err != nil {
			return fmt.Errorf("parked: %w", err)
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

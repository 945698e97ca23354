// Command flakes runs Go test packages several times, each run in a new random order, and counts
// how often each test failed: a plain test by its name, a Ginkgo suite by the spec that failed
// (from Ginkgo's JSON report), not by the one Go test that wraps all its specs.
//
// Run r (1..runs) uses the seed seed+r for `go test -shuffle` and, in Ginkgo suites only, for
// -ginkgo.seed with -ginkgo.randomize-all (every spec shuffled, not only top-level containers),
// so a failure is reproduced with the seed the summary prints. Exits 1 when any test failed.
//
//	go run ./hack/flakes -runs 10 ./api/... ./test/admission
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

const ginkgoImport = "github.com/onsi/ginkgo/v2"

// pkg is a package with tests.
type pkg struct {
	path   string
	ginkgo bool
}

// outcome is what one run of one package showed.
type outcome struct {
	run     int
	seed    int64
	pkg     pkg
	elapsed time.Duration
	// failed names the tests (or Ginkgo specs) that failed; when the package failed without
	// naming one (it did not build, crashed or timed out) it holds a placeholder.
	failed []string
	err    error
}

func main() {
	runs := flag.Int("runs", 10, "how many times to run every package")
	seed := flag.Int64("seed", 0, "run r uses seed+r; 0 picks one from the clock")
	parallel := flag.Int("p", 1, "packages to test at the same time")
	timeout := flag.Duration("timeout", 10*time.Minute, "go test -timeout for one package run")
	logs := flag.String("logs", "", "directory for each run's output (default: a new temporary directory)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: flakes [flags] [packages] (default ./...)\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	patterns := flag.Args()
	if len(patterns) == 0 {
		patterns = []string{"./..."}
	}
	if *seed == 0 {
		*seed = time.Now().UnixNano() % 1_000_000
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, patterns, *runs, *seed, *parallel, *timeout, *logs); err != nil {
		fmt.Fprintln(os.Stderr, "flakes:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, patterns []string, runs int, seed int64, parallel int, timeout time.Duration, logs string) error {
	pkgs, module, err := listPackages(patterns)
	if err != nil {
		return err
	}
	if len(pkgs) == 0 {
		return fmt.Errorf("no packages with tests in %s", strings.Join(patterns, " "))
	}
	if logs == "" {
		if logs, err = os.MkdirTemp("", "flakes-"); err != nil {
			return err
		}
	}
	fmt.Printf("flakes: %d runs of %d packages, seeds %d..%d, output in %s\n", runs, len(pkgs), seed+1, seed+int64(runs), logs)

	var outcomes []outcome
	for r := 1; r <= runs && ctx.Err() == nil; r++ {
		dir := filepath.Join(logs, fmt.Sprintf("run-%02d", r))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for _, o := range testAll(ctx, pkgs, r, seed+int64(r), parallel, timeout, dir) {
			short := strings.TrimPrefix(o.pkg.path, module+"/")
			status := "ok  "
			if len(o.failed) > 0 {
				status = "FAIL"
			}
			fmt.Printf("run %2d/%d seed %d  %s %s (%s)\n", r, runs, o.seed, status, short, o.elapsed.Round(100*time.Millisecond))
			for _, name := range o.failed {
				fmt.Printf("    failed: %s\n", name)
			}
			if o.err != nil {
				fmt.Printf("    %v\n", o.err)
			}
			outcomes = append(outcomes, o)
		}
	}
	if ctx.Err() != nil {
		fmt.Println("flakes: interrupted; the summary counts the runs that finished")
	}
	if summarize(os.Stdout, outcomes, module) {
		return errors.New("some tests failed")
	}
	return nil
}

// listPackages returns the packages of patterns that have tests, whether each is a Ginkgo suite,
// and the module path.
func listPackages(patterns []string) ([]pkg, string, error) {
	args := append([]string{"list", "-e", "-f",
		`{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{if .Module}}{{.Module.Path}}{{end}} {{join .TestImports " "}} {{join .XTestImports " "}}{{end}}`},
		patterns...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			err = fmt.Errorf("go list: %w: %s", err, exit.Stderr)
		}
		return nil, "", err
	}
	var pkgs []pkg
	module := ""
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		pkgs = append(pkgs, pkg{path: fields[0], ginkgo: slices.Contains(fields[2:], ginkgoImport)})
		module = fields[1]
	}
	return pkgs, module, nil
}

// testAll tests every package once with seed, parallel packages at a time, and returns the
// outcomes in package order.
func testAll(ctx context.Context, pkgs []pkg, r int, seed int64, parallel int, timeout time.Duration, dir string) []outcome {
	outcomes := make([]outcome, len(pkgs))
	sem := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	for i, p := range pkgs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			outcomes[i] = testOnce(ctx, p, r, seed, timeout, dir)
		})
	}
	wg.Wait()
	return outcomes
}

// testOnce runs go test -json on one package and names what failed.
func testOnce(ctx context.Context, p pkg, r int, seed int64, timeout time.Duration, dir string) outcome {
	o := outcome{run: r, seed: seed, pkg: p}
	base := filepath.Join(dir, strings.ReplaceAll(p.path, "/", "_"))
	report := base + ".ginkgo.json"
	args := []string{"test", "-count=1", "-json", fmt.Sprintf("-shuffle=%d", seed), "-timeout", timeout.String(), p.path}
	if p.ginkgo {
		// -args goes to the test binary: only Ginkgo suites know these flags.
		args = append(args, "-args", fmt.Sprintf("-ginkgo.seed=%d", seed), "-ginkgo.randomize-all",
			"-ginkgo.no-color", "-ginkgo.json-report="+report)
	}
	_ = os.Remove(report) // a report left by an earlier run in the same directory would mislead
	log, err := os.Create(base + ".log")
	if err != nil {
		o.err = err
		o.failed = []string{"(could not run)"}
		return o
	}
	defer log.Close()

	start := time.Now()
	cmd := exec.CommandContext(ctx, "go", args...)
	// On Ctrl-C, let go test stop its test binary (and the API servers it started) itself.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	cmd.Stderr = log
	stdout, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		o.err = err
		o.failed = []string{"(could not run)"}
		return o
	}
	ev := readEvents(stdout, log)
	runErr := cmd.Wait()
	o.elapsed = time.Since(start)

	o.failed = leaves(ev.failed)
	if p.ginkgo {
		specs, err := failedSpecs(report)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			o.err = err
		}
		if len(specs) > 0 {
			// The specs name what failed in the Go test that ran them; plain tests of the same
			// package stay as they are.
			o.failed = slices.DeleteFunc(o.failed, func(t string) bool { return ev.ranSpecs[t] })
			o.failed = append(o.failed, specs...)
		}
	}
	if len(o.failed) == 0 && (ev.pkgFailed || runErr != nil) {
		o.failed = []string{"(the package: it did not build, crashed or timed out)"}
		o.err = fmt.Errorf("see %s", log.Name())
	}
	return o
}

// event is a line of go test -json (test2json) output.
type event struct {
	Action string
	Test   string
	Output string
}

// events is what a package's go test -json output told.
type events struct {
	// failed are the tests that failed.
	failed []string
	// ranSpecs are the tests that ran a Ginkgo suite (they print "Ran N of M Specs").
	ranSpecs  map[string]bool
	pkgFailed bool
}

// readEvents copies the output of go test -json to log as plain text and reads what failed.
func readEvents(r io.Reader, log io.Writer) events {
	ev := events{ranSpecs: map[string]bool{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Fprintln(log, sc.Text()) // not an event: go's own messages
			continue
		}
		switch {
		case e.Action == "output" || e.Action == "build-output":
			_, _ = io.WriteString(log, e.Output)
			if e.Test != "" && strings.HasPrefix(e.Output, "Ran ") && strings.Contains(e.Output, " Specs in ") {
				ev.ranSpecs[e.Test] = true
			}
		case e.Action == "fail" && e.Test != "":
			ev.failed = append(ev.failed, e.Test)
		case e.Action == "fail" || e.Action == "build-fail":
			ev.pkgFailed = true
		}
	}
	return ev
}

// leaves drops a failed test whose subtest failed too: the subtest names the failure.
func leaves(tests []string) []string {
	var out []string
	for _, t := range tests {
		if !slices.ContainsFunc(tests, func(sub string) bool { return strings.HasPrefix(sub, t+"/") }) {
			out = append(out, t)
		}
	}
	return out
}

// ginkgoReport is the part of Ginkgo's JSON report (-ginkgo.json-report) read here.
type ginkgoReport struct {
	SpecReports []struct {
		ContainerHierarchyTexts []string
		LeafNodeType            string
		LeafNodeText            string
		State                   string
	}
}

// failureStates are Ginkgo's SpecStateFailureStates, as its JSON report spells them.
var failureStates = []string{"failed", "aborted", "panicked", "interrupted", "timedout"}

// failedSpecs returns the full text of each spec that failed, or "[BeforeSuite]" and the like for
// suite-level nodes.
func failedSpecs(path string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var reports []ginkgoReport
	if err := json.Unmarshal(raw, &reports); err != nil {
		return nil, fmt.Errorf("reading the Ginkgo report %s: %w", path, err)
	}
	var out []string
	for _, report := range reports {
		for _, spec := range report.SpecReports {
			if !slices.Contains(failureStates, spec.State) {
				continue
			}
			name := strings.TrimSpace(strings.Join(append(spec.ContainerHierarchyTexts, spec.LeafNodeText), " "))
			if name == "" {
				name = "[" + spec.LeafNodeType + "]"
			}
			if spec.State != "failed" {
				name += " (" + spec.State + ")"
			}
			out = append(out, name)
		}
	}
	return out, nil
}

// summarize prints how many runs of each package passed and how many runs each test failed in,
// and reports whether any failed.
func summarize(w io.Writer, outcomes []outcome, module string) bool {
	type key struct{ pkg, test string }
	runs := map[string]int{}
	passed := map[string]int{}
	failures := map[key][]int64{}
	var pkgs []string
	var keys []key
	for _, o := range outcomes {
		short := strings.TrimPrefix(o.pkg.path, module+"/")
		if runs[short] == 0 {
			pkgs = append(pkgs, short)
		}
		runs[short]++
		if len(o.failed) == 0 {
			passed[short]++
		}
		for _, t := range o.failed {
			k := key{short, t}
			if failures[k] == nil {
				keys = append(keys, k)
			}
			failures[k] = append(failures[k], o.seed)
		}
	}
	fmt.Fprintf(w, "\n=== Flakes summary\n%-44s %s\n", "PACKAGE", "PASSED RUNS")
	for _, p := range pkgs {
		fmt.Fprintf(w, "%-44s %d/%d\n", p, passed[p], runs[p])
	}
	if len(keys) == 0 {
		fmt.Fprintf(w, "\nno test failed\n")
		return false
	}
	slices.SortStableFunc(keys, func(a, b key) int { return len(failures[b]) - len(failures[a]) })
	fmt.Fprintf(w, "\n%-8s %-28s %s\n", "FAILED", "PACKAGE", "TEST (seeds of the failed runs)")
	for _, k := range keys {
		seeds := make([]string, len(failures[k]))
		for i, s := range failures[k] {
			seeds[i] = fmt.Sprint(s)
		}
		fmt.Fprintf(w, "%-8s %-28s %s (%s)\n", fmt.Sprintf("%d/%d", len(failures[k]), runs[k.pkg]), k.pkg, k.test, strings.Join(seeds, " "))
	}
	return true
}

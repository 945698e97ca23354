package main

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

type parkedResult struct {
	n                                      int
	created, parkedIn                      time.Duration
	rssBefore, rss, hwm, rssIdle, rssAfter int64
	hwmAfter                               int64
	idleCPU, idleFor                       time.Duration
	idleRequests                           requestCounts
	answered, resumed, finished            time.Duration
}

type results struct {
	cfg                             config
	load, loadEnd                   string
	resumeOperator, resumeInProcess []time.Duration
	answerPatch                     []time.Duration
	resumeRequests                  requestCounts
	throughput, throughputInProcess []tpRound
	// throughputLong is a round of runs with twice the turns: the difference says what one more
	// turn costs.
	throughputLong tpRound
	parked         parkedResult
	slow           []slowResult
	fairness       fairnessResult
	scale          *slowResult
	hostile        hostileResult
	// policiesNone and policiesMany are throughput rounds without ApprovalPolicies and with
	// -policies of them installed (none gating the workload).
	policiesNone, policiesMany []tpRound
	managerErrors              int
}

func newResults(c config) *results { return &results{cfg: c} }

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func medianRound(rs []tpRound, f func(tpRound) float64) float64 {
	if len(rs) == 0 {
		return 0
	}
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// table renders every figure measured, with its target.
func (r *results) table() string {
	var b strings.Builder
	c := r.cfg
	fmt.Fprintf(&b, "toolnexus operator benchmark — %s, %d CPUs, load average %s at start, %s at end; manager --max-concurrent-reconciles=%d %s (executor: --max-inflight=%d, --max-inflight-per-namespace=%d; GOMEMLIMIT=%s)\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), numCPU(), r.load, r.loadEnd, c.workers, strings.Join(c.managerArgs, " "),
		c.maxInflight, c.perNamespace, c.goMemLimit)
	w := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "| figure\t| operator\t| in-process loop\t| ratio op/in-proc\t| target\t| verdict\t|")
	fmt.Fprintln(w, "|---\t|---\t|---\t|---\t|---\t|---\t|")
	row := func(cells ...string) { fmt.Fprintln(w, "| "+strings.Join(cells, "\t| ")+"\t|") }
	if len(r.resumeOperator) > 0 {
		n := len(r.resumeOperator)
		for _, p := range []struct {
			p      float64
			target time.Duration
		}{{50, 10 * time.Millisecond}, {90, 0}, {99, 100 * time.Millisecond}} {
			op, in := percentile(r.resumeOperator, p.p), percentile(r.resumeInProcess, p.p)
			target, v := "", ""
			if p.target > 0 {
				target, v = "≤ "+ms(p.target), verdict(op <= p.target)
			}
			row(fmt.Sprintf("resume latency p%.0f (n=%d)", p.p, n), ms(op), ms(in), ratio(float64(op), float64(in)), target, v)
		}
		row("answer patch round trip p50 (harness → apiserver)", ms(percentile(r.answerPatch, 50)), "", "", "", "")
		operatorShare := make([]time.Duration, n)
		for i := range operatorShare {
			operatorShare[i] = r.resumeOperator[i] - r.answerPatch[i]
		}
		row("resume latency p50 less its answer's PATCH round trip", ms(percentile(operatorShare, 50)), "", "", "", "")
		row("API writes / reads per resumed run (answer → Succeeded)", fmt.Sprintf("%.2f / %.2f", r.resumeRequests.writes()/float64(n),
			r.resumeRequests.reads()/float64(n)), "", "", "", "")
	}
	if len(r.throughput) > 0 {
		op := medianRound(r.throughput, tpRound.rate)
		in := medianRound(r.throughputInProcess, tpRound.rate)
		row(fmt.Sprintf("turn throughput, %d runs × %d turns (median of %d)", c.runs, c.turns, len(r.throughput)),
			fmt.Sprintf("%.1f turns/s", op), fmt.Sprintf("%.1f turns/s", in), ratio(op, in), "≥ 100 turns/s", verdict(op >= 100))
		wpt := medianRound(r.throughput, tpRound.writesPerTurn)
		row(fmt.Sprintf("API writes per turn, all in (%d-turn runs: start and end included)", c.turns), fmt.Sprintf("%.2f", wpt), "0", "", "", "")
		if long := r.throughputLong; long.turns > 0 {
			short := medianRound(r.throughput, func(t tpRound) float64 { return t.requests.writes() })
			perTurn := (long.requests.writes() - short) / float64(long.turns-r.throughput[0].turns)
			perRun := (short - perTurn*float64(r.throughput[0].turns)) / float64(c.runs)
			row(fmt.Sprintf("API writes per turn that does not suspend (%d- vs %d-turn runs) / per run", 2*c.turns, c.turns),
				fmt.Sprintf("%.2f / %.2f", perTurn, perRun), "0", "", "≤ 2 per turn", verdict(perTurn <= 2.005))
		}
		row("API reads per turn (uncached GETs)", fmt.Sprintf("%.2f", medianRound(r.throughput, tpRound.readsPerTurn)), "0", "", "", "")
		row("CPU per turn: manager / kube-apiserver / etcd", fmt.Sprintf("%.2f / %.2f / %.2f ms", medianRound(r.throughput, tpRound.cpuPerTurn),
			medianRound(r.throughput, tpRound.apiCPUPerTurn), medianRound(r.throughput, tpRound.etcdCPUPerTurn)), "", "", "", "")
	}
	if p := r.parked; p.n > 0 {
		idlePct := 100 * p.idleCPU.Seconds() / p.idleFor.Seconds()
		row(fmt.Sprintf("parked runs: %d created / all parked", p.n), fmt.Sprintf("%s / %s", p.created.Round(time.Millisecond), p.parkedIn.Round(time.Millisecond)), "", "", "", "")
		row(fmt.Sprintf("manager RSS with %d parked (before: %d MiB; peak %d MiB)", p.n, p.rssBefore>>20, p.hwm>>20),
			fmt.Sprintf("%d MiB", p.rss>>20), "", "", "≤ 300 MiB", verdict(p.rss <= 300<<20))
		row(fmt.Sprintf("manager CPU over %s idle", p.idleFor.Round(time.Second)), fmt.Sprintf("%.2f%% of a core (%s)", idlePct, p.idleCPU),
			"", "", "≤ 2%", verdict(idlePct <= 2))
		row("manager API requests while idle", fmt.Sprintf("%.0f", p.idleRequests.writes()+p.idleRequests.reads()), "", "", "0 (no polling)", "")
		row(fmt.Sprintf("answer all %d (harness, 32 writers)", p.n), p.answered.Round(time.Millisecond).String(), "", "", "", "")
		row(fmt.Sprintf("resume all %d: first answer → last retried call", p.n), p.resumed.Round(time.Millisecond).String(), "", "", "≤ 60 s", verdict(p.resumed <= time.Minute))
		row(fmt.Sprintf("… → all %d Succeeded", p.n), p.finished.Round(time.Millisecond).String(), "", "", "", "")
		row("manager RSS after they finished (peak)", fmt.Sprintf("%d MiB (%d MiB)", p.rssAfter>>20, p.hwmAfter>>20), "", "", "", "")
	}
	r.slowRows(row)
	r.fairnessRows(row)
	r.scaleRows(row)
	r.hostileRows(row)
	r.policyRows(row)
	_ = w.Flush()
	if len(r.throughput) > 0 {
		fmt.Fprintf(&b, "\nAPI requests by the manager per throughput round (%d turns):\n", r.throughput[0].turns)
		for i, rd := range r.throughput {
			fmt.Fprintf(&b, "  round %d: %s\n", i, rd.requests)
		}
		if long := r.throughputLong; long.turns > 0 {
			fmt.Fprintf(&b, "  %d-turn runs (%d turns): %s\n", 2*c.turns, long.turns, long.requests)
		}
	}
	r.loadRequests(&b)
	if len(r.resumeRequests) > 0 {
		fmt.Fprintf(&b, "API requests by the manager for %d resumed runs: %s\n", len(r.resumeOperator), r.resumeRequests)
	}
	if r.parked.n > 0 && len(r.parked.idleRequests) > 0 {
		fmt.Fprintf(&b, "API requests by the manager while idle: %s\n", r.parked.idleRequests)
	}
	fmt.Fprintf(&b, "manager log lines at level error: %d\n", r.managerErrors)
	return b.String()
}

func (c requestCounts) String() string { return c.format("%.0f") }

// format lists the counts by key, each number formatted with verb.
func (c requestCounts) format(verb string) string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s="+verb, k, c[k])
	}
	return strings.Join(parts, ", ")
}

func ratio(op, in float64) string {
	if in == 0 {
		return ""
	}
	return fmt.Sprintf("%.2f×", op/in)
}

func numCPU() int {
	raw, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(raw), "\nprocessor") + 1
}

const (
	beginMarker = "<!-- bench:begin (written by go run ./hack/bench -doc=docs/benchmarks.md) -->"
	endMarker   = "<!-- bench:end -->"
)

// writeDoc replaces the text between the markers of path with the table and the command that
// produced it; a file without markers gets them appended.
func (r *results) writeDoc(path, table string) error {
	raw, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	doc := string(raw)
	block := fmt.Sprintf("%s\n\nCommand: `go run ./hack/bench %s`\n\n```\n%s```\n\n%s", beginMarker,
		strings.Join(os.Args[1:], " "), table, endMarker)
	i, j := strings.Index(doc, beginMarker), strings.Index(doc, endMarker)
	if i >= 0 && j > i {
		doc = doc[:i] + block + doc[j+len(endMarker):]
	} else {
		doc += "\n" + block + "\n"
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}

// policyRows: what the platform's ApprovalPolicies cost the workload's tool calls, rounds without
// and with them in one run of the bench.
func (r *results) policyRows(row func(...string)) {
	if len(r.policiesNone) == 0 || len(r.policiesMany) == 0 {
		return
	}
	c := r.cfg
	none, many := medianRound(r.policiesNone, tpRound.rate), medianRound(r.policiesMany, tpRound.rate)
	row(fmt.Sprintf("turn throughput with %d ApprovalPolicies installed, none gating (median of %d) / without", c.policies, len(r.policiesMany)),
		fmt.Sprintf("%.1f / %.1f turns/s", many, none), "", ratio(many, none), "", "")
	cpuNone, cpuMany := medianRound(r.policiesNone, tpRound.cpuPerTurn), medianRound(r.policiesMany, tpRound.cpuPerTurn)
	row(fmt.Sprintf("manager CPU per turn (one tool call) with %d policies / without", c.policies),
		fmt.Sprintf("%.2f / %.2f ms", cpuMany, cpuNone), "", ratio(cpuMany, cpuNone), "", "")
	rpt := medianRound(r.policiesMany, tpRound.readsPerTurn)
	row(fmt.Sprintf("API reads per turn with %d policies (none per call)", c.policies), fmt.Sprintf("%.2f", rpt), "", "",
		fmt.Sprintf("≤ %.2f (without)", medianRound(r.policiesNone, tpRound.readsPerTurn)),
		verdict(rpt <= medianRound(r.policiesNone, tpRound.readsPerTurn)+0.005))
}

package main

import (
	"fmt"
	"strings"
	"time"
)

// The rows of the scenarios with models that take their time: slow, fairness, scale.

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

// workloadRows are the figures every workload shares: how fast it went and what bounded it.
func workloadRows(row func(...string), label string, w slowResult) {
	steady := "— : 10 % to 90 % of the turns within one sample"
	if w.load.steadyRate > 0 {
		steady = fmt.Sprintf("%.1f", w.load.steadyRate)
	}
	row(label+": runs created in / turns / turns per second (steady, 10–90 %)", fmt.Sprintf("%s / %d / %.1f (%s)",
		secs(w.created), w.turnsTaken, w.rate(), steady), "", "", "", "")
	row(label+": executor steps in flight (of "+fmt.Sprint(w.slots)+" slots) / waiting, mean / max",
		fmt.Sprintf("%s / %s", w.load.inflight, w.load.queued), "", "", "", "")
	row(label+": workqueue depth / busy workers, mean / max; reconcile, queue wait (mean)",
		fmt.Sprintf("%s / %s; %s, %s", w.load.depth, w.load.workers, ms(w.mgr.reconcile), ms(w.mgr.workqueueWait)), "", "", "", "")
	row(label+": step wait for a slot (mean); reconciles per turn; model connections per request",
		fmt.Sprintf("%s; %.2f; %.2f", ms(w.mgr.stepWait), w.perTurn(w.mgr.reconciles),
			float64(w.modelConns)/float64(max(w.modelRequests, 1))), "", "", "", "")
	row(label+": CPU per turn: manager / kube-apiserver / etcd; manager cores", fmt.Sprintf("%.2f / %.2f / %.2f ms; %.2f",
		perTurnMS(w.cpu, w.turnsTaken), perTurnMS(w.apiCPU, w.turnsTaken), perTurnMS(w.etcdCPU, w.turnsTaken), w.cores(w.cpu)), "", "", "", "")
	row(label+": API writes / reads per turn", fmt.Sprintf("%.2f / %.2f", w.perTurn(w.requests.writes()), w.perTurn(w.requests.reads())),
		"", "", "", "")
	if w.timedOut {
		row(label+": TIMED OUT, runs by phase", fmt.Sprint(w.phases), "", "", "", "")
	}
}

func (r *results) slowRows(row func(...string)) {
	for _, s := range r.slow {
		label := fmt.Sprintf("slow model (%s): %d runs × %d turns in %d namespaces", s.delay, s.runs, s.turns, s.namespaces)
		bound := "the chain"
		if s.slotIdeal() > s.chainIdeal() {
			bound = fmt.Sprintf("%d executor slots", s.slots)
		}
		row(label+": wall time", secs(s.wall), secs(s.inProcess.elapsed), ratio(s.wall.Seconds(), s.inProcess.elapsed.Seconds()),
			fmt.Sprintf("≤ 2× ideal %s (%s)", secs(s.ideal()), bound), verdict(!s.timedOut && s.wall <= 2*s.ideal()))
		row(label+": wall / ideal; wall / one chain ("+secs(s.chainIdeal())+")",
			fmt.Sprintf("%.2f×; %.2f×", s.wall.Seconds()/s.ideal().Seconds(), s.wall.Seconds()/s.chainIdeal().Seconds()), "", "", "", "")
		workloadRows(row, fmt.Sprintf("slow %d", s.runs), s)
	}
}

// noEffect is the fairness target beside hung runs: the fast run's median within the noise of the
// median alone (1.5× or 50 ms).
func noEffect(beside, alone time.Duration) bool {
	return beside <= alone*3/2 || beside-alone <= 50*time.Millisecond
}

func (r *results) fairnessRows(row func(...string)) {
	f := r.fairness
	if len(f.alone) == 0 {
		return
	}
	alone := percentile(f.alone, 50)
	p50max := func(d []time.Duration) string {
		return fmt.Sprintf("%s / %s", ms(percentile(d, 50)), ms(percentile(d, 100)))
	}
	row(fmt.Sprintf("fairness: fast %d-turn run alone, create → Succeeded, p50 / max (n=%d)", fastTurns, len(f.alone)),
		p50max(f.alone), "", "", "", "")
	if len(f.besideSlow) > 0 {
		row(fmt.Sprintf("fairness: … beside %d runs on a %s model in another namespace, p50 / max", f.slowRuns, f.slowDelay),
			p50max(f.besideSlow), "", ratio(float64(percentile(f.besideSlow, 50)), float64(alone))+" of alone",
			"max ≤ 1 s", verdict(percentile(f.besideSlow, 100) <= time.Second))
		row(fmt.Sprintf("fairness: … the %d slow runs' own wall time (one chain: %s)", f.slowRuns, secs(time.Duration(f.slowTurns)*f.slowDelay)),
			secs(f.slowWall), "", "", "", "")
	}
	if len(f.besideHung) > 0 {
		hung := percentile(f.besideHung, 50)
		row(fmt.Sprintf("fairness: … beside %d runs whose model never answers, p50 / max", f.hungRuns),
			p50max(f.besideHung), "", ratio(float64(hung), float64(alone))+" of alone",
			"no effect: p50 ≤ 1.5× alone or +50 ms", verdict(noEffect(hung, alone)))
		row("fairness: … hung requests held / their namespace's steps in flight, after the fast runs",
			fmt.Sprintf("%d / %.0f", f.hungHeld, f.hungInflight), "", "", fmt.Sprint(f.hungRuns), verdict(f.hungHeld == int64(f.hungRuns)))
		row("fairness: … deleting the hung runs → every request aborted", ms(f.hungAborted), "", "", "", "")
	}
}

func (r *results) scaleRows(row func(...string)) {
	s := r.scale
	if s == nil {
		return
	}
	label := fmt.Sprintf("scale: %d active runs × %d turns (%s model) in %d namespaces", s.runs, s.turns, s.delay, s.namespaces)
	row(label+": wall time", secs(s.wall), "", "", fmt.Sprintf("executor bound %s", secs(s.ideal())), "")
	row("scale: manager RSS before / peak", fmt.Sprintf("%d MiB / %d MiB", s.rssBefore>>20, s.load.rssMax>>20), "", "", "", "")
	workloadRows(row, "scale", *s)
}

// loadRequests lists the API requests per turn by verb and resource of the slow and scale
// workloads.
func (r *results) loadRequests(b *strings.Builder) {
	ws := append([]slowResult(nil), r.slow...)
	if r.scale != nil {
		ws = append(ws, *r.scale)
	}
	for _, w := range ws {
		perTurn := requestCounts{}
		for k, v := range w.requests {
			perTurn[k] = w.perTurn(v)
		}
		fmt.Fprintf(b, "API requests by the manager per turn, %d runs × %d turns on the %s model (%d turns): %s\n",
			w.runs, w.turns, w.delay, w.turnsTaken, perTurn.format("%.2f"))
	}
}

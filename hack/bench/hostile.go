package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/looptest"
)

// The hostile mix (issue 26): what one namespace's huge replies, a group of namespaces' hung
// endpoints and an editor annotating a Secret cost the shared manager, and what they cost the
// other namespaces' runs meanwhile. Figures, not timed assertions.

type hostileResult struct {
	ran bool
	// big replies: runs in one namespace, each answered with bigSize bytes of text.
	bigRuns, bigSize int
	bigWall          time.Duration
	bigPhases        map[toolnexusv1alpha1.RunPhase]int
	// rssBefore is the manager's RSS when the big runs were created, rssPeak its VmHWM from then to
	// their end, rssSampled the largest RSS sampled meanwhile.
	rssBefore, rssPeak, rssSampled int64
	budget                         string
	// hung: hungNamespaces × hungPerNamespace runs whose model never answers.
	hungNamespaces, hungPerNamespace int
	hungHeld                         int64
	hungInflight                     float64
	// fifth is a fast run in a namespace of its own beside the hung runs, create → Succeeded;
	// fifthDone is false when it had not succeeded within fifthTimeout.
	fifth        time.Duration
	fifthDone    bool
	fifthTimeout time.Duration
	// flood: parked runs with transcript bytes of text each, all referencing one Secret, which is
	// annotated annotates times.
	parked, transcript, annotates int
	floodCPU, floodFor            time.Duration
	floodReconciles               float64
	// alone is other namespaces' fast run before the mix; during holds them by phase of the mix.
	alone  []time.Duration
	during map[string][]time.Duration
}

var hostilePhases = []string{"big", "hung", "flood"}

// hostile runs the three parts of the mix one after another while fast runs in another namespace
// sample what each part costs everyone else.
func (h *harness) hostile(ctx context.Context) error {
	c := h.cfg
	res := &h.results.hostile
	res.ran = true
	res.budget = h.mgr.logged("Memory budget of the steps in flight", "MiB")
	var err error
	logf("hostile: %d fast runs alone", c.fairSamples)
	if res.alone, err = h.fastRuns(ctx, "hostile-alone", 200*time.Millisecond); err != nil {
		return err
	}
	probe, err := h.startProbe(ctx)
	if err != nil {
		return err
	}
	defer func() { res.during = probe.stop() }()
	probe.enter("big")
	if err := h.bigReplies(ctx, res); err != nil {
		return err
	}
	probe.enter("hung")
	if err := h.hungNamespaces(ctx, res); err != nil {
		return err
	}
	probe.enter("flood")
	return h.annotationFlood(ctx, res)
}

// incompressible is size bytes of random base64 text: nothing for gzip to take, nothing for JSON
// to escape.
func incompressible(size int) string {
	raw := make([]byte, size*3/4+3)
	rng := rand.NewChaCha8([32]byte{26})
	_, _ = rng.Read(raw)
	return base64.StdEncoding.EncodeToString(raw)[:size]
}

// withLength is reply sent as a provider sends a whole JSON answer: with its Content-Length.
func withLength(reply looptest.Reply) looptest.Reply {
	reply.Header = http.Header{"Content-Length": {strconv.Itoa(len(reply.Body))}}
	return reply
}

// bigReplies creates -hostile-big runs in one namespace whose model answers each with
// -hostile-big-size bytes of text, and measures the manager's peak RSS until they end (a reply
// that large cannot be stored, so each run fails with TranscriptTooLarge: what matters is that the
// manager lives through it).
func (h *harness) bigReplies(ctx context.Context, res *hostileResult) error {
	c := h.cfg
	res.bigRuns, res.bigSize = c.hostileBig, c.hostileBigSize
	reply := withLength(looptest.OpenAIText(incompressible(c.hostileBigSize)))
	model, err := newModelServerWith(0, func(looptest.Request) looptest.Reply { return reply })
	if err != nil {
		return err
	}
	defer model.close()
	ns, err := h.namespace(ctx, "bench-hostile-big")
	if err != nil {
		return err
	}
	defer h.cleanupLogged(ctx, ns)
	tr, err := track(ctx, h.c, client.InNamespace(ns))
	if err != nil {
		return err
	}
	if err := h.mgr.resetPeak(); err != nil {
		logf("hostile: resetting the manager's peak RSS: %v (the peak is then the process's)", err)
	}
	res.rssBefore, _ = h.mgr.rss()
	smp := h.startSampler(ctx, 200*time.Millisecond, tr.turnsTaken)
	logf("hostile: %d runs answered with %d MiB each (manager RSS %d MiB)", c.hostileBig, c.hostileBigSize>>20, res.rssBefore>>20)
	t0 := time.Now()
	if _, err := h.createRuns(ctx, ns, "big", c.hostileBig, 16, runShape{model: model, turns: 1, tool: toolWork}); err != nil {
		smp.finish()
		return err
	}
	err = tr.waitFor(ctx, 10*time.Minute, c.hostileBig, toolnexusv1alpha1.RunPhaseSucceeded, toolnexusv1alpha1.RunPhaseFailed,
		toolnexusv1alpha1.RunPhaseIncomplete)
	res.bigWall = time.Since(t0)
	_, res.rssPeak = h.mgr.rss()
	res.rssSampled = smp.finish().rssMax
	res.bigPhases = tr.phaseCounts()
	if err != nil {
		logf("hostile: big replies: %v", err)
	}
	logf("hostile: big replies ended in %s (%v); manager peak RSS %d MiB", res.bigWall.Round(time.Millisecond), res.bigPhases, res.rssPeak>>20)
	return ctx.Err()
}

// hungNamespaces fills -hostile-hung-namespaces namespaces with -hostile-hung runs each on a model
// that accepts and never answers, then times a fast run in a fifth namespace.
func (h *harness) hungNamespaces(ctx context.Context, res *hostileResult) error {
	c := h.cfg
	res.hungNamespaces, res.hungPerNamespace, res.fifthTimeout = c.hostileHungNamespaces, c.hostileHung, c.hostileFifthTimeout
	hung, err := newModelServer(hangFor)
	if err != nil {
		return err
	}
	defer hung.close()
	nss, err := h.namespaces(ctx, "bench-hostile-hung", c.hostileHungNamespaces)
	if err != nil {
		return err
	}
	defer h.cleanupLogged(ctx, nss...)
	n := c.hostileHungNamespaces * c.hostileHung
	logf("hostile: %d × %d runs whose model never answers (model.requestTimeout 10m)", c.hostileHungNamespaces, c.hostileHung)
	if _, err := h.createSpread(ctx, nss, "hung", n, 32,
		runShape{model: hung, turns: fastTurns, tool: toolWork, timeout: 10 * time.Minute}); err != nil {
		return err
	}
	if err := hung.awaitHeld(ctx, int64(n), c.hostileHungWait); err != nil {
		logf("hostile: %v", err)
	}
	res.hungHeld = hung.held.Load()
	if mm, err := h.mgr.scrapeMetrics(ctx); err == nil {
		for _, ns := range nss {
			res.hungInflight += mm.sum("toolnexus_inflight_steps", map[string]string{"namespace": ns})
		}
	}
	fifth, err := h.namespace(ctx, "bench-hostile-fifth")
	if err != nil {
		return err
	}
	defer h.cleanupLogged(ctx, fifth)
	tr, err := track(ctx, h.c, client.InNamespace(fifth))
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := h.c.Create(ctx, h.newRun(fifth, "fifth", h.shape(fastTurns, toolWork))); err != nil {
		return err
	}
	err = h.waitPhase(ctx, tr, "fifth", toolnexusv1alpha1.RunPhaseSucceeded, c.hostileFifthTimeout)
	res.fifth, res.fifthDone = time.Since(t0), err == nil
	logf("hostile: the hung model holds %d requests; a fifth namespace's run took %s (succeeded: %v)", res.hungHeld,
		res.fifth.Round(time.Millisecond), res.fifthDone)
	if err := h.cleanup(ctx, nss...); err != nil {
		return err
	}
	return hung.awaitReleased(ctx, time.Minute)
}

// annotationFlood parks -hostile-parked runs with large transcripts, all referencing one Secret,
// then annotates the Secret -hostile-annotates times and measures the manager's CPU until it is
// quiet again.
func (h *harness) annotationFlood(ctx context.Context, res *hostileResult) error {
	c := h.cfg
	res.parked, res.transcript, res.annotates = c.hostileParked, c.hostileTranscript, c.hostileAnnotates
	// A text that compresses well: a transcript of this size fits the run's record.
	var text strings.Builder
	for i := 0; text.Len() < c.hostileTranscript; i++ {
		fmt.Fprintf(&text, "line %07d: the parked run's transcript, decoded on every reconcile\n", i)
	}
	content, _ := json.Marshal(text.String()[:c.hostileTranscript])
	reply := withLength(looptest.NewCompletion("chatcmpl-park", "fake", looptest.ChatMessage{
		Role: "assistant", Content: content,
		ToolCalls: []looptest.ChatToolCall{{ID: "call_1", Type: "function", Function: looptest.ChatFunctionCall{Name: toolGate, Arguments: `{"k":1}`}}},
	}, looptest.ChatUsage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15}).Reply())
	model, err := newModelServerWith(0, func(looptest.Request) looptest.Reply { return reply })
	if err != nil {
		return err
	}
	defer model.close()
	ns, err := h.namespace(ctx, "bench-hostile-flood")
	if err != nil {
		return err
	}
	defer h.cleanupLogged(ctx, ns)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench-key"}, StringData: map[string]string{"key": "bench"}}
	if err := h.c.Create(ctx, secret); err != nil {
		return err
	}
	tr, err := track(ctx, h.c, client.InNamespace(ns))
	if err != nil {
		return err
	}
	logf("hostile: parking %d runs with %d KiB transcripts that reference one Secret", c.hostileParked, c.hostileTranscript>>10)
	err = parallel(ctx, c.hostileParked, 16, func(i int) error {
		run := h.newRun(ns, fmt.Sprintf("parked-%03d", i), runShape{model: model, turns: 2, tool: toolGate})
		run.Spec.Model.APIKeySecretRef = &toolnexusv1alpha1.SecretKeyReference{Name: secret.Name, Key: "key"}
		return h.c.Create(ctx, run)
	})
	if err != nil {
		return err
	}
	if err := tr.waitFor(ctx, 5*time.Minute, c.hostileParked, toolnexusv1alpha1.RunPhaseSuspended); err != nil {
		return err
	}
	if err := h.awaitQuiet(ctx, time.Minute); err != nil {
		return err
	}
	before, err := h.mgr.scrapeMetrics(ctx)
	if err != nil {
		return err
	}
	cpu0, t0 := h.mgr.cpu(), time.Now()
	logf("hostile: %d annotations of the Secret", c.hostileAnnotates)
	for i := range c.hostileAnnotates {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"bench.toolnexus.dev/edit":"%d"}}}`, i)
		if err := h.c.Patch(ctx, secret, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			return err
		}
	}
	if err := h.awaitQuiet(ctx, 5*time.Minute); err != nil {
		return err
	}
	res.floodCPU, res.floodFor = h.mgr.cpu()-cpu0, time.Since(t0)
	if after, err := h.mgr.scrapeMetrics(ctx); err == nil {
		res.floodReconciles = after.sum("controller_runtime_reconcile_total", agentrunController) -
			before.sum("controller_runtime_reconcile_total", agentrunController)
	}
	logf("hostile: the annotations cost the manager %s of CPU over %s, %.0f reconciles", res.floodCPU, res.floodFor.Round(time.Millisecond),
		res.floodReconciles)
	return nil
}

// awaitQuiet waits until the runs' workqueue is empty and no reconcile runs, twice in a row a
// quarter second apart.
func (h *harness) awaitQuiet(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for quiet := 0; quiet < 2; {
		mm, err := h.mgr.scrapeMetrics(ctx)
		if err != nil {
			return err
		}
		if mm.sum("workqueue_depth", agentrunController) == 0 && mm.sum("controller_runtime_active_workers", agentrunController) == 0 {
			quiet++
		} else {
			quiet = 0
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the manager was still busy after %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return nil
}

// probe creates fast runs in a namespace of its own, one at a time, for as long as the mix runs,
// and files each one's create → Succeeded under the part of the mix it started in.
type probe struct {
	mu     sync.Mutex
	phase  string
	during map[string][]time.Duration
	done   chan struct{}
	ended  chan struct{}
}

func (h *harness) startProbe(ctx context.Context) (*probe, error) {
	ns, err := h.namespace(ctx, "bench-hostile-other")
	if err != nil {
		return nil, err
	}
	tr, err := track(ctx, h.c, client.InNamespace(ns))
	if err != nil {
		return nil, err
	}
	p := &probe{during: map[string][]time.Duration{}, done: make(chan struct{}), ended: make(chan struct{})}
	go func() {
		defer close(p.ended)
		defer h.cleanupLogged(ctx, ns)
		for i := 0; ; i++ {
			select {
			case <-p.done:
				return
			case <-ctx.Done():
				return
			case <-time.After(500 * time.Millisecond):
			}
			p.mu.Lock()
			phase := p.phase
			p.mu.Unlock()
			name := fmt.Sprintf("other-%04d", i)
			t0 := time.Now()
			if err := h.c.Create(ctx, h.newRun(ns, name, h.shape(fastTurns, toolWork))); err != nil {
				logf("hostile: probe: %v", err)
				return
			}
			if err := h.waitPhase(ctx, tr, name, toolnexusv1alpha1.RunPhaseSucceeded, 5*time.Minute); err != nil {
				logf("hostile: probe: %v", err)
				return
			}
			p.mu.Lock()
			p.during[phase] = append(p.during[phase], time.Since(t0))
			p.mu.Unlock()
		}
	}()
	return p, nil
}

func (p *probe) enter(phase string) {
	p.mu.Lock()
	p.phase = phase
	p.mu.Unlock()
}

func (p *probe) stop() map[string][]time.Duration {
	close(p.done)
	<-p.ended
	return p.during
}

func (r *results) hostileRows(row func(...string)) {
	x := r.hostile
	if !x.ran {
		return
	}
	limit := r.cfg.memoryLimit
	row(fmt.Sprintf("hostile: %d runs in one namespace answered with %d MiB each: manager peak RSS (VmHWM) / largest sampled; before",
		x.bigRuns, x.bigSize>>20), fmt.Sprintf("%d MiB / %d MiB; %d MiB", x.rssPeak>>20, x.rssSampled>>20, x.rssBefore>>20), "", "",
		fmt.Sprintf("≤ %d MiB (the Deployment's limit)", limit>>20), verdict(x.rssPeak > 0 && x.rssPeak <= limit))
	row("hostile: … their wall time; runs by phase; the manager's memory budget of steps in flight",
		fmt.Sprintf("%s; %v; %s MiB", secs(x.bigWall), x.bigPhases, x.budget), "", "", "", "")
	if x.hungNamespaces > 0 {
		row(fmt.Sprintf("hostile: %d × %d runs whose model never answers: requests held / their steps in flight", x.hungNamespaces, x.hungPerNamespace),
			fmt.Sprintf("%d / %.0f", x.hungHeld, x.hungInflight), "", "", fmt.Sprint(x.hungNamespaces*x.hungPerNamespace),
			verdict(x.hungHeld == int64(x.hungNamespaces*x.hungPerNamespace)))
		fifth := ms(x.fifth)
		if !x.fifthDone {
			fifth = "not Succeeded after " + secs(x.fifth)
		}
		alone := percentile(x.alone, 50)
		row("hostile: … a fast run in a fifth namespace, create → Succeeded", fifth, "", ratio(float64(x.fifth), float64(alone))+" of alone",
			"starts at once: ≤ 1.5× alone or +50 ms", verdict(x.fifthDone && noEffect(x.fifth, alone)))
	}
	if x.parked > 0 {
		row(fmt.Sprintf("hostile: %d parked runs (%d KiB transcripts) referencing one Secret, %d annotations of it: manager CPU; reconciles",
			x.parked, x.transcript>>10, x.annotates), fmt.Sprintf("%.2f s over %s; %.0f", x.floodCPU.Seconds(), secs(x.floodFor), x.floodReconciles),
			"", "", "", "")
	}
	p50max := func(d []time.Duration) string {
		if len(d) == 0 {
			return "—"
		}
		return fmt.Sprintf("%s / %s (n=%d)", ms(percentile(d, 50)), ms(percentile(d, 100)), len(d))
	}
	row("hostile: another namespace's fast run alone, p50 / max", p50max(x.alone), "", "", "", "")
	for _, phase := range hostilePhases {
		d := x.during[phase]
		row(fmt.Sprintf("hostile: … during the %s part, p50 / max", phase), p50max(d), "",
			ratio(float64(percentile(d, 50)), float64(percentile(x.alone, 50)))+" of alone", "", "")
	}
}

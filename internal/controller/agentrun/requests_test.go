package agentrun

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/toolnexus/operator/internal/controller/metrics"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/executor"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/loop/state"
	"github.com/toolnexus/operator/internal/runstore"
	"github.com/toolnexus/operator/internal/testenv"
	"github.com/toolnexus/operator/internal/tools"
)

// What a reconcile does about a run's PendingRequests around the decisions of state.Settle
// (announce, reading the requests and carrying out Settle's effects, syncRequests), each on a scope
// built by hand over controller-runtime's fake client: no control plane, and every case names what
// the reconcile must do. The decisions themselves are table-tested in internal/loop/state.

var decisionNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// decisionArgs are the arguments a call runs with (BeforeTool rewrote the model's): what its
// PendingRequest must show.
const decisionArgs = `{"dryRun":false,"env":"prod"}`

// decisionRun is the run the cases decide for, with approvers to copy into its requests.
func decisionRun(onTimeout toolnexusv1alpha1.OnTimeout) *toolnexusv1alpha1.AgentRun {
	return &toolnexusv1alpha1.AgentRun{
		ObjectMeta: metav1.ObjectMeta{Name: "deploy", Namespace: "tenant", UID: "run-uid", Generation: 1},
		Spec: toolnexusv1alpha1.AgentRunSpec{Prompt: "ship it", AgentSpec: toolnexusv1alpha1.AgentSpec{Suspension: &toolnexusv1alpha1.SuspensionPolicy{
			OnTimeout: onTimeout, Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice"}, Groups: []string{"sre"}}}}},
	}
}

// waitingCall is call id of the tool deploy in turn 1, suspended on an input request, not
// announced yet.
func waitingCall(id string) loop.Call {
	return loop.Call{ID: id, Name: "deploy", Arguments: `{"env":"prod"}`, Args: decisionArgs, Phase: loop.PhaseSuspended,
		Request: &tools.Request{ID: "req-" + id, Kind: tools.KindInput, Prompt: "Which region?"}}
}

// announcedCall is waitingCall announced as its PendingRequest, whose UID is uid-<id>.
func announcedCall(id string) loop.Call {
	c := waitingCall(id)
	c.Announced = &loop.Announcement{Name: requestName("deploy", 1, id), UID: "uid-" + id}
	return c
}

// expiring makes c's request expire at t.
func expiring(c loop.Call, t time.Time) loop.Call {
	req := *c.Request
	req.ExpiresAt = t.Format(time.RFC3339)
	c.Request = &req
	return c
}

// stateOf is the saved state of turn 1 holding calls.
func stateOf(calls ...loop.Call) *loop.State {
	return &loop.State{Messages: []loop.Message{{Role: loop.RoleUser, Content: "ship it"}}, Turn: 1,
		Calls: append([]loop.Call(nil), calls...)}
}

// requestFor is the PendingRequest the run created for call, as the API server holds it:
// controlled by the run, with the UID the call was announced with (uid-<id> when it was not).
func requestFor(t *testing.T, run *toolnexusv1alpha1.AgentRun, call loop.Call, edits ...func(*toolnexusv1alpha1.PendingRequest)) *toolnexusv1alpha1.PendingRequest {
	t.Helper()
	preq, err := newPendingRequest(run, run.Spec.Suspension, 1, call, call.Asks()[0], false)
	if err != nil {
		t.Fatal(err)
	}
	preq.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(run, toolnexusv1alpha1.GroupVersion.WithKind("AgentRun"))}
	preq.UID = types.UID("uid-" + call.ID)
	if call.Announced != nil {
		preq.UID = types.UID(call.Announced.UID)
	}
	preq.Generation = 1
	preq.CreationTimestamp = metav1.NewTime(decisionNow.Add(-time.Hour))
	for _, edit := range edits {
		edit(preq)
	}
	return preq
}

// answeredBy gives a request answer a, written by who.
func answeredBy(who string, a toolnexusv1alpha1.Answer) func(*toolnexusv1alpha1.PendingRequest) {
	return func(p *toolnexusv1alpha1.PendingRequest) {
		p.Status.Answer, p.Status.AnsweredBy = &a, who
		p.Status.AnsweredAt = &metav1.Time{Time: decisionNow.Add(-time.Minute)}
	}
}

// requestEdits are the changes a case makes to the request the run created.
type requestEdits = []func(*toolnexusv1alpha1.PendingRequest)

func withUID(uid string) func(*toolnexusv1alpha1.PendingRequest) {
	return func(p *toolnexusv1alpha1.PendingRequest) { p.UID = types.UID(uid) }
}

// regionAnswer answers an input request with a region, as a PendingRequest and as the loop holds it.
var (
	regionAnswer     = toolnexusv1alpha1.Answer{OK: true, Data: &apiextensionsv1.JSON{Raw: []byte(`{"output":"eu-west-1"}`)}}
	regionLoopAnswer = tools.Answer{OK: true, Data: map[string]any{tools.OutputKey: "eu-west-1"}}
)

// decisionEnv is a reconciler over a fake API server that, like a real one, gives created objects
// a UID (created-<name>), and counts the status patches sent to it.
type decisionEnv struct {
	r             *Reconciler
	c             client.Client
	recorder      *events.FakeRecorder
	statusPatches int
	// failPatches makes that many status patches fail.
	failPatches int
}

func newDecisionEnv(t *testing.T, objs ...client.Object) *decisionEnv {
	t.Helper()
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	e := &decisionEnv{recorder: events.NewFakeRecorder(16)}
	e.c = fake.NewClientBuilder().WithScheme(scheme).
		WithStatusSubresource(&toolnexusv1alpha1.PendingRequest{}, &toolnexusv1alpha1.AgentRun{}).
		WithObjects(objs...).
		WithIndex(&toolnexusv1alpha1.AgentRun{}, ownerRunIndexField, runOfRequest).
		WithIndex(&toolnexusv1alpha1.PendingRequest{}, rootRunIndexField, rootUIDOfRequest).
		WithInterceptorFuncs(interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				if obj.GetUID() == "" {
					obj.SetUID(types.UID("created-" + obj.GetName()))
				}
				return c.Create(ctx, obj, opts...)
			},
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				e.statusPatches++
				if e.failPatches > 0 {
					e.failPatches--
					return apierrors.NewServiceUnavailable("injected")
				}
				if err := answerKept(ctx, c, obj); err != nil {
					return err
				}
				return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			},
		}).Build()
	e.r = &Reconciler{Client: e.c, APIReader: e.c, Scheme: scheme, Recorder: e.recorder,
		Clock: clocktesting.NewFakePassiveClock(decisionNow), Metrics: metrics.New(prometheus.NewRegistry(), e.c), steps: newSteps(),
		store:    runstore.New(e.c, e.c, scheme, runstore.Limits{}),
		Executor: executor.New(executor.Limits{}, executor.Observer{})}
	return e
}

// answerKept refuses, as the CRD's rule does, a write that changes a PendingRequest's answer once
// it is set.
func answerKept(ctx context.Context, c client.Client, obj client.Object) error {
	p, ok := obj.(*toolnexusv1alpha1.PendingRequest)
	if !ok {
		return nil
	}
	cur := &toolnexusv1alpha1.PendingRequest{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil || cur.Status.Answer == nil ||
		equality.Semantic.DeepEqual(cur.Status.Answer, p.Status.Answer) {
		return nil
	}
	return apierrors.NewInvalid(toolnexusv1alpha1.GroupVersion.WithKind("PendingRequest").GroupKind(), p.Name, field.ErrorList{
		field.Invalid(field.NewPath("status", "answer"), p.Status.Answer, "status.answer cannot be changed or removed once set")})
}

// cached is what the cache lists of the named requests: read from the API, so that a name the API
// lacks (or a request the cache has not seen yet) is left out.
func (e *decisionEnv) cached(t *testing.T, names ...string) map[string]*toolnexusv1alpha1.PendingRequest {
	t.Helper()
	out := map[string]*toolnexusv1alpha1.PendingRequest{}
	for _, name := range names {
		if p := e.request(t, name); p != nil {
			out[name] = p
		}
	}
	return out
}

// request reads a PendingRequest from the API; nil when there is none.
func (e *decisionEnv) request(t *testing.T, name string) *toolnexusv1alpha1.PendingRequest {
	t.Helper()
	p := &toolnexusv1alpha1.PendingRequest{}
	err := e.c.Get(context.Background(), client.ObjectKey{Namespace: "tenant", Name: name}, p)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// recorded drains the events the fake recorder got, as "<type> <reason>".
func (e *decisionEnv) recorded() []string {
	var out []string
	for {
		select {
		case ev := <-e.recorder.Events:
			f := strings.SplitN(ev, " ", 3)
			out = append(out, f[0]+" "+f[1])
		default:
			return out
		}
	}
}

// checkEvents checks that the decision queued want and recorded none of them before emitEvents,
// which records them.
func (e *decisionEnv) checkEvents(t *testing.T, s *scope, want []string) {
	t.Helper()
	if got := e.recorded(); len(got) > 0 {
		t.Errorf("events recorded before the writes: %v", got)
	}
	if len(s.events) != len(want) {
		t.Errorf("queued %d events, want %d", len(s.events), len(want))
	}
	s.emitEvents()
	if diff := cmp.Diff(want, e.recorded()); diff != "" {
		t.Errorf("events after emitEvents (-want +got):\n%s", diff)
	}
}

func decisionScope(run *toolnexusv1alpha1.AgentRun, st *loop.State, requests map[string]*toolnexusv1alpha1.PendingRequest) *scope {
	return &scope{run: run, before: run.DeepCopy(), rec: &runstore.Record{State: st}, spec: &run.Spec, requests: requests, now: decisionNow}
}

// checkEnded checks that the run ended with reason by a message naming PendingRequest name, or
// did not end when reason is "".
func checkEnded(t *testing.T, st *loop.State, reason, name string) {
	t.Helper()
	switch {
	case reason == "" && st.Outcome != nil:
		t.Errorf("the run ended: %+v", *st.Outcome)
	case reason == "":
	case st.Outcome == nil:
		t.Errorf("the run goes on, want it ended with %s", reason)
	case st.Outcome.Reason != reason || !strings.Contains(st.Outcome.Message, "PendingRequest "+name):
		t.Errorf("the run ended with %+v, want reason %s and a message naming PendingRequest %s", *st.Outcome, reason, name)
	}
}

func TestAnnounce(t *testing.T) {
	ctx := context.Background()
	run := decisionRun("")
	plain := requestName("deploy", 1, "call_1")
	gate := waitingCall("call_1")
	gate.Request = &tools.Request{ID: "toolguard:call_1", Kind: tools.KindApproval, Prompt: "Deploy to prod?"}
	afterGate := waitingCall("call_1")
	afterGate.Approval = &tools.Answer{ID: "toolguard:call_1", OK: true}
	afterGate.Request = &tools.Request{ID: "req-call_1-own", Kind: tools.KindInput, Prompt: "Which region?"}
	// existing is a request of the plain name already in the API, edited.
	existing := func(call loop.Call, edits ...func(*toolnexusv1alpha1.PendingRequest)) func(*testing.T) []client.Object {
		return func(t *testing.T) []client.Object { return []client.Object{requestFor(t, run, call, edits...)} }
	}
	cases := []struct {
		name     string
		call     loop.Call
		existing func(*testing.T) []client.Object
		wantName string
		wantUID  string
		ended    string // the reason the run ends with, naming wantName; "" when it goes on
	}{
		{name: "a new suspension gets its request", call: expiring(waitingCall("call_1"), decisionNow.Add(time.Hour)),
			wantName: plain, wantUID: "created-" + plain},
		{name: "an identical request the run controls is adopted", call: waitingCall("call_1"),
			existing: existing(waitingCall("call_1"), answeredBy("alice", regionAnswer)), wantName: plain, wantUID: "uid-call_1"},
		{name: "a request of that name the run does not control", call: waitingCall("call_1"),
			existing: existing(waitingCall("call_1"), func(p *toolnexusv1alpha1.PendingRequest) { p.OwnerReferences = nil }),
			wantName: plain, ended: toolnexusv1alpha1.ReasonStateMismatch},
		{name: "a request of that name left by an earlier run of the same name", call: waitingCall("call_1"),
			existing: existing(waitingCall("call_1"), func(p *toolnexusv1alpha1.PendingRequest) { p.OwnerReferences[0].UID = "earlier-run-uid" }),
			wantName: plain, ended: toolnexusv1alpha1.ReasonStateMismatch},
		{name: "a request of that name showing other arguments", call: waitingCall("call_1"),
			existing: existing(waitingCall("call_1"), func(p *toolnexusv1alpha1.PendingRequest) { p.Spec.ToolCall.Arguments = `{"env":"dev"}` }),
			wantName: plain, ended: toolnexusv1alpha1.ReasonStateMismatch},
		{name: "the tool's own suspension after its approved gate gets a request of its own", call: afterGate,
			existing: existing(gate, answeredBy("alice", toolnexusv1alpha1.Answer{OK: true})),
			wantName: requestName("deploy", 1, "call_1/tool"), wantUID: "created-" + requestName("deploy", 1, "call_1/tool")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var objs []client.Object
			if tc.existing != nil {
				objs = tc.existing(t)
			}
			e := newDecisionEnv(t, objs...)
			st := stateOf(tc.call)
			s := decisionScope(run, st, map[string]*toolnexusv1alpha1.PendingRequest{})
			// As Reconcile runs the phase: it asks for the save, which comes before the next phase.
			out, err := e.r.announcePhase(ctx, s)
			if err != nil {
				t.Fatalf("announce: %v", err)
			}
			if out.save != (tc.ended == "") {
				t.Fatalf("the phase asks to save: %v; want it to when it announced (an end is saved by close)", out.save)
			}
			if out.save {
				if err := e.r.save(ctx, s); err != nil {
					t.Fatal(err)
				}
			}
			checkEnded(t, st, tc.ended, tc.wantName)
			if tc.ended != "" {
				checkNothingAnnounced(t, e, s)
				return
			}
			if diff := cmp.Diff(&loop.Announcement{Name: tc.wantName, UID: tc.wantUID}, st.Calls[0].Announced); diff != "" {
				t.Errorf("announcement (-want +got):\n%s", diff)
			}
			if p := s.requests[tc.wantName]; p == nil || string(p.UID) != tc.wantUID {
				t.Errorf("scope's requests hold %v, want %s with uid %s", p, tc.wantName, tc.wantUID)
			}
			checkStoredRequest(t, e, run, tc.call, tc.wantName, tc.wantUID)
			if tc.call.Approval != nil && tc.wantName == plain {
				t.Errorf("the tool's own request has the gate's name %s", plain)
			}
			saved, err := e.r.store.Load(ctx, run)
			if err != nil || !saved.Started() {
				t.Fatalf("the record was not saved: %v", err)
			}
			if diff := cmp.Diff(st, saved.State); diff != "" {
				t.Errorf("saved state (-in memory +saved):\n%s", diff)
			}
			if s.dirty {
				t.Error("the scope is dirty after the save")
			}
			e.checkEvents(t, s, []string{"Normal " + EventToolSuspended})
		})
	}
}

// checkStoredRequest checks the request in the API: the run controls it, it has uid, and it shows
// call as the run's spec says (the arguments the call runs with, its expiry, the run's approvers).
func checkStoredRequest(t *testing.T, e *decisionEnv, run *toolnexusv1alpha1.AgentRun, call loop.Call, name, uid string) {
	t.Helper()
	p := e.request(t, name)
	if p == nil {
		t.Fatalf("PendingRequest %s does not exist", name)
	}
	if string(p.UID) != uid || !metav1.IsControlledBy(p, run) {
		t.Errorf("PendingRequest %s has uid %s and owners %v, want uid %s controlled by the run", name, p.UID, p.OwnerReferences, uid)
	}
	want := toolnexusv1alpha1.PendingRequestSpec{
		RunRef:   toolnexusv1alpha1.RunReference{Name: "deploy"},
		ToolCall: toolnexusv1alpha1.ToolCall{ID: call.ID, Name: "deploy", Arguments: decisionArgs},
		Request: toolnexusv1alpha1.Request{ID: call.Request.ID, Kind: call.Request.Kind, Prompt: call.Request.Prompt,
			ExpiresAt: call.Request.ExpiresAt},
		Approvers: &toolnexusv1alpha1.Approvers{Users: []string{"alice"}, Groups: []string{"sre"}},
	}
	if diff := cmp.Diff(want, p.Spec); diff != "" {
		t.Errorf("PendingRequest %s spec (-want +got):\n%s", name, diff)
	}
}

// checkNothingAnnounced checks that a refused announcement changed nothing but the run's end:
// no call announced, no request adopted, no record saved, no event queued.
func checkNothingAnnounced(t *testing.T, e *decisionEnv, s *scope) {
	t.Helper()
	for _, c := range s.rec.State.Calls {
		if c.Announced != nil {
			t.Errorf("call %s announced as %+v", c.ID, *c.Announced)
		}
	}
	if len(s.requests) > 0 {
		t.Errorf("the scope holds requests %v", s.requests)
	}
	head := &toolnexusv1alpha1.AgentRunRecord{}
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: "tenant", Name: runstore.HeadName("deploy")}, head); !apierrors.IsNotFound(err) {
		t.Errorf("reading the record: %v, want NotFound", err)
	}
	if !s.dirty {
		t.Error("the ended state is not marked dirty")
	}
	e.checkEvents(t, s, nil)
}

func TestConsumeAnswers(t *testing.T) {
	ctx := context.Background()
	past := expiring(announcedCall("call_1"), decisionNow.Add(-time.Minute))
	invalid := "invalid answer: " + loop.ValidateAnswer(*announcedCall("call_1").Request, tools.Answer{OK: true}).Error()
	cases := []struct {
		name      string
		onTimeout toolnexusv1alpha1.OnTimeout
		calls     []loop.Call
		// api holds the edits of each call's request in the API, by call id; a call without an
		// entry has none (it was deleted). cached lists the call ids whose request the cache has.
		api    map[string]requestEdits
		cached []string
		// answers are what the state must have been handed, by call id, in loop semantics.
		answers map[string]tools.Answer
		ended   string
		events  []string
		// expired lists the call ids whose request must now hold the expiry answer.
		expired []string
	}{
		{name: "an answered request is consumed", calls: []loop.Call{announcedCall("call_1")},
			api:     map[string]requestEdits{"call_1": {answeredBy("alice", regionAnswer)}},
			cached:  []string{"call_1"},
			answers: map[string]tools.Answer{"call_1": regionLoopAnswer}, events: []string{"Normal " + EventRequestAnswered}},
		{name: "a request the cache has not seen yet waits, and the other calls are still consumed",
			calls: []loop.Call{announcedCall("call_1"), announcedCall("call_2")},
			api: map[string]requestEdits{"call_1": nil,
				"call_2": {answeredBy("alice", regionAnswer)}},
			cached:  []string{"call_2"},
			answers: map[string]tools.Answer{"call_2": regionLoopAnswer}, events: []string{"Normal " + EventRequestAnswered}},
		{name: "a deleted request declines its call", calls: []loop.Call{announcedCall("call_1")},
			answers: map[string]tools.Answer{"call_1": tools.AnswerDeclined("req-call_1", "the PendingRequest was deleted")},
			events:  []string{"Warning " + EventRequestDeleted}},
		{name: "a replaced request the cache has not seen ends the run", calls: []loop.Call{announcedCall("call_1")},
			api:   map[string]requestEdits{"call_1": {withUID("uid-forged"), answeredBy("mallory", regionAnswer)}},
			ended: toolnexusv1alpha1.ReasonStateMismatch},
		{name: "a replaced request in the cache ends the run, its answer unread", calls: []loop.Call{announcedCall("call_1")},
			api:    map[string]requestEdits{"call_1": {withUID("uid-forged"), answeredBy("mallory", regionAnswer)}},
			cached: []string{"call_1"}, ended: toolnexusv1alpha1.ReasonStateMismatch},
		{name: "an expired request declines its call", calls: []loop.Call{past},
			api:     map[string]requestEdits{"call_1": nil},
			cached:  []string{"call_1"},
			answers: map[string]tools.Answer{"call_1": tools.AnswerDeclined("req-call_1", tools.ReasonExpired)},
			events:  []string{"Warning " + EventRequestExpired}, expired: []string{"call_1"}},
		{name: "an expired request ends the run when onTimeout is Fail", onTimeout: toolnexusv1alpha1.OnTimeoutFail, calls: []loop.Call{past},
			api:     map[string]requestEdits{"call_1": nil},
			cached:  []string{"call_1"},
			answers: map[string]tools.Answer{"call_1": tools.AnswerDeclined("req-call_1", tools.ReasonExpired)},
			ended:   toolnexusv1alpha1.ReasonRequestExpired, events: []string{"Warning " + EventRequestExpired}, expired: []string{"call_1"}},
		{name: "a request that has not expired yet waits", calls: []loop.Call{expiring(announcedCall("call_1"), decisionNow.Add(time.Minute))},
			api:    map[string]requestEdits{"call_1": nil},
			cached: []string{"call_1"}},
		{name: "an unusable answer declines its call", calls: []loop.Call{announcedCall("call_1")},
			api:     map[string]requestEdits{"call_1": {answeredBy("alice", toolnexusv1alpha1.Answer{OK: true})}},
			cached:  []string{"call_1"},
			answers: map[string]tools.Answer{"call_1": tools.AnswerDeclined("req-call_1", invalid)},
			events:  []string{"Warning " + EventInvalidAnswer}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			run := decisionRun(tc.onTimeout)
			var objs []client.Object
			var cached []string
			for _, c := range tc.calls {
				if edits, ok := tc.api[c.ID]; ok {
					objs = append(objs, requestFor(t, run, c, edits...))
				}
				if slices.Contains(tc.cached, c.ID) {
					cached = append(cached, c.Announced.Name)
				}
			}
			e := newDecisionEnv(t, objs...)
			st := stateOf(tc.calls...)
			s := decisionScope(run, st, e.cached(t, cached...))
			if err := settleRequests(ctx, e.r, s); err != nil {
				t.Fatalf("settleRequests: %v", err)
			}

			want := stateOf(tc.calls...)
			for _, c := range tc.calls {
				if a, ok := tc.answers[c.ID]; ok {
					if err := want.Answer(c.ID, a); err != nil {
						t.Fatalf("the case's answer to %s: %v", c.ID, err)
					}
				}
			}
			checkEnded(t, st, tc.ended, tc.calls[0].Announced.Name)
			want.Outcome = st.Outcome
			if diff := cmp.Diff(want, st); diff != "" {
				t.Errorf("state (-want +got):\n%s", diff)
			}
			if wantDirty := len(tc.answers) > 0 || tc.ended != ""; s.dirty != wantDirty {
				t.Errorf("dirty = %t, want %t", s.dirty, wantDirty)
			}
			for _, id := range tc.expired {
				checkExpiryAnswer(t, e.request(t, requestName("deploy", 1, id)))
			}
			e.checkEvents(t, s, tc.events)
		})
	}
}

// settleRequests is what a reconcile does with a parked run's requests: read them as Settle needs
// them, settle, and carry out what it decides.
func settleRequests(ctx context.Context, r *Reconciler, s *scope) error {
	seen, err := r.seen(ctx, s)
	if err != nil {
		return err
	}
	_, err = r.settle(ctx, s, nil, seen)
	return err
}

// An answer that reached the API server after the cache's copy was listed, but before the
// controller's expiry write, is kept (the server refuses to change an answer: Invalid), so the
// call must not be declined as expired: the answer the request shows is the one the run uses.
func TestConsumeAnswersKeepsALateAnswerOverExpiry(t *testing.T) {
	run := decisionRun(toolnexusv1alpha1.OnTimeoutFail)
	call := expiring(announcedCall("call_1"), decisionNow.Add(-time.Minute))
	e := newDecisionEnv(t, requestFor(t, run, call, answeredBy("alice", regionAnswer)))
	stale := map[string]*toolnexusv1alpha1.PendingRequest{call.Announced.Name: requestFor(t, run, call)}
	st := stateOf(call)
	s := decisionScope(run, st, stale)
	if err := settleRequests(context.Background(), e.r, s); err != nil {
		t.Fatalf("settleRequests: %v", err)
	}
	checkEnded(t, st, "", call.Announced.Name)
	if c := st.Calls[0]; c.Phase == loop.PhaseDone {
		t.Errorf("call %s done with answer %+v, want it waiting for, or run with, alice's answer", c.ID, c.Answer)
	}
	if p := e.request(t, call.Announced.Name); p.Status.AnsweredBy != "alice" {
		t.Errorf("PendingRequest %s answered by %s, want alice", p.Name, p.Status.AnsweredBy)
	}
	s.emitEvents()
	if got := e.recorded(); slices.Contains(got, "Warning "+EventRequestExpired) {
		t.Errorf("events %v report an expiry", got)
	}
}

// checkExpiryAnswer checks that the controller answered p as expired, now.
func checkExpiryAnswer(t *testing.T, p *toolnexusv1alpha1.PendingRequest) {
	t.Helper()
	want := toolnexusv1alpha1.PendingRequestStatus{
		Answer:     &toolnexusv1alpha1.Answer{OK: false, Reason: tools.ReasonExpired},
		AnsweredBy: toolnexusv1alpha1.ExpiredAnswerer, AnsweredAt: &metav1.Time{Time: decisionNow},
	}
	if diff := cmp.Diff(want, p.Status); diff != "" {
		t.Errorf("PendingRequest %s status (-want +got):\n%s", p.Name, diff)
	}
}

func TestSyncRequests(t *testing.T) {
	ctx := context.Background()
	declined := toolnexusv1alpha1.Answer{OK: false, Reason: tools.ReasonDeclined}
	expired := toolnexusv1alpha1.Answer{OK: false, Reason: tools.ReasonExpired}
	approved := toolnexusv1alpha1.Answer{OK: true}
	cases := []struct {
		name string
		// answer is the request's answer, by answeredBy; handed is what the saved state was
		// handed; movedOn and ended say the turn moved on or the run ended.
		answer         *toolnexusv1alpha1.Answer
		answeredBy     string
		handed         *tools.Answer
		movedOn, ended bool
		// ran: the call ran with the answer; nextGate: it waits on a later gate of its call.
		ran, nextGate bool
		// staleCache: the cache's copy does not show the answer yet.
		staleCache      bool
		phase           toolnexusv1alpha1.RequestPhase
		answered, resol string // status/reason of the Answered and Resolved conditions
	}{
		{name: "the call waits", phase: toolnexusv1alpha1.RequestPhaseWaiting,
			answered: "False/AwaitingAnswer", resol: "False/AnswerNotConsumed"},
		{name: "answered, the call still suspended in the saved state", answer: &regionAnswer, answeredBy: "alice",
			phase: toolnexusv1alpha1.RequestPhaseAnswered, answered: "True/Answered", resol: "False/AnswerNotConsumed"},
		{name: "answered and taken in, the call not run with it yet", answer: &regionAnswer, answeredBy: "alice", handed: &regionLoopAnswer,
			phase: toolnexusv1alpha1.RequestPhaseAnswered, answered: "True/Answered", resol: "False/AnswerTaken"},
		{name: "answered, and the call ran with it", answer: &regionAnswer, answeredBy: "alice", handed: &regionLoopAnswer, ran: true,
			phase: toolnexusv1alpha1.RequestPhaseAnswered, answered: "True/Answered", resol: "True/AnswerConsumed"},
		{name: "approved a gate, the call waits on its next", answer: &approved, answeredBy: "alice", nextGate: true,
			phase: toolnexusv1alpha1.RequestPhaseAnswered, answered: "True/Answered", resol: "True/GatePassed"},
		{name: "answered, and the turn moved on", answer: &regionAnswer, answeredBy: "alice", movedOn: true,
			phase: toolnexusv1alpha1.RequestPhaseAnswered, answered: "True/Answered", resol: "True/AnswerConsumed"},
		{name: "declined, the call done", answer: &declined, answeredBy: "bob", handed: &tools.Answer{Reason: tools.ReasonDeclined},
			phase: toolnexusv1alpha1.RequestPhaseAnswered, answered: "True/Declined", resol: "True/AnswerConsumed"},
		{name: "expired, the call done", answer: &expired, answeredBy: toolnexusv1alpha1.ExpiredAnswerer,
			handed: &tools.Answer{Reason: tools.ReasonExpired},
			phase:  toolnexusv1alpha1.RequestPhaseExpired, answered: "True/Expired", resol: "True/AnswerConsumed"},
		{name: "expired by this manager, the cache not showing the answer yet", answer: &expired, answeredBy: toolnexusv1alpha1.ExpiredAnswerer,
			handed: &tools.Answer{Reason: tools.ReasonExpired}, staleCache: true,
			phase: toolnexusv1alpha1.RequestPhaseExpired, answered: "True/Expired", resol: "True/AnswerConsumed"},
		{name: "an expiry a user wrote is a refusal", answer: &expired, answeredBy: "bob", handed: &tools.Answer{Reason: tools.ReasonExpired},
			phase: toolnexusv1alpha1.RequestPhaseAnswered, answered: "True/Declined", resol: "True/AnswerConsumed"},
		{name: "the run ended unanswered", ended: true, phase: toolnexusv1alpha1.RequestPhaseCancelled,
			answered: "False/RunGone", resol: "True/RunGone"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			run, call := decisionRun(""), announcedCall("call_1")
			edits := requestEdits{func(p *toolnexusv1alpha1.PendingRequest) { p.Generation = 3 }}
			if tc.answer != nil {
				edits = append(edits, answeredBy(tc.answeredBy, *tc.answer))
			}
			e := newDecisionEnv(t, requestFor(t, run, call, edits...))
			st := stateOf(call)
			if tc.handed != nil {
				if err := st.Answer(call.ID, *tc.handed); err != nil {
					t.Fatal(err)
				}
			}
			if tc.ran {
				st.Calls[0].Phase, st.Calls[0].Result = loop.PhaseDone, &tools.ToolResult{Output: "deployed"}
			}
			if tc.nextGate {
				c := &st.Calls[0]
				c.Gated, c.Gate, c.Passed = true, &loop.Gate{Key: "run"}, []string{"policy/prod"}
				c.Request = &tools.Request{ID: "toolguard:call_1", Kind: tools.KindApproval}
				c.Announced = &loop.Announcement{Name: requestName("deploy", 1, "call_1/gate-1"), UID: "uid-later"}
			}
			if tc.movedOn {
				st.Turn, st.Calls = 2, nil
			}
			if tc.ended {
				st.End(toolnexusv1alpha1.ReasonCancelled, "The run was cancelled (spec.cancel)")
			}
			cached := e.cached(t, call.Announced.Name)
			if tc.staleCache {
				p := cached[call.Announced.Name]
				p.Status.Answer, p.Status.AnsweredBy, p.Status.AnsweredAt = nil, "", nil
			}
			if err := e.r.syncRequests(ctx, decisionScope(run, st, cached)); err != nil {
				t.Fatalf("syncRequests: %v", err)
			}
			if e.statusPatches != 1 {
				t.Errorf("%d status patches, want 1", e.statusPatches)
			}
			p := e.request(t, call.Announced.Name)
			want := map[string]string{toolnexusv1alpha1.ConditionAnswered: tc.answered, toolnexusv1alpha1.ConditionResolved: tc.resol}
			if diff := cmp.Diff(want, requestConditions(t, p, 3)); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
			if p.Status.Phase != tc.phase || p.Status.ObservedGeneration != 3 {
				t.Errorf("phase %s, observedGeneration %d; want %s, 3", p.Status.Phase, p.Status.ObservedGeneration, tc.phase)
			}

			// The next reconcile, with nothing changed, reads the request back and writes nothing.
			if err := e.r.syncRequests(ctx, decisionScope(run, st, e.cached(t, call.Announced.Name))); err != nil {
				t.Fatalf("second syncRequests: %v", err)
			}
			if e.statusPatches != 1 {
				t.Errorf("the second sync sent %d status patches, want none", e.statusPatches-1)
			}
		})
	}
}

// A run that ended while its call's answer waited unconsumed never used the answer: its request
// must not say it did.
func TestSyncRequestsOfARunEndedBeforeItsAnswerWasConsumed(t *testing.T) {
	run, call := decisionRun(""), announcedCall("call_1")
	e := newDecisionEnv(t, requestFor(t, run, call, answeredBy("alice", regionAnswer)))
	st := stateOf(call)
	st.End(toolnexusv1alpha1.ReasonCancelled, "The run was cancelled (spec.cancel)")
	if err := e.r.syncRequests(context.Background(), decisionScope(run, st, e.cached(t, call.Announced.Name))); err != nil {
		t.Fatalf("syncRequests: %v", err)
	}
	got := requestConditions(t, e.request(t, call.Announced.Name), 1)
	if r := got[toolnexusv1alpha1.ConditionResolved]; r != "True/"+toolnexusv1alpha1.ReasonRunGone {
		t.Errorf("Resolved is %s, want True/%s", r, toolnexusv1alpha1.ReasonRunGone)
	}
}

// requestConditions is p's conditions as type → status/reason, each checked to be stamped with
// generation.
func requestConditions(t *testing.T, p *toolnexusv1alpha1.PendingRequest, generation int64) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, c := range p.Status.Conditions {
		out[c.Type] = string(c.Status) + "/" + c.Reason
		if c.ObservedGeneration != generation {
			t.Errorf("condition %s has observedGeneration %d, want %d", c.Type, c.ObservedGeneration, generation)
		}
	}
	return out
}

// TestSettleReasonsAreConditionReasons: the ends Settle decides are reported as the Succeeded
// condition's reason, so their names are the API's.
func TestSettleReasonsAreConditionReasons(t *testing.T) {
	for got, want := range map[string]string{
		state.ReasonCancelled: toolnexusv1alpha1.ReasonCancelled, state.ReasonRequestExpired: toolnexusv1alpha1.ReasonRequestExpired,
		state.ReasonStateMismatch: toolnexusv1alpha1.ReasonStateMismatch, state.ReasonModelError: toolnexusv1alpha1.ReasonModelError,
		state.ReasonInvalidSpec: toolnexusv1alpha1.ReasonInvalidSpec,
	} {
		if got != want {
			t.Errorf("state reason %q, API reason %q", got, want)
		}
	}
}

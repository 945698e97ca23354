package controller

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
	"github.com/toolnexus/operator/internal/record"
)

// A run's record lives in AgentRunRecords, a kind only the manager may write (see
// config/rbac): nothing the controller decides from can be changed by a namespace editor.
//
//   - the head, named like the run: the loop state of the current turn and the messages not yet
//     sealed. It is rewritten after every step.
//   - sealed segments, <run>.seg-<n>: older messages and tool-call summaries, written once when
//     the head grows past sealAt and never changed again.
//
// So a step writes one object whose size is bounded by sealAt, however long the transcript gets,
// and a transcript can outgrow one object's size limit. Every record names its run by UID, and a
// record that names another run is never read as this run's.
const (
	// sealAt is the compressed head size past which its messages move into a sealed segment.
	sealAt = 256 * 1024
	// DefaultMaxTranscriptBytes bounds a run's stored transcript, compressed.
	DefaultMaxTranscriptBytes = 64 << 20
	// DefaultMaxTranscriptRawBytes bounds a run's transcript decoded: what a reconcile holds in
	// memory. Compressible tool output must not grow past it however well it compresses.
	DefaultMaxTranscriptRawBytes = 32 << 20
	// sealedOutputBytes is how much of a tool call's output its sealed summary keeps: the whole
	// output is in the transcript's tool message already.
	sealedOutputBytes = 1024
)

// errRecordTooLarge is returned by saveRecord when the transcript outgrows what a run can store.
var errRecordTooLarge = errors.New("the transcript outgrew what a run may store")

// corruptError says the stored record cannot be used: retrying cannot help, so the run ends with
// the error's reason.
type corruptError struct {
	reason string
	err    error
}

func (e *corruptError) Error() string { return e.err.Error() }
func (e *corruptError) Unwrap() error { return e.err }

func corrupt(format string, args ...any) error {
	return &corruptError{reason: toolnexusv1alpha1.ReasonTranscriptCorrupt, err: fmt.Errorf(format, args...)}
}

func mismatch(format string, args ...any) error {
	return &corruptError{reason: toolnexusv1alpha1.ReasonStateMismatch, err: fmt.Errorf(format, args...)}
}

// runRecord is a run's loop state with where it is stored. In memory State is whole; in the
// cluster its sealed prefix lives in segments.
type runRecord struct {
	State    *loop.State
	segments []record.SegmentRef
	// agent is the snapshot of the Agent a run of an agent runs with; nil for an inline spec, and
	// before a run of an agent resolved its Agent.
	agent *record.AgentSnapshot
	// head is the object the record was read from or last written to; nil before the first save.
	head *toolnexusv1alpha1.AgentRunRecord
	// unread says the record was not read: the run was taken for new (see loadRecord).
	unread bool
}

// started reports whether the record was ever saved, i.e. the run has taken a step.
func (rec *runRecord) started() bool { return rec.head != nil }

// recordName is the name of the head (n = 0) or of segment n of a run's record.
func recordName(run string, n int) string {
	if n == 0 {
		return run
	}
	suffix := ".seg-" + strconv.Itoa(n)
	if len(run)+len(suffix) <= maxNameLen {
		return run + suffix
	}
	sum := sha256.Sum256([]byte(run))
	short := run[:maxNameLen-len(suffix)-9] + "-" + hex.EncodeToString(sum[:])[:8]
	return short + suffix
}

// loadRecord reads the run's record: the one a finished step started from (o), as the reconcile
// that submitted the step left it (no read: nothing can fail between taking the outcome and
// applying it), or else the API's (see headOf), never the informer's, which may lag
// behind the previous step's write: re-running a step because of a stale read would repeat a
// model call. A missing head means the run has not started, unless its status says it has: then
// the record was deleted, and the run fails closed rather than start over.
//
// A run that this process has not seen save a record and whose status says it never started is
// not read at all: its first save creates the head before anything runs, and finds a head that
// exists after all (an earlier process saved it and stopped before the status said so, or a
// deleted run of the same name left it) then (see createHead). A reconcile that ends without
// saving checks the record before it reports anything (see checkUnread).
func (r *AgentRunReconciler) loadRecord(ctx context.Context, run *toolnexusv1alpha1.AgentRun, o *stepOutcome) (*runRecord, error) {
	if o != nil {
		return o.from, nil
	}
	fresh := &runRecord{State: loop.NewState(run.Spec.Prompt)}
	if _, seen := r.steps.headVersion(runKey(run), run.UID); !seen && !run.Status.Started() {
		fresh.unread = true
		return fresh, nil
	}
	head, opts, err := r.headOf(ctx, run)
	if apierrors.IsNotFound(err) {
		if run.Status.Started() {
			return nil, mismatch("the run has started but its record AgentRunRecord %s is gone", recordName(run.Name, 0))
		}
		return fresh, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the run's record: %w", err)
	}
	if head.Run.UID != string(run.UID) {
		if err := r.deleteEarlierHead(ctx, run, head); err != nil {
			return nil, err
		}
		return fresh, nil
	}
	if head.Part != toolnexusv1alpha1.RecordPartHead {
		return nil, mismatch("AgentRunRecord %s is a %s, not the head of the run's record", head.Name, head.Part)
	}
	h := &record.Head{}
	budget := r.maxTranscriptRawBytes()
	n, err := record.Decode(head.Data, h, budget)
	if err != nil {
		return nil, corrupt("decoding the record AgentRunRecord %s: %w", head.Name, err)
	}
	if h.State == nil {
		return nil, corrupt("decoding the record AgentRunRecord %s: it holds no state", head.Name)
	}
	budget -= n
	segs := make([]*record.Segment, len(h.Segments))
	for i, ref := range h.Segments {
		if segs[i], n, err = r.loadSegment(ctx, run, i+1, ref, budget, opts); err != nil {
			return nil, err
		}
		budget -= n
	}
	if err := record.Join(h, segs); err != nil {
		return nil, corrupt("%w", err)
	}
	return &runRecord{State: h.State, segments: h.Segments, agent: h.Agent, head: head}, nil
}

var recordsResource = toolnexusv1alpha1.GroupVersion.WithResource("agentrunrecords").GroupResource()

// savedEarlier is the conflict of a run taken for new whose record an earlier process saved.
func savedEarlier(name string) error {
	return apierrors.NewConflict(recordsResource, name, errors.New("an earlier process saved the run's record; it is read again"))
}

// checkUnread reads the record of a run that was taken for new and waits before its first save
// (for a Secret, for its Agent): an earlier process may have saved it after all, and then what
// this reconcile decided from a new state is not reported; the run is read again.
func (r *AgentRunReconciler) checkUnread(ctx context.Context, run *toolnexusv1alpha1.AgentRun, rec *runRecord) error {
	if !rec.unread || rec.started() {
		return nil
	}
	r.steps.sawHead(runKey(run), run.UID, "") // read from etcd
	stored, err := r.loadRecord(ctx, run, nil)
	if err == nil && stored.started() {
		err = savedEarlier(recordName(run.Name, 0))
	}
	return err
}

// headOf reads the head of the run's record from the API, and returns the options its segments
// are read with.
//
// When this process wrote or read the head before (a parked run woken by its answer), the read
// asks for a version not older than that one: the API server answers from its watch cache, which
// holds every write up to the moment it answers (a write of the last milliseconds aside: a
// rewrite that lands then makes the save after the step conflict, and the step is taken again
// from a quorum read; a watch cache that lags waits up to a few seconds before the API server
// gives up, and the read falls back to etcd). Without such a version (the run is new to this
// process), the read is a quorum read from etcd.
func (r *AgentRunReconciler) headOf(ctx context.Context, run *toolnexusv1alpha1.AgentRun) (*toolnexusv1alpha1.AgentRunRecord, *client.GetOptions, error) {
	name := recordName(run.Name, 0)
	opts := &client.GetOptions{}
	key, objKey := runKey(run), client.ObjectKey{Namespace: run.Namespace, Name: name}
	head := &toolnexusv1alpha1.AgentRunRecord{}
	if rv, _ := r.steps.headVersion(key, run.UID); rv != "" {
		err := r.APIReader.Get(ctx, objKey, head, &client.GetOptions{Raw: &metav1.GetOptions{ResourceVersion: rv}})
		if err == nil {
			// Its segments, written before it, are read not older than the head as it was found
			// (another writer may have moved it past rv).
			return head, &client.GetOptions{Raw: &metav1.GetOptions{ResourceVersion: head.ResourceVersion}}, nil
		}
		if apierrors.IsNotFound(err) {
			return head, opts, err
		}
		// The watch cache did not catch up in time, or is off: read from etcd.
	}
	err := r.APIReader.Get(ctx, objKey, head, opts)
	if err == nil {
		r.steps.sawHead(key, run.UID, head.ResourceVersion)
	}
	return head, opts, err
}

func (r *AgentRunReconciler) loadSegment(ctx context.Context, run *toolnexusv1alpha1.AgentRun, n int, ref record.SegmentRef, budget int, opts *client.GetOptions) (*record.Segment, int, error) {
	obj := &toolnexusv1alpha1.AgentRunRecord{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: run.Namespace, Name: ref.Name}, obj, opts); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, 0, mismatch("segment AgentRunRecord %s of the run's record is gone", ref.Name)
		}
		return nil, 0, fmt.Errorf("reading segment AgentRunRecord %s: %w", ref.Name, err)
	}
	if obj.Run.UID != string(run.UID) || obj.Part != toolnexusv1alpha1.RecordPartSegment || int(obj.Index) != n {
		return nil, 0, mismatch("AgentRunRecord %s is not segment %d of this run's record", ref.Name, n)
	}
	seg := &record.Segment{}
	size, err := record.Decode(obj.Data, seg, budget)
	if err != nil {
		return nil, 0, corrupt("decoding segment AgentRunRecord %s: %w", ref.Name, err)
	}
	return seg, size, nil
}

// saveRecord writes the head with optimistic concurrency (a conflict means another writer moved
// the run on, and the caller must start over from a fresh read), sealing a segment first when the
// head has grown past sealAt.
func (r *AgentRunReconciler) saveRecord(ctx context.Context, run *toolnexusv1alpha1.AgentRun, rec *runRecord) error {
	data, raw, err := record.EncodeHead(rec.State, rec.segments, rec.agent)
	if err != nil {
		return fmt.Errorf("encoding the record: %w", err)
	}
	if len(data) > sealAt {
		if err := r.seal(ctx, run, rec); err != nil {
			return err
		}
		if data, raw, err = record.EncodeHead(rec.State, rec.segments, rec.agent); err != nil {
			return fmt.Errorf("encoding the record: %w", err)
		}
	}
	h := record.Head{Segments: rec.segments}
	if _, _, size, rawSize := h.Sealed(); len(data) > toolnexusv1alpha1.MaxRecordDataBytes ||
		size+len(data) > r.maxTranscriptBytes() || rawSize+raw > r.maxTranscriptRawBytes() {
		return errRecordTooLarge
	}
	var obj *toolnexusv1alpha1.AgentRunRecord
	if rec.head == nil {
		if obj, err = r.recordObject(run, 0, data); err != nil {
			return err
		}
		err = r.createHead(ctx, run, obj)
	} else {
		obj, err = r.updateHead(ctx, rec.head, data)
	}
	if err != nil {
		// Whatever the record holds now is read from etcd next time.
		r.steps.sawHead(runKey(run), run.UID, "")
		return fmt.Errorf("saving the record: %w", err)
	}
	rec.head = obj
	r.steps.sawHead(runKey(run), run.UID, obj.ResourceVersion)
	return nil
}

// createHead creates the run's head. One that exists already was left by a deleted run of the
// same name, and is replaced; or an earlier process saved it for this run: then what this
// reconcile did is stale, and the save conflicts (the run is read again).
func (r *AgentRunReconciler) createHead(ctx context.Context, run *toolnexusv1alpha1.AgentRun, obj *toolnexusv1alpha1.AgentRunRecord) error {
	err := r.Create(ctx, obj)
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	existing := &toolnexusv1alpha1.AgentRunRecord{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(obj), existing); err != nil {
		return err
	}
	if existing.Run.UID == string(run.UID) {
		return savedEarlier(obj.Name)
	}
	if err := r.deleteEarlierHead(ctx, run, existing); err != nil {
		return err
	}
	return r.Create(ctx, obj)
}

// deleteEarlierHead deletes a head that is not run's: one left by a deleted run of the same name
// that the garbage collector has not removed yet. Any other fails the run closed.
func (r *AgentRunReconciler) deleteEarlierHead(ctx context.Context, run *toolnexusv1alpha1.AgentRun, head *toolnexusv1alpha1.AgentRunRecord) error {
	notOurs := mismatch("AgentRunRecord %s belongs to run %s (uid %s), not to this run; rename the run", head.Name, head.Run.Name, head.Run.UID)
	if head.Run.Name != run.Name || run.Status.Started() {
		return notOurs
	}
	// The run it names must be gone: a stale copy of this run must not delete a newer namesake's.
	live := &toolnexusv1alpha1.AgentRun{}
	err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(run), live)
	if err == nil && string(live.UID) == head.Run.UID {
		return notOurs
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading run %s: %w", run.Name, err)
	}
	err = r.Delete(ctx, head, client.Preconditions{UID: &head.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the record AgentRunRecord %s of an earlier run named %s: %w", head.Name, run.Name, err)
	}
	return nil
}

// updateHead replaces the head's data, keeping whatever else was put on the object (labels,
// annotations: backup tools run with rights tenants do not have). The write is conditional on
// the resourceVersion; when it conflicts because only the object's metadata changed, the record
// is still the one this manager read, and the write is retried on the fresh object. Changed data
// means another writer moved the run on.
func (r *AgentRunReconciler) updateHead(ctx context.Context, head *toolnexusv1alpha1.AgentRunRecord, data []byte) (*toolnexusv1alpha1.AgentRunRecord, error) {
	obj := head.DeepCopy()
	obj.Data = data
	obj.ManagedFields = nil // left out, the server keeps them; sent back, they cost a comparison
	err := r.Update(ctx, obj)
	if !apierrors.IsConflict(err) {
		return obj, err
	}
	fresh := &toolnexusv1alpha1.AgentRunRecord{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(head), fresh); err != nil {
		return nil, err
	}
	if !bytes.Equal(fresh.Data, head.Data) {
		return nil, err
	}
	fresh.Data = data
	return fresh, r.Update(ctx, fresh)
}

// seal moves the unsealed messages and tool calls into a new segment. The segment is written
// before the head that refers to it, so a crash in between leaves an unreferenced segment that
// the next attempt overwrites.
func (r *AgentRunReconciler) seal(ctx context.Context, run *toolnexusv1alpha1.AgentRun, rec *runRecord) error {
	h := record.Head{Segments: rec.segments}
	msgs, calls, size, rawSize := h.Sealed()
	seg := record.Segment{Messages: rec.State.Messages[msgs:]}
	for _, c := range rec.State.ToolCalls[calls:] {
		c.Output = truncate(c.Output, sealedOutputBytes)
		seg.ToolCalls = append(seg.ToolCalls, c)
	}
	data, raw, err := record.Encode(&seg)
	if err != nil {
		return fmt.Errorf("encoding a record segment: %w", err)
	}
	if len(data) > toolnexusv1alpha1.MaxRecordDataBytes || size+len(data) > r.maxTranscriptBytes() || rawSize+raw > r.maxTranscriptRawBytes() {
		return errRecordTooLarge
	}
	n := len(rec.segments) + 1
	obj, err := r.recordObject(run, n, data)
	if err != nil {
		return err
	}
	err = r.Create(ctx, obj)
	if apierrors.IsAlreadyExists(err) {
		old := &toolnexusv1alpha1.AgentRunRecord{}
		if err = r.APIReader.Get(ctx, client.ObjectKeyFromObject(obj), old); err == nil {
			if old.Run.UID != string(run.UID) {
				return mismatch("AgentRunRecord %s belongs to run %s, not to this run; rename the run", old.Name, old.Run.Name)
			}
			obj.ResourceVersion = old.ResourceVersion
			err = r.Update(ctx, obj)
		}
	}
	if err != nil {
		return fmt.Errorf("saving record segment %s: %w", obj.Name, err)
	}
	rec.segments = append(rec.segments, record.SegmentRef{Name: obj.Name,
		Messages: len(seg.Messages), ToolCalls: len(seg.ToolCalls), Bytes: len(data), RawBytes: raw})
	// The sealed summaries replace the whole ones in memory too, so memory matches what a fresh
	// load would read.
	copy(rec.State.ToolCalls[calls:], seg.ToolCalls)
	return nil
}

func (r *AgentRunReconciler) maxTranscriptBytes() int {
	if r.MaxTranscriptBytes > 0 {
		return r.MaxTranscriptBytes
	}
	return DefaultMaxTranscriptBytes
}

func (r *AgentRunReconciler) maxTranscriptRawBytes() int {
	if r.MaxTranscriptRawBytes > 0 {
		return r.MaxTranscriptRawBytes
	}
	return DefaultMaxTranscriptRawBytes
}

func (r *AgentRunReconciler) recordObject(run *toolnexusv1alpha1.AgentRun, n int, data []byte) (*toolnexusv1alpha1.AgentRunRecord, error) {
	part := toolnexusv1alpha1.RecordPartHead
	if n > 0 {
		part = toolnexusv1alpha1.RecordPartSegment
	}
	obj := &toolnexusv1alpha1.AgentRunRecord{
		ObjectMeta: metav1.ObjectMeta{
			Name: recordName(run.Name, n), Namespace: run.Namespace, Labels: runLabels(run),
		},
		Run:  toolnexusv1alpha1.RecordRunReference{Name: run.Name, UID: string(run.UID)},
		Part: part, Index: int32(n), Encoding: toolnexusv1alpha1.RecordEncoding, Data: data,
	}
	return obj, controllerutil.SetControllerReference(run, obj, r.Scheme)
}

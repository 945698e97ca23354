// Package runstore keeps an AgentRun's durable record: the loop state and transcript, as gzipped
// JSON in AgentRunRecords the run owns, a kind only the manager may write (see config/rbac), so
// nothing the controller decides from can be changed by a namespace editor. The manager loads and
// saves records through a Store; the kubectl plugin reads them with Read. Both check a record the
// same way: every object names its run by UID and its place, and every decode goes through a size
// limit, so a damaged or hostile record can never make its reader allocate without bound.
//
// A record is
//
//   - the head, named like the run (index 0): the loop state of the current turn and the messages
//     not yet sealed. It is rewritten after every step and stays within sealAt: past it, its
//     messages move into a sealed segment, and if the state is still too big (the finished
//     results or the arguments of the calls of the current turn), the state moves into a spill;
//   - parts, <run>.seg-<n> (index n): the data of sealed segments (older messages and tool-call
//     summaries) and of the spill, each split across as many consecutive parts as it needs (one
//     part holds MaxRecordDataBytes), so any message a tool or a model may return can be stored.
//     A part is written once and never changed while the head names it: a save writes new parts
//     only past every index the saved head names, and a spill the new head no longer names is
//     deleted once it is saved.
//
// So a step writes one bounded head, and new parts only when it seals or spills.
package runstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/kube"
	"github.com/toolnexus/operator/internal/loop/state"
)

const (
	// sealAt is the compressed head size past which its messages move into a sealed segment, and
	// past which, once they have, its state moves into a spill.
	sealAt = 256 * 1024
	// DefaultMaxBytes bounds a run's stored record, compressed.
	DefaultMaxBytes = 64 << 20
	// DefaultMaxRawBytes bounds a run's record decoded: what a reconcile holds in memory.
	// Compressible tool output must not grow past it however well it compresses.
	DefaultMaxRawBytes = 32 << 20
	// sealedOutputBytes is how much of a tool call's output its sealed summary keeps: the whole
	// output is in the transcript's tool message already.
	sealedOutputBytes = 1024
)

// Limits bound what a run's record may hold; zero means the default.
type Limits struct {
	// MaxBytes bounds the record compressed, all its objects together (--max-transcript-size).
	MaxBytes int
	// MaxRawBytes bounds the record decoded (--max-transcript-decoded-size).
	MaxRawBytes int
}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxRawBytes <= 0 {
		l.MaxRawBytes = DefaultMaxRawBytes
	}
	return l
}

// Record is a run's loop state with where it is stored. In memory State is whole; in the
// cluster its sealed prefix lives in segments.
type Record struct {
	State *state.State
	// Agent is the snapshot of the Agent a run of an agent runs with; nil for an inline spec, and
	// before a run of an agent resolved its Agent.
	Agent *AgentSnapshot
	// Head is the object the record was read from or last written to; nil before the first save.
	Head *toolnexusv1alpha1.AgentRunRecord

	segments []SegmentRef
	spill    *Blob
	// unread says the record was not read: the run was taken for new (see Load).
	unread bool
}

// Started reports whether the record was ever saved, i.e. the run has taken a step.
func (rec *Record) Started() bool { return rec.Head != nil }

// next is the first index past every part the record's head names.
func (rec *Record) next() int {
	last := 0
	if n := len(rec.segments); n > 0 {
		last = rec.segments[n-1].last()
	}
	if rec.spill != nil {
		last = max(last, rec.spill.last())
	}
	return last + 1
}

// Store loads and saves the records of the manager's runs. It remembers, per run, the head's
// resourceVersion as this process last wrote or read it, so a record is read never older than
// what this process saw, from the API server's watch cache rather than etcd when it can be.
type Store struct {
	client client.Client
	// reader reads around the cache: the manager keeps no informer of records.
	reader client.Reader
	scheme *runtime.Scheme
	limits Limits

	mu       sync.Mutex
	versions map[types.NamespacedName]version
}

// version is the resourceVersion of the head of the record of the run with uid.
type version struct {
	uid types.UID
	rv  string
}

// New returns a Store that writes with c and reads with reader (the manager's API reader).
func New(c client.Client, reader client.Reader, scheme *runtime.Scheme, limits Limits) *Store {
	return &Store{client: c, reader: reader, scheme: scheme, limits: limits.withDefaults(),
		versions: map[types.NamespacedName]version{}}
}

// Limits are the bounds the store keeps records within.
func (s *Store) Limits() Limits { return s.limits }

// Forget drops what the store remembers of a run that is gone or has ended.
func (s *Store) Forget(key types.NamespacedName) {
	s.mu.Lock()
	delete(s.versions, key)
	s.mu.Unlock()
}

// sawHead remembers the resourceVersion of the run's record head as this process wrote or read
// it; "" after a failed save (another writer may have moved the record on: it is read from etcd).
func (s *Store) sawHead(run *toolnexusv1alpha1.AgentRun, rv string) {
	s.mu.Lock()
	s.versions[keyOf(run)] = version{uid: run.UID, rv: rv}
	s.mu.Unlock()
}

// headVersion is the resourceVersion of the run's record head as this process last wrote or read
// it ("" when that is unknown), and whether this process saw the head, or tried to save it, at all.
func (s *Store) headVersion(run *toolnexusv1alpha1.AgentRun) (rv string, seen bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.versions[keyOf(run)]
	if !ok || v.uid != run.UID {
		return "", false
	}
	return v.rv, true
}

func keyOf(run *toolnexusv1alpha1.AgentRun) types.NamespacedName {
	return types.NamespacedName{Namespace: run.Namespace, Name: run.Name}
}

// Load reads the run's record from the API (see headOf), never from an informer, which may lag
// behind the previous step's write: re-running a step because of a stale read would repeat a
// model call. A missing head means the run has not started, unless its status says it has: then
// the record was deleted, and the run fails closed rather than start over.
//
// A run that this process has not seen save a record and whose status says it never started is
// not read at all: its first save creates the head before anything runs, and finds a head that
// exists after all (an earlier process saved it and stopped before the status said so, or a
// deleted run of the same name left it) then (see createHead). A reconcile that ends without
// saving checks the record before it reports anything (see CheckUnread).
func (s *Store) Load(ctx context.Context, run *toolnexusv1alpha1.AgentRun) (*Record, error) {
	fresh := &Record{State: state.New(run.Spec.Prompt)}
	if _, seen := s.headVersion(run); !seen && !run.Status.Started() {
		fresh.unread = true
		return fresh, nil
	}
	head, opts, err := s.headOf(ctx, run)
	if apierrors.IsNotFound(err) {
		if run.Status.Started() {
			return nil, mismatch("the run has started but its record AgentRunRecord %s is gone", HeadName(run.Name))
		}
		return fresh, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the run's record: %w", err)
	}
	if head.Run.UID != string(run.UID) {
		if err := s.deleteEarlierHead(ctx, run, head); err != nil {
			return nil, err
		}
		return fresh, nil
	}
	return decodeRecord(ctx, s.reader, run, head, s.limits.MaxRawBytes, opts)
}

var recordsResource = toolnexusv1alpha1.GroupVersion.WithResource("agentrunrecords").GroupResource()

// savedEarlier is the conflict of a run taken for new whose record an earlier process saved.
func savedEarlier(name string) error {
	return apierrors.NewConflict(recordsResource, name, errors.New("an earlier process saved the run's record; it is read again"))
}

// CheckUnread reads the record of a run that was taken for new and waits before its first save
// (for a Secret, for its Agent): an earlier process may have saved it after all, and then what
// this reconcile decided from a new state is not reported; the run is read again.
func (s *Store) CheckUnread(ctx context.Context, run *toolnexusv1alpha1.AgentRun, rec *Record) error {
	if !rec.unread || rec.Started() {
		return nil
	}
	s.sawHead(run, "") // read from etcd
	stored, err := s.Load(ctx, run)
	if err == nil && stored.Started() {
		err = savedEarlier(HeadName(run.Name))
	}
	return err
}

// headOf reads the head of the run's record from the API, and returns the options its parts are
// read with.
//
// When this process wrote or read the head before (a parked run woken by its answer), the read
// asks for a version not older than that one: the API server answers from its watch cache, which
// holds every write up to the moment it answers (a write of the last milliseconds aside: a
// rewrite that lands then makes the save after the step conflict, and the step is taken again
// from a quorum read; a watch cache that lags waits up to a few seconds before the API server
// gives up, and the read falls back to etcd). Without such a version (the run is new to this
// process), the read is a quorum read from etcd.
func (s *Store) headOf(ctx context.Context, run *toolnexusv1alpha1.AgentRun) (*toolnexusv1alpha1.AgentRunRecord, *client.GetOptions, error) {
	opts := &client.GetOptions{}
	objKey := client.ObjectKey{Namespace: run.Namespace, Name: HeadName(run.Name)}
	head := &toolnexusv1alpha1.AgentRunRecord{}
	if rv, _ := s.headVersion(run); rv != "" {
		err := s.reader.Get(ctx, objKey, head, &client.GetOptions{Raw: &metav1.GetOptions{ResourceVersion: rv}})
		if err == nil {
			// Its parts, written before it, are read not older than the head as it was found
			// (another writer may have moved it past rv).
			return head, &client.GetOptions{Raw: &metav1.GetOptions{ResourceVersion: head.ResourceVersion}}, nil
		}
		if apierrors.IsNotFound(err) {
			return head, opts, err
		}
		// The watch cache did not catch up in time, or is off: read from etcd.
	}
	err := s.reader.Get(ctx, objKey, head, opts)
	if err == nil {
		s.sawHead(run, head.ResourceVersion)
	}
	return head, opts, err
}

// Save writes the head with optimistic concurrency (a conflict means another writer moved the
// run on, and the caller must start over from a fresh read). When the head would pass sealAt its
// messages are sealed into a segment first, and when it still would, its state is spilled into
// parts of its own. A record that would pass one of its bounds is not written: Save returns a
// *TooLargeError naming the bound.
func (s *Store) Save(ctx context.Context, run *toolnexusv1alpha1.AgentRun, rec *Record) error {
	data, raw, err := encodeHead(rec.State, rec.segments, rec.Agent, nil)
	if err != nil {
		return fmt.Errorf("encoding the record: %w", err)
	}
	segments, next := rec.segments, rec.next()
	var seg *Segment
	var segData []byte
	msgs, calls := sealed(rec.segments)
	if len(data) > sealAt && (msgs < len(rec.State.Messages) || calls < len(rec.State.ToolCalls)) {
		seg = &Segment{Messages: rec.State.Messages[msgs:]}
		for _, c := range rec.State.ToolCalls[calls:] {
			c.Output = clip.Marked(c.Output, sealedOutputBytes)
			seg.ToolCalls = append(seg.ToolCalls, c)
		}
		var segRaw int
		if segData, segRaw, err = Encode(seg); err != nil {
			return fmt.Errorf("encoding a record segment: %w", err)
		}
		ref := SegmentRef{Blob: newBlob(run.Name, next, segData, segRaw), Messages: len(seg.Messages), ToolCalls: len(seg.ToolCalls)}
		segments, next = append(segments[:len(segments):len(segments)], ref), ref.last()+1
		if data, raw, err = encodeHead(rec.State, segments, rec.Agent, nil); err != nil {
			return fmt.Errorf("encoding the record: %w", err)
		}
	}
	var spill *Blob
	var spillData []byte
	if len(data) > sealAt {
		rest, err := unsealed(rec.State, segments)
		if err != nil {
			return fmt.Errorf("encoding the record: %w", err)
		}
		var spillRaw int
		if spillData, spillRaw, err = Encode(rest); err != nil {
			return fmt.Errorf("encoding the record's state: %w", err)
		}
		b := newBlob(run.Name, next, spillData, spillRaw)
		spill = &b
		if data, raw, err = encodeHead(nil, segments, rec.Agent, spill); err != nil {
			return fmt.Errorf("encoding the record: %w", err)
		}
	}
	if err := s.fits(run.Name, segments, spill, len(data), raw); err != nil {
		return err
	}
	if seg != nil {
		if err := s.writeParts(ctx, run, &segments[len(segments)-1].Blob, segData); err != nil {
			return err
		}
		rec.segments = segments
		// The sealed summaries replace the whole ones in memory too, so memory matches what a
		// fresh load would read.
		copy(rec.State.ToolCalls[calls:], seg.ToolCalls)
	}
	if spill != nil {
		if err := s.writeParts(ctx, run, spill, spillData); err != nil {
			return err
		}
	}
	var obj *toolnexusv1alpha1.AgentRunRecord
	if rec.Head == nil {
		if obj, err = s.object(run, 0, data); err != nil {
			return err
		}
		err = s.createHead(ctx, run, obj)
	} else {
		obj, err = s.updateHead(ctx, rec.Head, data)
	}
	if err != nil {
		// Whatever the record holds now is read from etcd next time.
		s.sawHead(run, "")
		return fmt.Errorf("saving the record: %w", err)
	}
	dropped := rec.spill
	rec.Head, rec.spill = obj, spill
	s.sawHead(run, obj.ResourceVersion)
	s.deleteParts(ctx, run, dropped)
	return nil
}

// fits checks the record a save would leave against every bound: the head's object, the index of
// its last part, and the run's totals.
func (s *Store) fits(run string, segments []SegmentRef, spill *Blob, headBytes, headRaw int) error {
	if headBytes > toolnexusv1alpha1.MaxRecordDataBytes {
		return &TooLargeError{Bound: BoundObject, Need: headBytes, Limit: toolnexusv1alpha1.MaxRecordDataBytes, Object: HeadName(run)}
	}
	last := 0
	if n := len(segments); n > 0 {
		last = segments[n-1].last()
	}
	if spill != nil {
		last = max(last, spill.last())
	}
	if last > maxIndex {
		return &TooLargeError{Bound: BoundIndex, Need: last, Limit: maxIndex, Object: partName(run, last)}
	}
	size, rawSize := stored(segments, spill)
	if size += headBytes; size > s.limits.MaxBytes {
		return &TooLargeError{Bound: BoundStored, Need: size, Limit: s.limits.MaxBytes}
	}
	if rawSize += headRaw; rawSize > s.limits.MaxRawBytes {
		return &TooLargeError{Bound: BoundDecoded, Need: rawSize, Limit: s.limits.MaxRawBytes}
	}
	return nil
}

// newBlob describes data stored from index first on.
func newBlob(run string, first int, data []byte, raw int) Blob {
	b := Blob{Name: partName(run, first), Index: first, Bytes: len(data), RawBytes: raw, Digest: digest(data)}
	if n := (len(data) + toolnexusv1alpha1.MaxRecordDataBytes - 1) / toolnexusv1alpha1.MaxRecordDataBytes; n > 1 {
		b.Parts = n
	}
	return b
}

// writeParts writes data into the parts b names. None is named by the saved head (see next), so
// one that exists was left by a save that did not complete, or by a spill since dropped: it is
// overwritten. A crash in between leaves parts no head names, which the next save overwrites.
func (s *Store) writeParts(ctx context.Context, run *toolnexusv1alpha1.AgentRun, b *Blob, data []byte) error {
	for k := range b.parts() {
		chunk := data[k*toolnexusv1alpha1.MaxRecordDataBytes : min(len(data), (k+1)*toolnexusv1alpha1.MaxRecordDataBytes)]
		obj, err := s.object(run, b.Index+k, chunk)
		if err != nil {
			return err
		}
		err = s.client.Create(ctx, obj)
		if apierrors.IsAlreadyExists(err) {
			old := &toolnexusv1alpha1.AgentRunRecord{}
			if err = s.reader.Get(ctx, client.ObjectKeyFromObject(obj), old); err == nil {
				if old.Run.UID != string(run.UID) {
					return mismatch("AgentRunRecord %s belongs to run %s, not to this run; rename the run", old.Name, old.Run.Name)
				}
				obj.ResourceVersion = old.ResourceVersion
				err = s.client.Update(ctx, obj)
			}
		}
		if err != nil {
			return fmt.Errorf("saving record part %s: %w", obj.Name, err)
		}
	}
	return nil
}

// deleteParts deletes the parts of a spill the saved head no longer names. One left behind is
// harmless: no head names it, a later save may overwrite it, and it goes with the run.
func (s *Store) deleteParts(ctx context.Context, run *toolnexusv1alpha1.AgentRun, b *Blob) {
	if b == nil {
		return
	}
	for k := range b.parts() {
		obj := &toolnexusv1alpha1.AgentRunRecord{ObjectMeta: metav1.ObjectMeta{Namespace: run.Namespace, Name: partName(run.Name, b.Index+k)}}
		if err := s.client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			logf.FromContext(ctx).Info("Could not delete a part of the run's record that it no longer uses", "record", obj.Name, "error", err.Error())
		}
	}
}

// createHead creates the run's head. One that exists already was left by a deleted run of the
// same name, and is replaced; or an earlier process saved it for this run: then what this
// reconcile did is stale, and the save conflicts (the run is read again).
func (s *Store) createHead(ctx context.Context, run *toolnexusv1alpha1.AgentRun, obj *toolnexusv1alpha1.AgentRunRecord) error {
	err := s.client.Create(ctx, obj)
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	existing := &toolnexusv1alpha1.AgentRunRecord{}
	if err := s.reader.Get(ctx, client.ObjectKeyFromObject(obj), existing); err != nil {
		return err
	}
	if existing.Run.UID == string(run.UID) {
		return savedEarlier(obj.Name)
	}
	if err := s.deleteEarlierHead(ctx, run, existing); err != nil {
		return err
	}
	return s.client.Create(ctx, obj)
}

// deleteEarlierHead deletes a head that is not run's: one left by a deleted run of the same name
// that the garbage collector has not removed yet. Any other fails the run closed.
func (s *Store) deleteEarlierHead(ctx context.Context, run *toolnexusv1alpha1.AgentRun, head *toolnexusv1alpha1.AgentRunRecord) error {
	notOurs := mismatch("AgentRunRecord %s belongs to run %s (uid %s), not to this run; rename the run", head.Name, head.Run.Name, head.Run.UID)
	if head.Run.Name != run.Name || run.Status.Started() {
		return notOurs
	}
	// The run it names must be gone: a stale copy of this run must not delete a newer namesake's.
	live := &toolnexusv1alpha1.AgentRun{}
	err := s.reader.Get(ctx, client.ObjectKeyFromObject(run), live)
	if err == nil && string(live.UID) == head.Run.UID {
		return notOurs
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading run %s: %w", run.Name, err)
	}
	err = s.client.Delete(ctx, head, client.Preconditions{UID: &head.UID})
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
func (s *Store) updateHead(ctx context.Context, head *toolnexusv1alpha1.AgentRunRecord, data []byte) (*toolnexusv1alpha1.AgentRunRecord, error) {
	obj := head.DeepCopy()
	obj.Data = data
	obj.ManagedFields = nil // left out, the server keeps them; sent back, they cost a comparison
	err := s.client.Update(ctx, obj)
	if !apierrors.IsConflict(err) {
		return obj, err
	}
	fresh := &toolnexusv1alpha1.AgentRunRecord{}
	if err := s.reader.Get(ctx, client.ObjectKeyFromObject(head), fresh); err != nil {
		return nil, err
	}
	if !bytes.Equal(fresh.Data, head.Data) {
		return nil, err
	}
	fresh.Data = data
	return fresh, s.client.Update(ctx, fresh)
}

// object is the AgentRunRecord holding data as the head (n = 0) or part n of run's record,
// controlled by the run so that it goes with it.
func (s *Store) object(run *toolnexusv1alpha1.AgentRun, n int, data []byte) (*toolnexusv1alpha1.AgentRunRecord, error) {
	part := toolnexusv1alpha1.RecordPartHead
	if n > 0 {
		part = toolnexusv1alpha1.RecordPartSegment
	}
	obj := &toolnexusv1alpha1.AgentRunRecord{
		ObjectMeta: metav1.ObjectMeta{Name: partName(run.Name, n), Namespace: run.Namespace},
		Run:        toolnexusv1alpha1.RecordRunReference{Name: run.Name, UID: string(run.UID)},
		Part:       part, Index: int32(n), Encoding: toolnexusv1alpha1.RecordEncoding, Data: data,
	}
	// The run label lets `kubectl get arrec -l toolnexus.dev/run=...` find a run's records (a name
	// that is no valid label value goes without); the shard label keeps them in the run's shard.
	obj.Labels = kube.RunLabels(run)
	return obj, controllerutil.SetControllerReference(run, obj, s.scheme)
}

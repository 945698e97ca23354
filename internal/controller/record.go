package controller

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
)

// The transcript is stored in ConfigMaps the run owns, as gzipped JSON under recordKey:
//
//   - the head, <run>-transcript: the loop state of the current turn and the messages not yet
//     sealed, plus the controller's bookkeeping. It is rewritten after every step.
//   - sealed segments, <run>-transcript-<n>: older messages and tool-call summaries, written
//     once when the head grows past sealAt and never changed again.
//
// So a step writes one object whose size is bounded by sealAt, however long the transcript gets,
// and a transcript can outgrow one object's size limit.
const (
	recordKey = "record.json.gz"
	// maxObjectBytes is what one ConfigMap may hold: etcd refuses requests over 1.5 MiB by
	// default, and metadata needs room.
	maxObjectBytes = 1000 * 1024
	// sealAt is the compressed head size past which its messages move into a sealed segment.
	sealAt = 256 * 1024
	// DefaultMaxTranscriptBytes bounds a run's stored transcript, compressed.
	DefaultMaxTranscriptBytes = 64 << 20
	// sealedOutputBytes is how much of a tool call's output its sealed summary keeps: the whole
	// output is in the transcript's tool message already.
	sealedOutputBytes = 1024
)

// errRecordTooLarge is returned by saveRecord when the transcript outgrows what a run can store.
var errRecordTooLarge = errors.New("the transcript outgrew what a run may store")

// corruptError says the stored transcript cannot be decoded: retrying cannot help, so the run
// ends with reason TranscriptCorrupt.
type corruptError struct{ err error }

func (e *corruptError) Error() string { return e.err.Error() }
func (e *corruptError) Unwrap() error { return e.err }

// outcome is a terminal end that the loop state cannot express: a failure or a cancellation.
type outcome struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// segmentRef names a sealed segment and how much of the transcript it holds.
type segmentRef struct {
	Name      string `json:"name"`
	Messages  int    `json:"messages"`
	ToolCalls int    `json:"toolCalls"`
	// Bytes is the segment's compressed size.
	Bytes int `json:"bytes"`
}

// segment is the content of a sealed segment.
type segment struct {
	Messages  []loop.Message  `json:"messages"`
	ToolCalls []loop.ToolCall `json:"toolCalls,omitempty"`
}

// runRecord is everything a run persists between steps: the loop state plus the controller's own
// bookkeeping. In memory State is whole; on disk its sealed prefix lives in Segments.
type runRecord struct {
	State *loop.State `json:"state"`
	// Segments hold the sealed prefix of State.Messages and State.ToolCalls, in order.
	Segments []segmentRef `json:"segments,omitempty"`
	// ModelFailures counts consecutive transient model failures.
	ModelFailures int `json:"modelFailures,omitempty"`
	// Announced maps a suspended call id to the PendingRequest created for it.
	Announced map[string]string `json:"announced,omitempty"`
	// Outcome is set when the run ended in a way the loop state does not say.
	Outcome *outcome `json:"outcome,omitempty"`

	// head is the ConfigMap the record was read from or last written to; nil before the first save.
	head *corev1.ConfigMap
}

// started reports whether the record was ever saved, i.e. the run has taken a step.
func (rec *runRecord) started() bool { return rec.head != nil }

func transcriptName(run *toolnexusv1alpha1.AgentRun) string {
	return run.Name + "-transcript"
}

// sealed counts the messages, tool calls and compressed bytes that live in segments.
func (rec *runRecord) sealed() (messages, toolCalls, size int) {
	for _, s := range rec.Segments {
		messages += s.Messages
		toolCalls += s.ToolCalls
		size += s.Bytes
	}
	return messages, toolCalls, size
}

// loadRecord reads the run's record, uncached: the informer may lag behind the previous step's
// write, and re-running a step because of a stale read would repeat a model call. A missing head
// means the run has not started.
func (r *AgentRunReconciler) loadRecord(ctx context.Context, run *toolnexusv1alpha1.AgentRun) (*runRecord, error) {
	head := &corev1.ConfigMap{}
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: run.Namespace, Name: transcriptName(run)}, head)
	if apierrors.IsNotFound(err) {
		return &runRecord{State: loop.NewState(run.Spec.Prompt)}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading transcript: %w", err)
	}
	if !metav1.IsControlledBy(head, run) {
		return nil, fmt.Errorf("ConfigMap %s exists and is not owned by this run; delete it or rename the run", head.Name)
	}
	rec := &runRecord{}
	if err := decodeGzipJSON(head.BinaryData[recordKey], rec); err != nil {
		return nil, &corruptError{fmt.Errorf("decoding transcript %s: %w", head.Name, err)}
	}
	if rec.State == nil {
		return nil, &corruptError{fmt.Errorf("decoding transcript %s: it holds no state", head.Name)}
	}
	rec.head = head
	var msgs []loop.Message
	var calls []loop.ToolCall
	for _, ref := range rec.Segments {
		seg, err := r.loadSegment(ctx, run.Namespace, ref)
		if err != nil {
			return nil, err
		}
		msgs, calls = append(msgs, seg.Messages...), append(calls, seg.ToolCalls...)
	}
	if len(rec.Segments) > 0 {
		rec.State.Messages = append(msgs, rec.State.Messages...)
		rec.State.ToolCalls = append(calls, rec.State.ToolCalls...)
	}
	return rec, nil
}

func (r *AgentRunReconciler) loadSegment(ctx context.Context, namespace string, ref segmentRef) (*segment, error) {
	cm := &corev1.ConfigMap{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, cm); err != nil {
		return nil, fmt.Errorf("reading transcript segment %s: %w", ref.Name, err)
	}
	seg := &segment{}
	if err := decodeGzipJSON(cm.BinaryData[recordKey], seg); err != nil {
		return nil, &corruptError{fmt.Errorf("decoding transcript segment %s: %w", ref.Name, err)}
	}
	if len(seg.Messages) != ref.Messages || len(seg.ToolCalls) != ref.ToolCalls {
		return nil, &corruptError{fmt.Errorf("transcript segment %s holds %d messages and %d tool calls, the head expects %d and %d",
			ref.Name, len(seg.Messages), len(seg.ToolCalls), ref.Messages, ref.ToolCalls)}
	}
	return seg, nil
}

// gzip writers and readers are pooled: a new writer allocates over a MiB of tables, which was most
// of a step's CPU and garbage.
var (
	gzipWriters = sync.Pool{New: func() any {
		zw, _ := gzip.NewWriterLevel(io.Discard, gzip.BestSpeed)
		return zw
	}}
	gzipReaders sync.Pool
)

func decodeGzipJSON(data []byte, into any) error {
	zr, ok := gzipReaders.Get().(*gzip.Reader)
	var err error
	if ok {
		err = zr.Reset(bytes.NewReader(data))
	} else {
		zr, err = gzip.NewReader(bytes.NewReader(data))
	}
	if err != nil {
		return err
	}
	defer gzipReaders.Put(zr)
	raw, err := io.ReadAll(zr)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, into)
}

func encodeGzipJSON(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	zw := gzipWriters.Get().(*gzip.Writer)
	defer gzipWriters.Put(zw)
	zw.Reset(&buf)
	if _, err := zw.Write(raw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// encodeHead encodes the record with only the unsealed part of the transcript.
func (rec *runRecord) encodeHead() ([]byte, error) {
	msgs, calls, _ := rec.sealed()
	head := *rec.State
	head.Messages, head.ToolCalls = head.Messages[msgs:], head.ToolCalls[calls:]
	onDisk := *rec
	onDisk.State = &head
	return encodeGzipJSON(&onDisk)
}

// saveRecord writes the head with optimistic concurrency (a conflict means another writer moved
// the run on, and the caller must start over from a fresh read), sealing a segment first when the
// head has grown past sealAt.
func (r *AgentRunReconciler) saveRecord(ctx context.Context, run *toolnexusv1alpha1.AgentRun, rec *runRecord) error {
	data, err := rec.encodeHead()
	if err != nil {
		return fmt.Errorf("encoding transcript: %w", err)
	}
	if len(data) > sealAt {
		if err := r.seal(ctx, run, rec); err != nil {
			return err
		}
		if data, err = rec.encodeHead(); err != nil {
			return fmt.Errorf("encoding transcript: %w", err)
		}
	}
	if _, _, size := rec.sealed(); len(data) > maxObjectBytes || size+len(data) > r.maxTranscriptBytes() {
		return errRecordTooLarge
	}
	var cm *corev1.ConfigMap
	if rec.head == nil {
		if cm, err = r.transcriptObject(run, transcriptName(run), data); err != nil {
			return err
		}
		err = r.Create(ctx, cm)
	} else {
		cm, err = r.updateHead(ctx, rec.head, data)
	}
	if err != nil {
		return fmt.Errorf("saving transcript: %w", err)
	}
	rec.head = cm
	return nil
}

// updateHead replaces the head's record, keeping whatever else users put on the object (labels,
// annotations). The write is conditional on the resourceVersion; when it conflicts because someone
// changed only the object's metadata, the record is still the one this manager read, and the write
// is retried on the fresh object. A conflicting record means another writer moved the run on.
func (r *AgentRunReconciler) updateHead(ctx context.Context, head *corev1.ConfigMap, data []byte) (*corev1.ConfigMap, error) {
	cm := head.DeepCopy()
	cm.BinaryData = map[string][]byte{recordKey: data}
	cm.ManagedFields = nil // left out, the server keeps them; sent back, they cost a comparison
	err := r.Update(ctx, cm)
	if !apierrors.IsConflict(err) {
		return cm, err
	}
	fresh := &corev1.ConfigMap{}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(head), fresh); err != nil {
		return nil, err
	}
	if !bytes.Equal(fresh.BinaryData[recordKey], head.BinaryData[recordKey]) {
		return nil, err
	}
	fresh.BinaryData = map[string][]byte{recordKey: data}
	return fresh, r.Update(ctx, fresh)
}

// seal moves the unsealed messages and tool calls into a new segment. The segment is written
// before the head that refers to it, so a crash in between leaves an unreferenced segment that
// the next attempt overwrites.
func (r *AgentRunReconciler) seal(ctx context.Context, run *toolnexusv1alpha1.AgentRun, rec *runRecord) error {
	msgs, calls, size := rec.sealed()
	seg := segment{Messages: rec.State.Messages[msgs:]}
	for _, c := range rec.State.ToolCalls[calls:] {
		c.Output = truncate(c.Output, sealedOutputBytes)
		seg.ToolCalls = append(seg.ToolCalls, c)
	}
	data, err := encodeGzipJSON(&seg)
	if err != nil {
		return fmt.Errorf("encoding transcript segment: %w", err)
	}
	if len(data) > maxObjectBytes || size+len(data) > r.maxTranscriptBytes() {
		return errRecordTooLarge
	}
	ref := segmentRef{Name: transcriptName(run) + "-" + strconv.Itoa(len(rec.Segments)+1),
		Messages: len(seg.Messages), ToolCalls: len(seg.ToolCalls), Bytes: len(data)}
	cm, err := r.transcriptObject(run, ref.Name, data)
	if err != nil {
		return err
	}
	err = r.Create(ctx, cm)
	if apierrors.IsAlreadyExists(err) {
		old := &corev1.ConfigMap{}
		if err = r.APIReader.Get(ctx, client.ObjectKeyFromObject(cm), old); err == nil {
			cm.ResourceVersion = old.ResourceVersion
			err = r.Update(ctx, cm)
		}
	}
	if err != nil {
		return fmt.Errorf("saving transcript segment %s: %w", ref.Name, err)
	}
	rec.Segments = append(rec.Segments, ref)
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

func (r *AgentRunReconciler) transcriptObject(run *toolnexusv1alpha1.AgentRun, name string, data []byte) (*corev1.ConfigMap, error) {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: run.Namespace,
			Labels: map[string]string{toolnexusv1alpha1.RunLabel: run.Name},
		},
		BinaryData: map[string][]byte{recordKey: data},
	}
	return cm, controllerutil.SetControllerReference(run, cm, r.Scheme)
}

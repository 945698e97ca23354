package controller

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop"
)

// recordKey is the binaryData key of the transcript ConfigMap: the gzipped JSON runRecord.
const recordKey = "record.json.gz"

// maxRecordBytes is what a run may store: a ConfigMap must stay under etcd's request limit
// (1.5 MiB by default) with room for metadata.
const maxRecordBytes = 1000 * 1024

// errRecordTooLarge is returned by saveRecord when the compressed record outgrows maxRecordBytes.
var errRecordTooLarge = fmt.Errorf("the transcript needs more than %d KiB compressed", maxRecordBytes/1024)

// outcome is a terminal end that the loop state cannot express: a failure or a cancellation.
type outcome struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// runRecord is everything a run persists between steps: the loop state plus the controller's own
// bookkeeping. It lives in a ConfigMap the run owns, because transcripts outgrow status.
type runRecord struct {
	State *loop.State `json:"state"`
	// ModelFailures counts consecutive transient model failures.
	ModelFailures int `json:"modelFailures,omitempty"`
	// Announced maps a suspended call id to the PendingRequest created for it.
	Announced map[string]string `json:"announced,omitempty"`
	// Outcome is set when the run ended in a way the loop state does not say.
	Outcome *outcome `json:"outcome,omitempty"`

	// resourceVersion of the ConfigMap the record was read from; empty before the first save.
	resourceVersion string
}

func transcriptName(run *toolnexusv1alpha1.AgentRun) string {
	return run.Name + "-transcript"
}

// loadRecord reads the run's record, uncached: the informer may lag behind the previous step's
// write, and re-running a step because of a stale read would repeat a model call. A missing
// ConfigMap means the run has not started.
func (r *AgentRunReconciler) loadRecord(ctx context.Context, run *toolnexusv1alpha1.AgentRun) (*runRecord, error) {
	cm := &corev1.ConfigMap{}
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: run.Namespace, Name: transcriptName(run)}, cm)
	if apierrors.IsNotFound(err) {
		return &runRecord{State: loop.NewState(run.Spec.Prompt)}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading transcript: %w", err)
	}
	if !metav1.IsControlledBy(cm, run) {
		return nil, fmt.Errorf("ConfigMap %s exists and is not owned by this run; delete it or rename the run", cm.Name)
	}
	rec, err := decodeRecord(cm.BinaryData[recordKey])
	if err != nil {
		return nil, fmt.Errorf("decoding transcript %s: %w", cm.Name, err)
	}
	rec.resourceVersion = cm.ResourceVersion
	return rec, nil
}

func decodeRecord(data []byte) (*runRecord, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, err
	}
	rec := &runRecord{}
	if err := json.Unmarshal(raw, rec); err != nil {
		return nil, err
	}
	if rec.State == nil {
		return nil, fmt.Errorf("record has no state")
	}
	return rec, nil
}

func encodeRecord(rec *runRecord) ([]byte, error) {
	raw, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if _, err := zw.Write(raw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// saveRecord writes the record with optimistic concurrency: a conflict means another writer
// (a previous leader) moved the run on, and the caller must start over from a fresh read.
func (r *AgentRunReconciler) saveRecord(ctx context.Context, run *toolnexusv1alpha1.AgentRun, rec *runRecord) error {
	data, err := encodeRecord(rec)
	if err != nil {
		return fmt.Errorf("encoding transcript: %w", err)
	}
	if len(data) > maxRecordBytes {
		return errRecordTooLarge
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Name: transcriptName(run), Namespace: run.Namespace, ResourceVersion: rec.resourceVersion,
			Labels: map[string]string{toolnexusv1alpha1.RunLabel: run.Name},
		},
		BinaryData: map[string][]byte{recordKey: data},
	}
	if err := controllerutil.SetControllerReference(run, cm, r.Scheme); err != nil {
		return err
	}
	if rec.resourceVersion == "" {
		err = r.Create(ctx, cm)
	} else {
		err = r.Update(ctx, cm)
	}
	if err != nil {
		return fmt.Errorf("saving transcript: %w", err)
	}
	rec.resourceVersion = cm.ResourceVersion
	return nil
}

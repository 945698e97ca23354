package runstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/loop/state"
)

const (
	// maxNameLen is the longest object name the API server accepts.
	maxNameLen = 253
	// maxIndex is the highest index the AgentRunRecord CRD accepts.
	maxIndex = 100000
)

// HeadName is the name of the head of the record of the run named run.
func HeadName(run string) string { return partName(run, 0) }

// partName is the name of the head (n = 0) or of part n of a run's record.
func partName(run string, n int) string {
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

// Read reads the record of a run that has started, for a reader that never writes (the kubectl
// plugin, as its user): the head and every part it names, from etcd, checked as the manager checks
// them. maxRawBytes bounds the decoded total. The API's own error is returned when the head
// cannot be read (it is missing, or the user may not read it).
func Read(ctx context.Context, rd client.Reader, run *toolnexusv1alpha1.AgentRun, maxRawBytes int) (*Record, error) {
	head := &toolnexusv1alpha1.AgentRunRecord{}
	if err := rd.Get(ctx, client.ObjectKey{Namespace: run.Namespace, Name: HeadName(run.Name)}, head); err != nil {
		return nil, err
	}
	if head.Run.UID != string(run.UID) {
		return nil, mismatch("AgentRunRecord %s belongs to run %s (uid %s), not to this run", head.Name, head.Run.Name, head.Run.UID)
	}
	return decodeRecord(ctx, rd, run, head, maxRawBytes, &client.GetOptions{})
}

// decodeRecord decodes head, the run's, and reads the parts it names with opts: the state
// spilled from it, if any, and the sealed segments in front of it. budget bounds what all of
// them decode to together, so a damaged record is an error, never an allocation.
func decodeRecord(ctx context.Context, rd client.Reader, run *toolnexusv1alpha1.AgentRun, head *toolnexusv1alpha1.AgentRunRecord,
	budget int, opts *client.GetOptions) (*Record, error) {
	if head.Part != toolnexusv1alpha1.RecordPartHead {
		return nil, mismatch("AgentRunRecord %s is a %s, not the head of the run's record", head.Name, head.Part)
	}
	h := &Head{}
	n, err := Decode(head.Data, h, budget)
	if err != nil {
		return nil, corrupt("decoding the record AgentRunRecord %s: %w", head.Name, err)
	}
	budget -= n
	if err := layout(run.Name, h); err != nil {
		return nil, corrupt("the record AgentRunRecord %s: %w", head.Name, err)
	}
	if h.Spill != nil {
		if h.State != nil {
			return nil, corrupt("the record AgentRunRecord %s holds a state and names another one spilled from it", head.Name)
		}
		h.State = &state.State{}
		if n, err = readBlob(ctx, rd, run, h.Spill, "spilled state", h.State, budget, opts); err != nil {
			return nil, err
		}
		budget -= n
	}
	if h.State == nil {
		return nil, corrupt("decoding the record AgentRunRecord %s: it holds no state", head.Name)
	}
	segs := make([]*Segment, len(h.Segments))
	for i := range h.Segments {
		segs[i] = &Segment{}
		if n, err = readBlob(ctx, rd, run, &h.Segments[i].Blob, "segment", segs[i], budget, opts); err != nil {
			return nil, err
		}
		budget -= n
	}
	if err := join(h, segs); err != nil {
		return nil, corrupt("%w", err)
	}
	return &Record{State: h.State, Agent: h.Agent, Head: head, segments: h.Segments, spill: h.Spill}, nil
}

// layout checks where the head says its parts are, and fills in the index of each segment of a
// record written before data could span parts: the one after the previous segment's. The parts
// of a record come in increasing index order: the segments in transcript order, then the spill.
func layout(run string, h *Head) error {
	last := 0
	place := func(b *Blob) error {
		if b.Index == 0 {
			b.Index = last + 1
		}
		if b.Index <= last || b.Index > maxIndex || b.Parts < 0 || b.Parts > maxIndex || b.last() > maxIndex {
			return fmt.Errorf("the parts of %s (index %d, %d parts) do not follow index %d within %d", b.Name, b.Index, b.parts(), last, maxIndex)
		}
		if want := partName(run, b.Index); b.Name != want {
			return fmt.Errorf("it names %s as the AgentRunRecord at index %d, which is %s", b.Name, b.Index, want)
		}
		last = b.last()
		return nil
	}
	for i := range h.Segments {
		if err := place(&h.Segments[i].Blob); err != nil {
			return err
		}
	}
	if h.Spill != nil {
		return place(h.Spill)
	}
	return nil
}

// readBlob reads the parts of b, checks that each is the one the head expects (this run's, at its
// index) and that together they are the data b names, and decodes them into into, within budget.
// what says what b holds, for errors: "segment" or "spilled state".
func readBlob(ctx context.Context, rd client.Reader, run *toolnexusv1alpha1.AgentRun, b *Blob, what string, into any,
	budget int, opts *client.GetOptions) (int, error) {
	var data []byte
	for k := range b.parts() {
		index := b.Index + k
		name := partName(run.Name, index)
		// A segment in one part is named as it always was; a part of more names its place.
		desc, role := what+" AgentRunRecord "+name, fmt.Sprintf("%s %d", what, index)
		if b.parts() > 1 || what != "segment" {
			role = fmt.Sprintf("part %d of %d of the %s %s", k+1, b.parts(), what, b.Name)
			desc = fmt.Sprintf("AgentRunRecord %s (%s)", name, role)
		}
		obj := &toolnexusv1alpha1.AgentRunRecord{}
		if err := rd.Get(ctx, client.ObjectKey{Namespace: run.Namespace, Name: name}, obj, opts); err != nil {
			if apierrors.IsNotFound(err) {
				return 0, mismatch("%s of the run's record is gone", desc)
			}
			return 0, fmt.Errorf("reading %s: %w", desc, err)
		}
		if obj.Run.UID != string(run.UID) || obj.Part != toolnexusv1alpha1.RecordPartSegment || int(obj.Index) != index {
			return 0, mismatch("AgentRunRecord %s is not %s of this run's record", name, role)
		}
		if b.parts() == 1 {
			data = obj.Data
			break
		}
		if data == nil {
			data = make([]byte, 0, min(b.Bytes, b.parts()*toolnexusv1alpha1.MaxRecordDataBytes))
		}
		data = append(data, obj.Data...)
	}
	if b.Digest != "" && (len(data) != b.Bytes || digest(data) != b.Digest) {
		return 0, corrupt("the %d parts of the %s %s (from index %d) are not the data the head names (%d bytes, sha256 %s): a part is out of order or was changed",
			b.parts(), what, b.Name, b.Index, b.Bytes, b.Digest)
	}
	n, err := Decode(data, into, budget)
	if err != nil {
		return 0, corrupt("decoding %s AgentRunRecord %s: %w", what, b.Name, err)
	}
	return n, nil
}

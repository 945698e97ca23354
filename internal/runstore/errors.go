package runstore

import (
	"fmt"
	"math"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

// CorruptError says the stored state cannot be used as it is: it is damaged (reason
// TranscriptCorrupt) or disagrees with the cluster (StateMismatch). Retrying cannot help, so the
// run ends with Reason.
type CorruptError struct {
	Reason string
	Err    error
}

func (e *CorruptError) Error() string { return e.Err.Error() }
func (e *CorruptError) Unwrap() error { return e.Err }

func corrupt(format string, args ...any) error {
	return &CorruptError{Reason: toolnexusv1alpha1.ReasonTranscriptCorrupt, Err: fmt.Errorf(format, args...)}
}

// mismatch is a CorruptError with reason StateMismatch: the record and the cluster disagree.
func mismatch(format string, args ...any) error {
	return &CorruptError{Reason: toolnexusv1alpha1.ReasonStateMismatch, Err: fmt.Errorf(format, args...)}
}

// Bound is one of the bounds a run's record is kept within.
type Bound string

const (
	// BoundObject is what one AgentRunRecord's data may hold (MaxRecordDataBytes). Only the head
	// can reach it: every other part of the record is split across as many objects as it needs.
	BoundObject Bound = "object"
	// BoundIndex is the highest index an AgentRunRecord may have (maxIndex).
	BoundIndex Bound = "index"
	// BoundStored is the run's total, compressed: the manager's --max-transcript-size.
	BoundStored Bound = "stored"
	// BoundDecoded is the run's total, decoded: the manager's --max-transcript-decoded-size.
	BoundDecoded Bound = "decoded"
)

// TooLargeError is returned by Save when the record would pass one of its bounds: the run ends
// with TranscriptTooLarge, and the error, which names the bound and the numbers, says why.
type TooLargeError struct {
	Bound Bound
	// Need is what the record would take, Limit what the bound allows.
	Need, Limit int
	// Object names the AgentRunRecord, for BoundObject and BoundIndex.
	Object string
}

func (e *TooLargeError) Error() string {
	switch e.Bound {
	case BoundObject:
		return fmt.Sprintf("the record's head AgentRunRecord %s needs %s, more than the %s one AgentRunRecord may hold",
			e.Object, size(e.Need), size(e.Limit))
	case BoundIndex:
		return fmt.Sprintf("the record needs AgentRunRecord %s at index %d, past %d, the most a run's record may have",
			e.Object, e.Need, e.Limit)
	case BoundStored:
		return fmt.Sprintf("the transcript needs %s compressed, more than the %s compressed a run may store (--max-transcript-size)",
			size(e.Need), size(e.Limit))
	default:
		return fmt.Sprintf("the transcript needs %s decoded, more than the %s decoded a run may hold (--max-transcript-decoded-size)",
			size(e.Need), size(e.Limit))
	}
}

// size prints n bytes for a person: whole MiB or KiB as such, anything else in MiB rounded up
// to 0.01, so that a need just past its bound never reads as equal to it.
func size(n int) string {
	switch {
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	default:
		return fmt.Sprintf("%.2f MiB", math.Ceil(float64(n)*100/(1<<20))/100)
	}
}

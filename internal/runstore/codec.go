package runstore

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/toolnexus/operator/internal/loop/state"
)

// Head is the part of a record rewritten after every step: the loop state with only its unsealed
// messages and tool calls, and the list of sealed segments that precede them.
type Head struct {
	// State is nil when Spill holds it.
	State *state.State `json:"state,omitempty"`
	// Segments hold the sealed prefix of State.Messages and State.ToolCalls, in order.
	Segments []SegmentRef `json:"segments,omitempty"`
	// Agent is the Agent a run of an agent resolved at its first step, saved before any step ran:
	// the run uses it whatever later happens to the Agent. Nil for a run with an inline spec.
	Agent *AgentSnapshot `json:"agent,omitempty"`
	// Spill holds the state (its unsealed part, as State would) when it does not fit the head even
	// with every message sealed: the calls of a turn whose finished results or arguments are big.
	// Its parts are written once; the next save that spills writes new ones.
	Spill *Blob `json:"spill,omitempty"`
}

// AgentSnapshot is the spec of the Agent a run resolved, as the JSON of the API's AgentSpec.
type AgentSnapshot struct {
	Name       string          `json:"name"`
	Generation int64           `json:"generation"`
	Spec       json.RawMessage `json:"spec"`
}

// Blob locates encoded data that lives outside the head: in one or more parts, AgentRunRecords
// of part Segment with consecutive indices, each holding at most MaxRecordDataBytes of the data,
// in order.
type Blob struct {
	// Name is the first part's.
	Name string `json:"name"`
	// Index is the first part's index. Records written before data could span parts leave it 0:
	// then the segment's one part follows the previous segment's.
	Index int `json:"index,omitempty"`
	// Parts is how many parts hold the data; 0 means one.
	Parts int `json:"parts,omitempty"`
	// Bytes is the data's encoded (compressed) size.
	Bytes int `json:"bytes"`
	// RawBytes is the data's decoded size.
	RawBytes int `json:"rawBytes"`
	// Digest is the hex SHA-256 of the data, so parts that were swapped or changed are found;
	// empty in records written before data could span parts.
	Digest string `json:"digest,omitempty"`
}

// parts is how many AgentRunRecords hold b.
func (b *Blob) parts() int { return max(1, b.Parts) }

// last is the index of b's last part.
func (b *Blob) last() int { return b.Index + b.parts() - 1 }

// SegmentRef names a sealed segment and how much of the transcript it holds.
type SegmentRef struct {
	Blob
	Messages  int `json:"messages"`
	ToolCalls int `json:"toolCalls"`
}

// Segment is the content of a sealed segment.
type Segment struct {
	Messages  []state.Message  `json:"messages"`
	ToolCalls []state.ToolCall `json:"toolCalls,omitempty"`
}

// sealed counts the messages and tool calls that live in segments.
func sealed(segments []SegmentRef) (messages, toolCalls int) {
	for _, s := range segments {
		messages += s.Messages
		toolCalls += s.ToolCalls
	}
	return messages, toolCalls
}

// stored is what the blobs outside the head hold, compressed and decoded.
func stored(segments []SegmentRef, spill *Blob) (size, rawSize int) {
	for _, s := range segments {
		size += s.Bytes
		rawSize += s.RawBytes
	}
	if spill != nil {
		size += spill.Bytes
		rawSize += spill.RawBytes
	}
	return size, rawSize
}

// ErrTooLarge is returned when a record decodes to more than the limit its reader set.
var ErrTooLarge = errors.New("record: decoded size exceeds the limit")

// gzip writers and readers are pooled: a new writer allocates over a MiB of tables, which was most
// of a step's CPU and garbage.
var (
	gzipWriters = sync.Pool{New: func() any {
		zw, _ := gzip.NewWriterLevel(io.Discard, gzip.BestSpeed)
		return zw
	}}
	gzipReaders sync.Pool
)

// Decode gunzips data, refusing more than limit decoded bytes, and unmarshals the JSON into into.
// It returns the decoded size.
func Decode(data []byte, into any, limit int) (int, error) {
	zr, ok := gzipReaders.Get().(*gzip.Reader)
	var err error
	if ok {
		err = zr.Reset(bytes.NewReader(data))
	} else {
		zr, err = gzip.NewReader(bytes.NewReader(data))
	}
	if err != nil {
		return 0, err
	}
	defer gzipReaders.Put(zr)
	raw, err := io.ReadAll(io.LimitReader(zr, int64(limit)+1))
	if err != nil {
		return 0, err
	}
	if len(raw) > limit {
		return 0, fmt.Errorf("%w of %d bytes", ErrTooLarge, limit)
	}
	return len(raw), json.Unmarshal(raw, into)
}

// Encode marshals v to JSON and gzips it; it returns the encoded bytes and the JSON's size.
func Encode(v any) ([]byte, int, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, 0, err
	}
	var buf bytes.Buffer
	zw := gzipWriters.Get().(*gzip.Writer)
	defer gzipWriters.Put(zw)
	zw.Reset(&buf)
	if _, err := zw.Write(raw); err != nil {
		return nil, 0, err
	}
	if err := zw.Close(); err != nil {
		return nil, 0, err
	}
	return buf.Bytes(), len(raw), nil
}

// digest is the hex SHA-256 a Blob keeps of its data.
func digest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// unsealed is st without the messages and tool calls its segments hold.
func unsealed(st *state.State, segments []SegmentRef) (*state.State, error) {
	msgs, calls := sealed(segments)
	if msgs > len(st.Messages) || calls > len(st.ToolCalls) {
		return nil, fmt.Errorf("record: the segments hold more than the state (%d of %d messages, %d of %d tool calls)",
			msgs, len(st.Messages), calls, len(st.ToolCalls))
	}
	rest := *st
	rest.Messages, rest.ToolCalls = st.Messages[msgs:], st.ToolCalls[calls:]
	return &rest, nil
}

// encodeHead encodes the head for st: st without the messages and tool calls its segments hold,
// and the agent snapshot, if any. With a spill the head holds no state: the spill does.
func encodeHead(st *state.State, segments []SegmentRef, agent *AgentSnapshot, spill *Blob) ([]byte, int, error) {
	h := Head{Segments: segments, Agent: agent, Spill: spill}
	if spill == nil {
		rest, err := unsealed(st, segments)
		if err != nil {
			return nil, 0, err
		}
		h.State = rest
	}
	return Encode(&h)
}

// join puts the sealed segments, in order, in front of the head's messages and tool calls,
// checking that each holds what the head says it does.
func join(h *Head, segments []*Segment) error {
	if len(segments) != len(h.Segments) {
		return fmt.Errorf("record: the head names %d segments, %d were read", len(h.Segments), len(segments))
	}
	var msgs []state.Message
	var calls []state.ToolCall
	for i, seg := range segments {
		ref := h.Segments[i]
		if len(seg.Messages) != ref.Messages || len(seg.ToolCalls) != ref.ToolCalls {
			return fmt.Errorf("record: segment %s holds %d messages and %d tool calls, the head expects %d and %d",
				ref.Name, len(seg.Messages), len(seg.ToolCalls), ref.Messages, ref.ToolCalls)
		}
		msgs, calls = append(msgs, seg.Messages...), append(calls, seg.ToolCalls...)
	}
	if len(segments) > 0 {
		h.State.Messages = append(msgs, h.State.Messages...)
		h.State.ToolCalls = append(calls, h.State.ToolCalls...)
	}
	return nil
}

// Package record is the format of an AgentRun's durable record: the loop state and transcript,
// stored as gzipped JSON in a head that is rewritten after every step and sealed segments that
// never change. It is shared by the controller, which writes records, and the kubectl plugin,
// which reads them. Every decode goes through a size limit, so a damaged or hostile record can
// never make its reader allocate without bound.
package record

import (
	"bytes"
	"compress/gzip"
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
	State *state.State `json:"state"`
	// Segments hold the sealed prefix of State.Messages and State.ToolCalls, in order.
	Segments []SegmentRef `json:"segments,omitempty"`
	// Agent is the Agent a run of an agent resolved at its first step, saved before any step ran:
	// the run uses it whatever later happens to the Agent. Nil for a run with an inline spec.
	Agent *AgentSnapshot `json:"agent,omitempty"`
}

// AgentSnapshot is the spec of the Agent a run resolved, as the JSON of the API's AgentSpec (this
// package stays free of Kubernetes types).
type AgentSnapshot struct {
	Name       string          `json:"name"`
	Generation int64           `json:"generation"`
	Spec       json.RawMessage `json:"spec"`
}

// SegmentRef names a sealed segment and how much of the transcript it holds.
type SegmentRef struct {
	Name      string `json:"name"`
	Messages  int    `json:"messages"`
	ToolCalls int    `json:"toolCalls"`
	// Bytes is the segment's encoded (compressed) size.
	Bytes int `json:"bytes"`
	// RawBytes is the segment's decoded size.
	RawBytes int `json:"rawBytes"`
}

// Segment is the content of a sealed segment.
type Segment struct {
	Messages  []state.Message  `json:"messages"`
	ToolCalls []state.ToolCall `json:"toolCalls,omitempty"`
}

// Sealed counts the messages, tool calls and bytes (compressed and decoded) that live in segments.
func (h *Head) Sealed() (messages, toolCalls, size, rawSize int) {
	for _, s := range h.Segments {
		messages += s.Messages
		toolCalls += s.ToolCalls
		size += s.Bytes
		rawSize += s.RawBytes
	}
	return messages, toolCalls, size, rawSize
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

// EncodeHead encodes the head for st: st without the messages and tool calls its segments hold,
// and the agent snapshot, if any.
func EncodeHead(st *state.State, segments []SegmentRef, agent *AgentSnapshot) ([]byte, int, error) {
	h := Head{Segments: segments, Agent: agent}
	msgs, calls, _, _ := h.Sealed()
	if msgs > len(st.Messages) || calls > len(st.ToolCalls) {
		return nil, 0, fmt.Errorf("record: the segments hold more than the state (%d of %d messages, %d of %d tool calls)",
			msgs, len(st.Messages), calls, len(st.ToolCalls))
	}
	unsealed := *st
	unsealed.Messages, unsealed.ToolCalls = st.Messages[msgs:], st.ToolCalls[calls:]
	h.State = &unsealed
	return Encode(&h)
}

// Join puts the sealed segments, in order, in front of the head's messages and tool calls,
// checking that each holds what the head says it does.
func Join(h *Head, segments []*Segment) error {
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

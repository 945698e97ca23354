package telemetry

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// A run's spans are written by many reconciles, in many manager processes, over days; none of
// them keeps a span open. They agree on where the spans go because the ids are derived: the trace
// id from the run's UID (a UUID is 16 bytes, as a trace id) and the run span's id from the UID
// too. Every step and every suspension names the run span as its (remote) parent, and the run span
// itself is emitted once, when the run ends, with that id and the run's start time.

// MaxTraceparentLen bounds the traceparent annotation: version 00 is 55 characters, and a later
// version may only append a few fields.
const MaxTraceparentLen = 128

// TraceID is the trace of the run with uid: the UUID's 16 bytes, so that a trace is found by the
// run's UID; a UID that is not a UUID is hashed.
func TraceID(uid string) trace.TraceID {
	if id, err := trace.TraceIDFromHex(strings.ReplaceAll(uid, "-", "")); err == nil {
		return id
	}
	var id trace.TraceID
	sum := sha256.Sum256([]byte("toolnexus.dev/trace/" + uid))
	copy(id[:], sum[:])
	return id
}

// RunSpanID is the span id of the run with uid.
func RunSpanID(uid string) trace.SpanID {
	var id trace.SpanID
	sum := sha256.Sum256([]byte("toolnexus.dev/run-span/" + uid))
	copy(id[:], sum[:])
	if !id.IsValid() {
		id[7] = 1 // an all-zero id is invalid; a hash that gives one is as good as any other
	}
	return id
}

// ParseTraceparent parses a W3C traceparent header value, such as the toolnexus.dev/traceparent
// annotation holds.
func ParseTraceparent(v string) (trace.SpanContext, error) {
	if len(v) > MaxTraceparentLen {
		return trace.SpanContext{}, fmt.Errorf("it is %d characters long, at most %d are read", len(v), MaxTraceparentLen)
	}
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": v})
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return trace.SpanContext{}, fmt.Errorf("it is not a W3C traceparent (want 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>)")
	}
	return sc, nil
}

// runSpanKey marks the context a run span is started with: the ids it must get.
type runSpanKey struct{}

// idGenerator gives a run span its derived ids, and every other span random ones.
type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if sc, ok := ctx.Value(runSpanKey{}).(trace.SpanContext); ok {
		return sc.TraceID(), sc.SpanID()
	}
	var tid trace.TraceID
	for !tid.IsValid() {
		binary.BigEndian.PutUint64(tid[:8], rand.Uint64())
		binary.BigEndian.PutUint64(tid[8:], rand.Uint64())
	}
	return tid, randomSpanID()
}

func (idGenerator) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if sc, ok := ctx.Value(runSpanKey{}).(trace.SpanContext); ok {
		return sc.SpanID()
	}
	return randomSpanID()
}

func randomSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		binary.BigEndian.PutUint64(sid[:], rand.Uint64())
	}
	return sid
}

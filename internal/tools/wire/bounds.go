package wire

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Bounds of what a PendingRequest holds (api/v1alpha1, spec.toolCall and spec.request). The API
// server refuses an object past any of them, so a suspension past them cannot wait for an answer:
// the loop checks them before it parks a call, and api/v1alpha1/request_bounds_test.go holds them
// to the CRD's schema. Lengths count characters (Unicode code points), as the API server's
// maxLength does; the two byte bounds are measured as JSON.
const (
	MaxRequestIDLen = 256
	MaxKindLen      = 64
	MaxPromptLen    = 16384
	MaxURLLen       = 4096
	MaxExpiresAtLen = 64
	MaxToolNameLen  = 256
	// MaxArgumentsBytes bounds the arguments a request shows (spec.toolCall.arguments): its
	// answerer must see them whole, since the retry runs with exactly them.
	MaxArgumentsBytes = 64 << 10
	// MaxDataBytes bounds the request's data. etcd holds an object of at most 1.5 MiB; the rest of
	// a spec at its bounds (the arguments, a prompt and a URL of characters JSON escapes six bytes
	// long) is under 256 KiB, so with this much data the spec stays under 512 KiB and the answer
	// keeps a MiB. It is twice the arguments, so a gate's data, the tool and its arguments, fits.
	MaxDataBytes = 2 * MaxArgumentsBytes
)

// CheckBounds returns an error naming the first field of r a PendingRequest cannot hold and the
// bound it broke ("its request id is 300 characters; at most 256 fit"), or nil.
func (r Request) CheckBounds() error {
	for _, f := range []struct {
		name, value string
		max         int
	}{
		{"request id", r.ID, MaxRequestIDLen},
		{"kind", r.Kind, MaxKindLen},
		{"prompt", r.Prompt, MaxPromptLen},
		{"URL", r.URL, MaxURLLen},
		{"expiresAt", r.ExpiresAt, MaxExpiresAtLen},
	} {
		if n := utf8.RuneCountInString(f.value); n > f.max {
			return fmt.Errorf("its %s is %d characters; at most %d fit", f.name, n, f.max)
		}
	}
	if r.ID == "" {
		return fmt.Errorf("its request id is empty; 1 to %d characters fit", MaxRequestIDLen)
	}
	if r.Kind == "" {
		return fmt.Errorf("its kind is empty; 1 to %d characters fit", MaxKindLen)
	}
	if r.Data == nil {
		return nil
	}
	raw, err := json.Marshal(r.Data)
	if err != nil {
		return fmt.Errorf("its data is not JSON: %w", err)
	}
	if len(raw) > MaxDataBytes {
		return fmt.Errorf("its data is %d bytes of JSON; at most %d fit", len(raw), MaxDataBytes)
	}
	return nil
}

package tools

import (
	"fmt"
	"io"
	"unicode/utf8"
)

// DefaultMaxOutputBytes caps a tool's output when its spec names no cap: a model context has no
// use for more, and a runaway server must not exhaust the manager's memory.
const DefaultMaxOutputBytes = 1 << 20

// readCapped reads at most limit bytes of r, plus one to learn whether there was more. It never
// buffers the rest of the body.
func readCapped(r io.Reader, limit int) (body []byte, truncated bool, err error) {
	body, err = io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if len(body) > limit {
		return body[:limit], true, err
	}
	return body, false, err
}

// capOutput shortens s to at most limit bytes (on a rune boundary) and appends a note the model
// can see. total is the full size when known, or -1.
func capOutput(s string, limit int, truncated bool, total int64) string {
	if len(s) > limit {
		truncated, total = true, int64(len(s))
		s = s[:limit]
	}
	if !truncated {
		return s
	}
	// Drop a rune the cut split in two, so the note follows valid UTF-8.
	for range utf8.UTFMax - 1 {
		if r, size := utf8.DecodeLastRuneInString(s); len(s) == 0 || r != utf8.RuneError || size != 1 {
			break
		}
		s = s[:len(s)-1]
	}
	if total < 0 {
		return s + fmt.Sprintf("\n[truncated: %d of more than %d bytes]", len(s), limit)
	}
	return s + fmt.Sprintf("\n[truncated: %d of %d bytes]", len(s), total)
}

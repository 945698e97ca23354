// Package clip shortens text to a byte bound without splitting a UTF-8 sequence: what a model, a
// tool or a tenant wrote goes into status, spans, prompts and messages only bounded.
package clip

import (
	"strconv"
	"unicode/utf8"
)

// Bytes returns s cut to at most n bytes, on a rune boundary.
func Bytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Marked returns s cut to at most n bytes, on a rune boundary, ending in a note that says how
// long s was, so a reader knows text is missing.
func Marked(s string, n int) string {
	if len(s) <= n {
		return s
	}
	note := "… [truncated " + strconv.Itoa(len(s)) + " bytes]"
	return Bytes(s, n-len(note)) + note
}

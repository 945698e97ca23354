package notify

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Printable returns s with every character a terminal, a chat or a browser acts on instead of
// showing replaced by a visible escape, so that what a model, a tool or a run's author wrote can
// neither hide text (ESC [8m), write the clipboard (OSC 52), move the cursor back over what was
// printed (CR, BS), nor reorder what an approver reads (a bidi override turns "0001" into "1000").
// Escaped are the C0 controls but newline and tab, DEL, the C1 controls, the bidirectional
// formatting characters (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069), the line and
// paragraph separators U+2028 and U+2029, and bytes that are not UTF-8; as \r, \x1b, \u202e,
// \xff. Everything else, printable Unicode included, is kept.
func Printable(s string) string { return escapeUnsafe(s, false) }

// PrintableLine is Printable for text that must stay on one line, a table cell or a chat
// headline: newlines and tabs are escaped too (\n, \t).
func PrintableLine(s string) string { return escapeUnsafe(s, true) }

func escapeUnsafe(s string, oneLine bool) string {
	i := firstUnsafe(s, oneLine)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case !unsafeRune(r, oneLine):
			b.WriteString(s[i : i+size])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < utf8.RuneSelf:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += size
	}
	return b.String()
}

// firstUnsafe is the byte offset of the first character escapeUnsafe replaces, or -1.
func firstUnsafe(s string, oneLine bool) int {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || unsafeRune(r, oneLine) {
			return i
		}
		i += size
	}
	return -1
}

func unsafeRune(r rune, oneLine bool) bool {
	switch {
	case r == '\n' || r == '\t':
		return oneLine
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x2028 && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// PrintableJSON escapes, in JSON that encoding/json wrote, the characters Printable escapes and
// encoding/json leaves raw (DEL, the C1 controls, the bidirectional formatting characters), as
// \u escapes: the JSON means the same, and a terminal shows it inert.
func PrintableJSON(data []byte) []byte {
	s := string(data)
	i := firstUnsafe(s, false)
	if i < 0 {
		return data
	}
	out := make([]byte, 0, len(data)+32)
	out = append(out, s[:i]...)
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			out = append(out, `\ufffd`...)
		case unsafeRune(r, false):
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, s[i:i+size]...)
		}
		i += size
	}
	return out
}

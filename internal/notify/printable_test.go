package notify

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestPrintable(t *testing.T) {
	for _, tc := range []struct {
		name, in, want, wantLine string
	}{
		{"plain text is kept", "Approve purchase of gpu?", "Approve purchase of gpu?", "Approve purchase of gpu?"},
		{"printable Unicode is kept", "Kaufe 1 GPU für 1200 € — 日本語 ✓", "Kaufe 1 GPU für 1200 € — 日本語 ✓", "Kaufe 1 GPU für 1200 € — 日本語 ✓"},
		{"concealed text (SGR 8)", "ok \x1b[8mrm -rf / \x1b[0m", `ok \x1b[8mrm -rf / \x1b[0m`, `ok \x1b[8mrm -rf / \x1b[0m`},
		{"OSC 52 writes the clipboard", "\x1b]52;c;Y3VybA==\x07", `\x1b]52;c;Y3VybA==\x07`, `\x1b]52;c;Y3VybA==\x07`},
		{"a carriage return overprints", "amount 100000\ramount 10", `amount 100000\ramount 10`, `amount 100000\ramount 10`},
		{"backspace and DEL", "a\bb\x7f", `a\x08b\x7f`, `a\x08b\x7f`},
		{"C1 controls (8-bit CSI, NEL)", "x\u009b8my\u0085", `x\u009b8my\u0085`, `x\u009b8my\u0085`},
		{"bidi overrides and isolates", "pay \u202e0001\u202c \u2066x\u2069 \u2067\u2068", `pay \u202e0001\u202c \u2066x\u2069 \u2067\u2068`, `pay \u202e0001\u202c \u2066x\u2069 \u2067\u2068`},
		{"bidi embeddings and marks", "\u202a\u202b\u202d\u200e\u200f\u061c", `\u202a\u202b\u202d\u200e\u200f\u061c`, `\u202a\u202b\u202d\u200e\u200f\u061c`},
		{"line and paragraph separators", "a\u2028b\u2029", `a\u2028b\u2029`, `a\u2028b\u2029`},
		{"newlines and tabs: kept in text, escaped on a line", "a\n\tb", "a\n\tb", `a\n\tb`},
		{"bytes that are not UTF-8", "a\xffb\xc2", `a\xffb\xc2`, `a\xffb\xc2`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Printable(tc.in); got != tc.want {
				t.Errorf("Printable(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if got := PrintableLine(tc.in); got != tc.wantLine {
				t.Errorf("PrintableLine(%q) = %q, want %q", tc.in, got, tc.wantLine)
			}
		})
	}
}

// Whatever goes in, nothing a terminal acts on comes out.
func TestPrintableLeavesNothingUnsafe(t *testing.T) {
	var all strings.Builder
	for r := rune(0); r < 0x3000; r++ {
		all.WriteRune(r)
	}
	all.WriteString("\xff\xfe")
	out := PrintableLine(all.String())
	if !utf8.ValidString(out) {
		t.Fatal("the output is not UTF-8")
	}
	for _, r := range out {
		if unsafeRune(r, true) {
			t.Errorf("%U left unescaped", r)
		}
	}
}

func TestPrintableJSON(t *testing.T) {
	in := map[string]string{"prompt": "pay \u202e0001 \x1b[8m\x7f\u009b\u2028 ok é"}
	raw, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	got := PrintableJSON(raw)
	if want := `{"prompt":"pay \u202e0001 \u001b[8m\u007f\u009b\u2028 ok é"}`; string(got) != want {
		t.Errorf("PrintableJSON = %s, want %s", got, want)
	}
	var back map[string]string
	if err := json.Unmarshal(got, &back); err != nil || back["prompt"] != in["prompt"] {
		t.Errorf("the escaped JSON reads back as %q (%v), want %q", back["prompt"], err, in["prompt"])
	}
}

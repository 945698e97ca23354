package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func TestArgumentsDigest(t *testing.T) {
	for _, tc := range []struct {
		name, arguments, canonical string
	}{
		{"sorted keys, no whitespace, as given", `{"item":"gpu","qty":2}`, `{"item":"gpu","qty":2}`},
		{"other key order", `{"qty":2,"item":"gpu"}`, `{"item":"gpu","qty":2}`},
		{"whitespace and newlines", "{ \"item\" : \"gpu\",\n\t\"qty\": 2 }\n", `{"item":"gpu","qty":2}`},
		{"nested objects sorted, arrays kept in order", `{"b":{"y":1,"x":[3,{"d":1,"c":2}]},"a":null}`,
			`{"a":null,"b":{"x":[3,{"c":2,"d":1}],"y":1}}`},
		{"no HTML escaping", `{"q": "<a & b>"}`, `{"q":"<a & b>"}`},
		{"escapes unified", `{"s":"\u0041\/"}`, `{"s":"A/"}`},
		{"control characters and line separators escaped, other text as it is", "{\"s\":\"\\u0008\\u001f\u2028\u00e9\\t\"}",
			"{\"s\":\"\\b\\u001f\\u2028\u00e9\\t\"}"},
		{"numbers exactly as written", `{"n": 1.50, "m": 1e3, "big": 12345678901234567890123}`,
			`{"big":12345678901234567890123,"m":1e3,"n":1.50}`},
		{"not JSON (cut short): the bytes as held", `{"item":"gp`, `{"item":"gp`},
		{"two values: the bytes as held", `{} {}`, `{} {}`},
		{"empty", ``, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(canonical(tc.arguments)); got != tc.canonical {
				t.Errorf("canonical(%q) = %q, want %q", tc.arguments, got, tc.canonical)
			}
			if got, want := ArgumentsDigest(tc.arguments), sha(tc.canonical); got != want {
				t.Errorf("ArgumentsDigest(%q) = %s, want %s", tc.arguments, got, want)
			}
		})
	}
}

func TestArgumentsDigestTellsArgumentsApart(t *testing.T) {
	base := ArgumentsDigest(`{"item":"gpu","qty":2}`)
	for _, other := range []string{`{"item":"gpu","qty":3}`, `{"item":"gpu"}`, `{"item":"gpu","qty":"2"}`, `{"qty":2.0,"item":"gpu"}`} {
		if ArgumentsDigest(other) == base {
			t.Errorf("%s has the digest of {\"item\":\"gpu\",\"qty\":2}", other)
		}
	}
}

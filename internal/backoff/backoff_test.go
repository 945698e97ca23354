package backoff

import (
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	const base = 500 * time.Millisecond
	cases := []struct {
		name       string
		base       time.Duration
		n          int
		retryAfter time.Duration
		want       time.Duration
	}{
		{"first retry waits base", base, 1, 0, base},
		{"second doubles", base, 2, 0, time.Second},
		{"third doubles again", base, 3, 0, 2 * time.Second},
		{"ninth", base, 9, 0, 128 * time.Second},
		{"tenth still under the cap", base, 10, 0, 256 * time.Second},
		{"eleventh is capped", base, 11, 0, 5 * time.Minute},
		{"far past the cap never overflows", base, 10_000, 0, 5 * time.Minute},
		{"a base above the cap is capped", 10 * time.Minute, 1, 0, 5 * time.Minute},
		{"other base", time.Second, 4, 0, 8 * time.Second},
		{"retry-after wins over the first delay", base, 1, 7 * time.Second, 7 * time.Second},
		{"retry-after wins over a longer backoff", base, 8, time.Second, time.Second},
		{"retry-after is capped at an hour", base, 1, 3 * time.Hour, time.Hour},
	}
	for _, tc := range cases {
		if got := Delay(tc.base, tc.n, tc.retryAfter); got != tc.want {
			t.Errorf("%s: Delay(%s, %d, %s) = %s, want %s", tc.name, tc.base, tc.n, tc.retryAfter, got, tc.want)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	cases := map[string]time.Duration{
		"": 0, "0": 0, "7": 7 * time.Second, "2147483647": 2147483647 * time.Second,
		"2147483648": 0, "99999999999": 0, "1.5": 0, " 7": 0, "+7": 0, "-1": 0, "٣": 0,
		"Wed, 21 Oct 2015 07:28:00 GMT": 0,
	}
	for in, want := range cases {
		if got := ParseRetryAfter(in); got != want {
			t.Errorf("ParseRetryAfter(%q) = %v, want %v", in, got, want)
		}
	}
}

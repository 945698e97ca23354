package main

import (
	"math"
	"strings"
	"testing"

	"github.com/toolnexus/operator/internal/executor"
)

func TestInflightMemory(t *testing.T) {
	const mib = 1 << 20
	unset := int64(math.MaxInt64) // what debug.SetMemoryLimit(-1) says without GOMEMLIMIT
	for _, tc := range []struct {
		name       string
		flagMiB    int64
		goMemLimit int64
		cgroup     []string
		want       int64
		wantFrom   string
		wantErr    string
	}{
		{name: "the flag wins", flagMiB: 300, goMemLimit: 500 * mib, cgroup: []string{"536870912\n"}, want: 300 * mib, wantFrom: "--max-inflight-memory"},
		// config/manager: the manager sets GOMEMLIMIT to 384MiB under a 512Mi limit.
		{name: "GOMEMLIMIT as the manager sets it under config/manager's limit", goMemLimit: 384 * mib, cgroup: []string{"536870912\n", ""}, want: 384 * mib * 2 / 5, wantFrom: "GOMEMLIMIT"},
		{name: "GOMEMLIMIT above the container's limit", goMemLimit: 2048 * mib, cgroup: []string{"536870912\n"}, want: 512 * mib * 2 / 5, wantFrom: "cgroup"},
		{name: "cgroup v2 limit without GOMEMLIMIT", goMemLimit: unset, cgroup: []string{"1073741824\n", ""}, want: 1024 * mib * 2 / 5, wantFrom: "cgroup"},
		{name: "cgroup v1 limit without GOMEMLIMIT", goMemLimit: unset, cgroup: []string{"", "268435456\n"}, want: 256 * mib * 2 / 5, wantFrom: "cgroup"},
		{name: "no limit anywhere", goMemLimit: unset, cgroup: []string{"max\n", "9223372036854771712\n"}, want: executor.DefaultMemoryBytes, wantFrom: "default"},
		{name: "no cgroup files", goMemLimit: unset, want: executor.DefaultMemoryBytes, wantFrom: "default"},
		{name: "garbage in the cgroup file", goMemLimit: unset, cgroup: []string{"lots"}, want: executor.DefaultMemoryBytes, wantFrom: "default"},
		{name: "a negative flag", flagMiB: -1, goMemLimit: unset, wantErr: "must be 0 (derived) or a number of MiB, got -1"},
		{name: "a flag past what a process addresses", flagMiB: math.MaxInt64 >> 19, goMemLimit: unset, wantErr: "more than a process can address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, from, err := inflightMemory(tc.flagMiB, tc.goMemLimit, tc.cgroup...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || !strings.Contains(from, tc.wantFrom) {
				t.Errorf("inflightMemory = %d MiB from %q, want %d MiB from %q", got/mib, from, tc.want/mib, tc.wantFrom)
			}
		})
	}
}

// Without GOMEMLIMIT the manager tells the Go runtime to stay under three quarters of the
// container's memory limit; a GOMEMLIMIT that is set stands.
func TestGoMemoryLimit(t *testing.T) {
	const mib = 1 << 20
	unset := int64(math.MaxInt64)
	for _, tc := range []struct {
		name       string
		goMemLimit int64
		cgroup     []string
		want       int64
		set        bool
	}{
		{"config/manager: a 512Mi limit, no GOMEMLIMIT", unset, []string{"536870912\n", ""}, 384 * mib, true},
		{"cgroup v1", unset, []string{"", "1073741824\n"}, 768 * mib, true},
		{"the smaller of two", unset, []string{"1073741824\n", "536870912\n"}, 384 * mib, true},
		{"GOMEMLIMIT set stands", 450 * mib, []string{"536870912\n"}, 0, false},
		{"no limit", unset, []string{"max\n", "9223372036854771712\n"}, 0, false},
		{"no files", unset, nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, set := goMemoryLimit(tc.goMemLimit, tc.cgroup...)
			if got != tc.want || set != tc.set {
				t.Errorf("goMemoryLimit = %d MiB, %t; want %d MiB, %t", got/mib, set, tc.want/mib, tc.set)
			}
		})
	}
}

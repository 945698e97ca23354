package tools

import (
	"errors"
	"fmt"
	"path"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestGatesCheck(t *testing.T) {
	specs := []GateSpec{
		{Tools: []string{"github_*"}, When: `args.branch == "main"`,
			Prompt: `Push {{index .arguments "branch"}} with {{.tool}}?`},
		{Tools: []string{"shell", "db_drop?"}},
		{Tools: []string{"pay*"}, When: `has(args.amount) && args.amount > 100.0`},
		{Tools: []string{"risky"}, When: `args.missing == 1`},
		{Tools: []string{"dyn"}, When: `args.flag`},
		{Tools: []string{"buy"}, Prompt: "Approve {{.tool}} with {{.arguments}}?"},
		{When: `tool.startsWith("delete_")`},
	}
	gates, err := NewGates(specs)
	if err != nil {
		t.Fatalf("NewGates: %v", err)
	}
	approval := func(tool, prompt string, args any) *Request {
		return &Request{ID: "toolguard:call_9", Kind: KindApproval, Prompt: prompt,
			Data: map[string]any{"tool": tool, "arguments": args}}
	}
	tests := []struct {
		name    string
		tool    string
		args    map[string]any
		raw     string
		want    *Request
		wantErr string
	}{
		{name: "glob and when true, custom prompt", tool: "github_push", args: map[string]any{"branch": "main"},
			want: approval("github_push", "Push main with github_push?", map[string]any{"branch": "main"})},
		{name: "glob matches, when false", tool: "github_push", args: map[string]any{"branch": "dev"}},
		{name: "glob does not match", tool: "gitlab_push", args: map[string]any{"branch": "main"}},
		{name: "exact name, no when, default prompt", tool: "shell", args: map[string]any{"cmd": "ls"},
			want: approval("shell", "Approve the call to shell?", map[string]any{"cmd": "ls"})},
		{name: "single-character glob", tool: "db_drop1", want: approval("db_drop1", "Approve the call to db_drop1?", map[string]any{})},
		{name: "glob is not a prefix match", tool: "db_drop12"},
		{name: "has() guards an optional argument", tool: "pay_invoice", args: map[string]any{}},
		{name: "numeric condition true", tool: "pay_invoice", args: map[string]any{"amount": 250.0},
			want: approval("pay_invoice", "Approve the call to pay_invoice?", map[string]any{"amount": 250.0})},
		{name: "numeric condition false", tool: "pay_invoice", args: map[string]any{"amount": 5.0}},
		{name: "evaluation error requires approval", tool: "risky", args: map[string]any{"other": 1.0},
			want:    approval("risky", "Approve the call to risky?", map[string]any{"other": 1.0}),
			wantErr: "approval gate 3: evaluating when: no such key: missing; approval is required"},
		{name: "non-bool at runtime requires approval", tool: "dyn", args: map[string]any{"flag": "yes"},
			want:    approval("dyn", "Approve the call to dyn?", map[string]any{"flag": "yes"}),
			wantErr: "approval gate 4: when yielded string, want bool; approval is required"},
		{name: "dyn bool false", tool: "dyn", args: map[string]any{"flag": false}},
		{name: "gate without tools uses the name in when", tool: "delete_user",
			want: approval("delete_user", "Approve the call to delete_user?", map[string]any{})},
		{name: "unparsed arguments reach the approver raw", tool: "shell", raw: `{"cmd": "rm -rf /"`,
			want: approval("shell", "Approve the call to shell?", `{"cmd": "rm -rf /"`)},
		{name: "raw arguments parsed when args are absent", tool: "shell", raw: `{"cmd":"ls"}`,
			want: approval("shell", "Approve the call to shell?", map[string]any{"cmd": "ls"})},
		{name: "no gate", tool: "echo", args: map[string]any{"text": "hi"}},
		{name: "arguments render as JSON in a prompt", tool: "buy", args: map[string]any{"item": "gpu", "qty": 2.0},
			want: approval("buy", `Approve buy with {"item":"gpu","qty":2}?`, map[string]any{"item": "gpu", "qty": 2.0})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := gates.Check(tt.tool, tt.args, "call_9", tt.raw)
			if gotErr := errString(err); gotErr != tt.wantErr {
				t.Errorf("error = %q, want %q", gotErr, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGatesFirstMatchWinsAndNil(t *testing.T) {
	gates, err := NewGates([]GateSpec{{Tools: []string{"*"}, Prompt: "first {{.tool}}"}, {Tools: []string{"x"}, Prompt: "second"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := gates.Check("x", nil, "c", ""); got == nil || got.Prompt != "first x" {
		t.Errorf("Check = %+v, want the first gate's prompt", got)
	}
	var none *Gates
	if got, err := none.Check("x", nil, "c", ""); got != nil || err != nil {
		t.Errorf("nil Gates Check = %v, %v", got, err)
	}
}

func TestNewGatesErrors(t *testing.T) {
	tests := []struct {
		name string
		spec GateSpec
		// want is a prefix: CEL's own diagnostics (expected tokens, carets) follow it.
		want string
	}{
		{name: "syntax", spec: GateSpec{When: `args.x ==`},
			want: "approval gate 1: when \"args.x ==\": ERROR: <input>:1:10: Syntax error: mismatched input '<EOF>'"},
		{name: "unknown variable", spec: GateSpec{When: `user == "bob"`},
			want: "approval gate 1: when \"user == \\\"bob\\\"\": ERROR: <input>:1:1: undeclared reference to 'user'"},
		{name: "not bool", spec: GateSpec{When: `tool + "!"`}, want: `approval gate 1: when "tool + \"!\"" yields string, want bool`},
		{name: "bad glob", spec: GateSpec{Tools: []string{"a[b"}}, want: `approval gate 1: tool pattern "a[b": syntax error in pattern`},
		{name: "bad template", spec: GateSpec{Prompt: "{{.tool"}, want: `approval gate 1: prompt: template: gate1:1: unclosed action`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewGates([]GateSpec{{Tools: []string{"ok"}}, tt.spec})
			if got := errString(err); !strings.HasPrefix(got, tt.want) || tt.want == "" {
				t.Errorf("error =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// renderGate renders one gate's prompt for a call to "t" with args.
func renderGate(t *testing.T, prompt string, args map[string]any) (*Request, error) {
	t.Helper()
	gates, err := NewGates([]GateSpec{{Prompt: prompt}})
	if err != nil {
		t.Fatalf("NewGates: %v", err)
	}
	return gates.Check("t", args, "c", "")
}

func TestPromptOutputBound(t *testing.T) {
	note := "… [prompt truncated at 4096 bytes]"
	keep := promptOutputLimit - len(note)
	tests := []struct {
		name   string
		prompt string
		want   string
	}{
		{name: "at the bound", prompt: strings.Repeat("a", promptOutputLimit), want: strings.Repeat("a", promptOutputLimit)},
		{name: "one byte over", prompt: strings.Repeat("a", promptOutputLimit) + "{{.tool}}", want: strings.Repeat("a", keep) + note},
		{name: "the cut keeps runes whole", prompt: strings.Repeat("a", keep-1) + "€€{{range 10000}}€{{end}}",
			want: strings.Repeat("a", keep-1) + note},
		{name: "printf results are cut", prompt: `{{$s := "ab"}}{{range 20}}{{$s = printf "%s%s" $s $s}}{{end}}{{len $s}}`,
			want: fmt.Sprint(promptValueLimit)},
		{name: "escapers are cut", prompt: `{{$s := "<"}}{{range 20}}{{$s = html $s $s}}{{end}}{{len $s}}`,
			want: fmt.Sprint(promptValueLimit)},
		{name: "printf keeps its semantics", prompt: `{{printf "%-6s|%5.2f|%[1]q|%[3]d%%|%v" "ab" 3.14159 7 .arguments}}`,
			want: fmt.Sprintf("%-6s|%5.2f|%[1]q|%[3]d%%|%v", "ab", 3.14159, 7, `{"n":1}`)},
		{name: "print of the arguments is JSON", prompt: `{{print .arguments}}`, want: `{"n":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := renderGate(t, tt.prompt, map[string]any{"n": 1.0})
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if req.Prompt != tt.want {
				t.Errorf("prompt = %.60q… (%d bytes), want %.60q… (%d bytes)", req.Prompt, len(req.Prompt), tt.want, len(tt.want))
			}
		})
	}
}

func TestPromptRenderErrors(t *testing.T) {
	tests := []struct {
		name   string
		prompt string
		want   string
	}{
		{name: "printf width", prompt: `{{printf "%600000000d" 1}}`,
			want: `approval gate 0: prompt cannot be rendered: template: gate0:1:2: executing "gate0" at <printf "%600000000d" 1>: error calling printf: width or precision 600000000 is more than 256`},
		{name: "printf precision", prompt: `{{printf "%.1000f" 1.5}}`, want: "error calling printf: width or precision 1000 is more than 256"},
		{name: "printf width from an argument", prompt: `{{printf "%*d" 600000000 1}}`,
			want: "error calling printf: a width or precision taken from an argument (*) is not allowed"},
		{name: "indexed width from an argument", prompt: `{{printf "%[2]*[1]d" 1 600000000}}`,
			want: "error calling printf: a width or precision taken from an argument (*) is not allowed"},
		{name: "a failing template", prompt: `{{index .arguments.list 5}}`, want: "error calling index: index out of range: 5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := renderGate(t, tt.prompt, map[string]any{"list": []any{1.0}})
			if req != nil || !errors.Is(err, ErrPromptRender) || !strings.Contains(errString(err), tt.want) {
				t.Errorf("Check = %v, %v; want no request and an ErrPromptRender containing %q", req, err, tt.want)
			}
		})
	}
	// %% is a literal percent sign, not a directive: what follows it is text.
	if req, err := renderGate(t, `{{printf "100%%5000d"}}`, nil); err != nil || req.Prompt != "100%5000d" {
		t.Errorf(`printf "100%%%%5000d" = %v, %v`, req, err)
	}
}

// TestPromptLoopsMeetTheClock uses a clock that advances a millisecond per reading, so the bound
// is met after a known number of steps whatever the machine's speed.
func TestPromptLoopsMeetTheClock(t *testing.T) {
	tests := []struct {
		name   string
		prompt string
	}{
		{name: "range over a large number writing nothing", prompt: `{{range 1000000000000}}{{end}}`},
		{name: "nested ranges over the arguments", prompt: `{{range .arguments.l}}{{range $.arguments.l}}{{range $.arguments.l}}{{end}}{{end}}{{end}}`},
		{name: "a range in an else branch", prompt: `{{if false}}{{else}}{{range 1000000000000}}{{if false}}x{{end}}{{end}}{{end}}`},
		{name: "recursive template", prompt: `{{define "a"}}{{if .}}{{template "a" (slice . 1)}}{{template "a" (slice . 1)}}{{end}}{{end}}{{template "a" "0123456789012345678901234567890123456789"}}`},
	}
	list := make([]any, 1000)
	for i := range list {
		list[i] = float64(i)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gates, err := NewGates([]GateSpec{{Prompt: tt.prompt}})
			if err != nil {
				t.Fatalf("NewGates: %v", err)
			}
			clock, readings := time.Unix(0, 0), 0
			gates.now = func() time.Time {
				readings++
				clock = clock.Add(10 * time.Millisecond)
				return clock
			}
			req, err := gates.Check("t", map[string]any{"l": list}, "c", "")
			want := "approval gate 0: prompt cannot be rendered: rendering took longer than 1s"
			if req != nil || errString(err) != want || !errors.Is(err, ErrPromptRender) {
				t.Errorf("Check = %v, %v; want %q", req, err, want)
			}
			if readings > 110 {
				t.Errorf("the clock was read %d times; the bound should stop the loop after about 100", readings)
			}
		})
	}
}

// TestPromptBombs renders templates that would expand to hundreds of MB, or loop for hours,
// against the real clock, and measures the peak heap they hold (go test -v -run TestPromptBombs
// ./internal/tools/ prints the figures).
func TestPromptBombs(t *testing.T) {
	const maxGrowth = 64 << 20
	doubling := `{{$s := "0123456789abcdef"}}` + strings.Repeat(`{{$s = printf "%s%s" $s $s}}`, 25) + `{{$s}}` // 512 MiB unbounded
	repeated := `{{printf "` + strings.Repeat("%[1]v", 200) + `" .arguments}}`                                 // 200 × 1 MiB unbounded
	big := map[string]any{"blob": strings.Repeat("x", 1<<20)}
	tests := []struct {
		name    string
		prompt  string
		args    map[string]any
		wantErr string // empty: the prompt is truncated
	}{
		{name: "600 MB of padding", prompt: `{{printf "%600000000d" 1}}`, wantErr: "width or precision 600000000 is more than 256"},
		{name: "600 MB by a range", prompt: `{{range 600000000}}{{printf "%256d" 1}}{{end}}`},
		{name: "600 MB of text", prompt: `{{range 600000000}}xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{{end}}`},
		{name: "a string doubled 25 times", prompt: doubling},
		{name: "one large argument named 200 times", prompt: repeated, args: big},
		{name: "a loop that writes nothing", prompt: `{{range 1000000000000}}{{end}}`, wantErr: "rendering took longer than 1s"},
		{name: "2^40 template calls", prompt: `{{define "a"}}{{if .}}{{template "a" (slice . 1)}}{{template "a" (slice . 1)}}{{end}}{{end}}{{template "a" "0123456789012345678901234567890123456789"}}`,
			wantErr: "rendering took longer than 1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gates, err := NewGates([]GateSpec{{Prompt: tt.prompt}})
			if err != nil {
				t.Fatalf("NewGates: %v", err)
			}
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			peak := sampleHeapPeak()
			start := time.Now()
			req, err := gates.Check("t", tt.args, "c", "")
			elapsed := time.Since(start)
			grew := peak() - before.HeapInuse
			t.Logf("%s: %s, heap in use grew at most %.1f MiB", tt.name, elapsed.Round(time.Millisecond), float64(grew)/(1<<20))
			switch {
			case tt.wantErr != "":
				if req != nil || !errors.Is(err, ErrPromptRender) || !strings.HasSuffix(errString(err), tt.wantErr) {
					t.Errorf("Check = %v, %v; want an error ending %q", req, err, tt.wantErr)
				}
			case err != nil:
				t.Errorf("Check: %v", err)
			case len(req.Prompt) > promptOutputLimit || !strings.HasSuffix(req.Prompt, "… [prompt truncated at 4096 bytes]"):
				t.Errorf("prompt is %d bytes ending %q; want at most %d with the truncation note", len(req.Prompt), req.Prompt[max(0, len(req.Prompt)-40):], promptOutputLimit)
			}
			if elapsed > 3*promptRenderTimeout {
				t.Errorf("took %s; the bound is %s", elapsed, promptRenderTimeout)
			}
			if grew > maxGrowth {
				t.Errorf("heap in use grew %d MiB, want under %d MiB", grew>>20, maxGrowth>>20)
			}
		})
	}
}

// sampleHeapPeak samples the heap in use every millisecond until the returned function is called,
// which reports the peak: what a render holds at once, whatever garbage it churns through.
func sampleHeapPeak() func() uint64 {
	var peak uint64
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return func() uint64 {
		close(done)
		<-stopped
		return peak
	}
}

// A host's variables reach When next to tool and args; gates of NewGates do not see them.
func TestGateEnvVariables(t *testing.T) {
	env, err := NewGateEnv(GateVariables{Strings: []string{"namespace"}, StringMaps: []string{"labels"}})
	if err != nil {
		t.Fatal(err)
	}
	g, err := env.Compile("p", GateSpec{Tools: []string{"pay"},
		When: `namespace.startsWith("prod-") && labels["team"] == "payments" && args.amount > 1000.0`})
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	vars := func(ns string, labels map[string]string, amount float64) map[string]any {
		return map[string]any{"tool": "pay", "args": map[string]any{"amount": amount}, "namespace": ns, "labels": labels}
	}
	tests := []struct {
		name    string
		vars    map[string]any
		want    bool
		wantErr string
	}{
		{name: "all hold", vars: vars("prod-eu", map[string]string{"team": "payments"}, 5000), want: true},
		{name: "other namespace", vars: vars("dev", map[string]string{"team": "payments"}, 5000)},
		{name: "other label", vars: vars("prod-eu", map[string]string{"team": "web"}, 5000)},
		{name: "small amount", vars: vars("prod-eu", map[string]string{"team": "payments"}, 5)},
		{name: "a missing label is undecidable, so it holds", vars: vars("prod-eu", map[string]string{}, 5000), want: true,
			wantErr: "evaluating when: no such key: team"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := g.Holds(tt.vars)
			if got != tt.want || errString(err) != tt.wantErr {
				t.Errorf("Holds = %v, %q; want %v, %q", got, errString(err), tt.want, tt.wantErr)
			}
		})
	}
	if !g.Matches("pay") || g.Matches("payout") {
		t.Errorf("Matches: the glob is the exact name pay")
	}
	if _, err := env.Compile("p", GateSpec{When: `labels.team + 1 == 2`}); err == nil || !strings.Contains(err.Error(), "found no matching overload") {
		t.Errorf("labels are strings: Compile = %v, want an overload error", err)
	}
	if _, err := env.Compile("p", GateSpec{When: `namespace + 1 == 2`}); err == nil ||
		!strings.Contains(err.Error(), "| namespace + 1 == 2") || strings.Contains(err.Error(), "_amespace") {
		t.Errorf("an error shows the expression as written: Compile = %v", err)
	}
	if _, err := NewGates([]GateSpec{{When: `namespace == "prod"`}}); err == nil || !strings.Contains(err.Error(), "reserved identifier: namespace") {
		t.Errorf("run gates see tool and args only: NewGates = %v", err)
	}
}

// namespace, a word CEL reserves, names the variable wherever it is an identifier, and nothing
// else: a field, a string, a comment and an escaped field keep their text.
func TestGateEnvReservedWord(t *testing.T) {
	env, err := NewGateEnv(GateVariables{Strings: []string{"namespace"}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		when string
		args map[string]any
		want bool
	}{
		{when: `namespace == "prod"`, want: true},
		{when: `namespace == "namespace"`},
		{when: "args.namespace == namespace // namespace", args: map[string]any{"namespace": "prod"}, want: true},
		{when: "args.namespace == namespace", args: map[string]any{"namespace": "dev"}},
		{when: "args.`namespace` == 'prod'", args: map[string]any{"namespace": "prod"}, want: true},
		{when: `["a", "b"].exists(n, n + namespace == "bprod")`, want: true},
		{when: `{namespace: 1}["prod"] == 1`, want: true},
		{when: `has(args.namespace)`, args: map[string]any{"namespace": "x"}, want: true},
		{when: `"€" + namespace == "€prod"`, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.when, func(t *testing.T) {
			g, err := env.Compile("p", GateSpec{When: tt.when})
			if err != nil {
				t.Fatalf("Compile: %v", err)
			}
			if tt.args == nil {
				tt.args = map[string]any{}
			}
			got, err := g.Holds(map[string]any{"tool": "t", "args": tt.args, "namespace": "prod"})
			if got != tt.want || err != nil {
				t.Errorf("Holds = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// Approval renders the gate's prompt over tool and arguments, or gives the host's default.
func TestGateApproval(t *testing.T) {
	env, err := NewGateEnv(GateVariables{})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := env.Compile("p", GateSpec{})
	if err != nil {
		t.Fatal(err)
	}
	custom, err := env.Compile("p", GateSpec{Prompt: "Run {{.tool}} on {{index .arguments \"host\"}}?"})
	if err != nil {
		t.Fatal(err)
	}
	broken, err := env.Compile("p", GateSpec{Prompt: `{{index .arguments.list 5}}`})
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]any{"host": "db1"}
	got, err := plain.Approval("id-1", "the default", "ssh", args, "", time.Now)
	want := &Request{ID: "id-1", Kind: KindApproval, Prompt: "the default", Data: map[string]any{"tool": "ssh", "arguments": args}}
	if err != nil || !cmp.Equal(got, want) {
		t.Errorf("Approval = %+v, %v; want %+v", got, err, want)
	}
	if got, err := custom.Approval("id-1", "the default", "ssh", args, "", time.Now); err != nil || got.Prompt != "Run ssh on db1?" {
		t.Errorf("Approval = %+v, %v; want the rendered prompt", got, err)
	}
	if got, err := broken.Approval("id-1", "the default", "ssh", map[string]any{"list": []any{}}, "", time.Now); got != nil || !errors.Is(err, ErrPromptRender) {
		t.Errorf("Approval = %+v, %v; want no request and ErrPromptRender", got, err)
	}
}

// A glob matched without path.Match matches what path.Match does.
func TestToolGlobIsPathMatch(t *testing.T) {
	patterns := []string{"shell", "delete_*", "*", "", "github_*_merge", "db_drop?", "a[bc]*", `a\*`, "x*y*", "pay*"}
	names := []string{"shell", "shell2", "delete_", "delete_user", "delete_a/b", "delete", "", "github_x_merge", "db_drop1",
		"ab", "ac/d", "a*", "xy", "x/y", "payment", "pay", "€pay", "shel"}
	for _, p := range patterns {
		g := newToolGlob(p)
		for _, n := range names {
			want, _ := path.Match(p, n)
			if got := g.match(n); got != want {
				t.Errorf("pattern %q, name %q: match = %v, path.Match = %v", p, n, got, want)
			}
		}
	}
}

package tools

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"text/template"
	"text/template/parse"
	"time"
	"unicode/utf8"

	"github.com/google/cel-go/cel"

	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// GateSpec is one approval rule (README, "Built-ins and approval gates"): calls to matching tools for which When holds are
// parked on an approval Request before the tool runs.
type GateSpec struct {
	// Tools are globs over final tool names with path.Match semantics; empty means every tool.
	Tools []string
	// When is a CEL expression over `tool` (string) and `args` (map); empty means always.
	// A missing key is an evaluation error (and so requires approval): guard optional
	// arguments with has(args.key).
	When string
	// Prompt is a text/template over .tool and .arguments; empty means
	// "Approve the call to <tool>?". It renders within bounds (see renderPrompt).
	Prompt string
}

// ApprovalIDPrefix starts the id of every approval Request, followed by the tool call id.
const ApprovalIDPrefix = "toolguard:"

// gateCostLimit bounds one evaluation of a When expression, so a pathological expression in a
// spec cannot stall the manager.
const gateCostLimit = 100_000

type gate struct {
	tools  []string
	when   cel.Program
	prompt *template.Template
}

// Gates decides which tool calls need an approval first.
type Gates struct {
	gates []gate
	// now is the clock a prompt render is timed with.
	now func() time.Time
}

// NewGates compiles every gate once. An error names the gate index and what to fix.
func NewGates(specs []GateSpec) (*Gates, error) {
	env, err := cel.NewEnv(
		cel.Variable("tool", cel.StringType),
		cel.Variable("args", cel.MapType(cel.StringType, cel.DynType)),
	)
	if err != nil {
		return nil, fmt.Errorf("approval gates: building the CEL environment: %w", err)
	}
	gs := &Gates{now: time.Now}
	for i, s := range specs {
		g := gate{tools: s.Tools}
		for _, p := range s.Tools {
			if _, err := path.Match(p, ""); err != nil {
				return nil, fmt.Errorf("approval gate %d: tool pattern %q: %w", i, p, err)
			}
		}
		if s.When != "" {
			ast, iss := env.Compile(s.When)
			if iss.Err() != nil {
				return nil, fmt.Errorf("approval gate %d: when %q: %w", i, s.When, iss.Err())
			}
			if t := ast.OutputType(); !t.IsExactType(cel.BoolType) && !t.IsExactType(cel.DynType) {
				return nil, fmt.Errorf("approval gate %d: when %q yields %s, want bool", i, s.When, t)
			}
			if g.when, err = env.Program(ast, cel.CostLimit(gateCostLimit)); err != nil {
				return nil, fmt.Errorf("approval gate %d: when %q: %w", i, s.When, err)
			}
		}
		if s.Prompt != "" {
			if g.prompt, err = parsePrompt(fmt.Sprintf("gate%d", i), s.Prompt); err != nil {
				return nil, fmt.Errorf("approval gate %d: prompt: %w", i, err)
			}
		}
		gs.gates = append(gs.gates, g)
	}
	return gs, nil
}

// Check returns the approval Request for a call, or nil when no gate applies. The first gate
// that applies supplies the prompt.
//
// A When that fails to evaluate, or yields a non-bool, requires approval: a gate exists because
// the call may be dangerous, so an expression we cannot decide must not wave it through. The
// error is returned alongside the Request so the caller can report the broken expression.
//
// A prompt that cannot be rendered returns no Request and an error wrapping ErrPromptRender: the
// gate's spec is at fault, and the call must not run.
func (gs *Gates) Check(name string, args map[string]any, callID, rawArguments string) (*Request, error) {
	if gs == nil {
		return nil, nil
	}
	if args == nil {
		args = map[string]any{}
	}
	for i, g := range gs.gates {
		if !g.matches(name) {
			continue
		}
		applies, evalErr := g.holds(name, args)
		if !applies {
			continue
		}
		data := map[string]any{"tool": name, "arguments": approvalArguments(args, rawArguments)}
		prompt, err := g.render(name, data, gs.now)
		if err != nil {
			return nil, fmt.Errorf("approval gate %d: %w: %w", i, ErrPromptRender, err)
		}
		req := &Request{ID: ApprovalIDPrefix + callID, Kind: KindApproval, Prompt: prompt, Data: data}
		if evalErr != nil {
			return req, fmt.Errorf("approval gate %d: %w; approval is required", i, evalErr)
		}
		return req, nil
	}
	return nil, nil
}

func (g gate) matches(name string) bool {
	if len(g.tools) == 0 {
		return true
	}
	for _, p := range g.tools {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// holds reports whether the gate's condition holds; an undecidable condition holds (see Check).
func (g gate) holds(name string, args map[string]any) (bool, error) {
	if g.when == nil {
		return true, nil
	}
	out, _, err := g.when.Eval(map[string]any{"tool": name, "args": args})
	if err != nil {
		return true, fmt.Errorf("evaluating when: %w", err)
	}
	b, ok := out.Value().(bool)
	if !ok {
		return true, fmt.Errorf("when yielded %s, want bool", out.Type())
	}
	return b, nil
}

// render executes the gate's prompt within its bounds; see renderPrompt.
func (g gate) render(name string, data map[string]any, now func() time.Time) (string, error) {
	if g.prompt == nil {
		return "Approve the call to " + name + "?", nil
	}
	view := map[string]any{"tool": data["tool"], "arguments": data["arguments"]}
	if args, ok := data["arguments"].(map[string]any); ok {
		view["arguments"] = promptArgs(args)
	}
	return renderPrompt(g.prompt, view, now)
}

// promptArgs prints as JSON in a prompt ({{.arguments}}), and still indexes like a map
// ({{index .arguments "branch"}}).
type promptArgs map[string]any

func (a promptArgs) String() string {
	raw, err := json.Marshal(map[string]any(a))
	if err != nil {
		return fmt.Sprint(map[string]any(a))
	}
	return string(raw)
}

// approvalArguments are the parsed arguments, or the model's raw text when it did not parse, so
// the approver always sees what the tool would be called with.
func approvalArguments(args map[string]any, raw string) any {
	if len(args) > 0 || raw == "" {
		return jsonNative(args)
	}
	var parsed map[string]any
	if json.Unmarshal([]byte(raw), &parsed) != nil {
		return raw
	}
	return parsed
}

// Bounds of one prompt render (README, "Bounds and the network guard"). The template is written by the run's author and
// the arguments by the model; text/template has neither an output bound nor a context.
const (
	// promptOutputLimit bounds a rendered prompt, truncation note included. It is well within
	// what a PendingRequest holds, so a rendered prompt never keeps a gated call from waiting.
	promptOutputLimit = 4 << 10
	// promptValueLimit bounds a string a function builds. It is a rune more than the output
	// bound, so a value cut to it still overflows the output, and the cut shows as the note.
	promptValueLimit = promptOutputLimit + utf8.UTFMax
	// promptRenderTimeout bounds one render. A prompt renders in microseconds, and a heavy one
	// (a MiB argument printed many times) in tens of milliseconds on an idle machine; the bound
	// leaves room for a busy one. Only a template that loops (range over a large number, nested
	// ranges, recursive templates) reaches it. It runs on the executor, never a reconcile worker.
	promptRenderTimeout = time.Second
	// maxPrintfWidth bounds a printf width or precision: fmt pads in memory, before any byte
	// reaches the bounded output.
	maxPrintfWidth = 256
)

// A byte is never fewer than one character: a rendered prompt fits a PendingRequest's prompt,
// and this fails to compile when the render bound outgrows it.
const _ = uint(wire.MaxPromptLen - promptOutputLimit)

// ErrPromptRender marks an approval prompt that could not be rendered within its bounds, or at
// all: the gate's spec is at fault.
var ErrPromptRender = errors.New("prompt cannot be rendered")

var (
	errPromptFull    = errors.New("prompt output bound reached")
	errPromptTimeout = errors.New("prompt time bound reached")
)

// tickFunc is planted first in every range body and every template, the only places a template
// can loop, so a loop that writes nothing still meets the clock.
const tickFunc = "toolnexusTick"

// parsePrompt parses a prompt template and plants a tick in every loop.
func parsePrompt(name, text string) (*template.Template, error) {
	funcs := (&promptRender{}).funcs() // only the names matter when parsing
	t, err := template.New(name).Funcs(funcs).Parse(text)
	if err != nil {
		return nil, err
	}
	tick, err := template.New("tick").Funcs(funcs).Parse("{{" + tickFunc + "}}")
	if err != nil {
		return nil, err
	}
	node := tick.Root.Nodes[0]
	for _, tt := range t.Templates() {
		if tt.Tree != nil {
			tt.Root.Nodes = append([]parse.Node{node}, tt.Root.Nodes...)
			plantTicks(tt.Root, node)
		}
	}
	return t, nil
}

func plantTicks(list *parse.ListNode, tick parse.Node) {
	if list == nil {
		return
	}
	for _, n := range list.Nodes {
		switch n := n.(type) {
		case *parse.RangeNode:
			n.List.Nodes = append([]parse.Node{tick}, n.List.Nodes...)
			plantTicks(n.List, tick)
			plantTicks(n.ElseList, tick)
		case *parse.IfNode:
			plantTicks(n.List, tick)
			plantTicks(n.ElseList, tick)
		case *parse.WithNode:
			plantTicks(n.List, tick)
			plantTicks(n.ElseList, tick)
		}
	}
}

// renderPrompt executes t into a writer that stops it at the output bound, and checks the clock
// on every write and every tick. Output past the bound is dropped, and a note says so; a render
// that runs out of time, or fails, is an error.
func renderPrompt(t *template.Template, data any, now func() time.Time) (string, error) {
	r := &promptRender{now: now, deadline: now().Add(promptRenderTimeout)}
	// The clone shares the parsed tree; it only gives this render its own functions.
	clone, err := t.Clone()
	if err != nil {
		return "", err
	}
	err = clone.Funcs(r.funcs()).Execute(r, data)
	switch {
	case errors.Is(err, errPromptFull):
		note := fmt.Sprintf("… [prompt truncated at %d bytes]", promptOutputLimit)
		return clip.Bytes(r.out.String(), promptOutputLimit-len(note)) + note, nil
	case errors.Is(err, errPromptTimeout):
		return "", fmt.Errorf("rendering took longer than %s", promptRenderTimeout)
	case err != nil:
		return "", err
	}
	return r.out.String(), nil
}

// promptRender is one execution of a prompt: its output so far and the clock it must beat.
type promptRender struct {
	out      strings.Builder
	now      func() time.Time
	deadline time.Time
}

func (r *promptRender) step() error {
	if r.now().After(r.deadline) {
		return errPromptTimeout
	}
	return nil
}

// Write keeps up to promptOutputLimit bytes and then fails, which ends Execute.
func (r *promptRender) Write(p []byte) (int, error) {
	if err := r.step(); err != nil {
		return 0, err
	}
	if room := promptOutputLimit - r.out.Len(); len(p) > room {
		r.out.Write(p[:room])
		return room, errPromptFull
	}
	return r.out.Write(p)
}

// funcs replaces the builtins that can return more than they were given: print, printf and
// println repeat and pad, html, js and urlquery escape. Each takes its arguments small (see
// small), printf refuses widths and precisions past maxPrintfWidth (checked before fmt runs,
// since fmt allocates the padding itself), and every result is cut to promptValueLimit, so
// `{{$s = printf "%s%s" $s $s}}` repeated cannot double a string past it. The builtins that never
// grow their input (index, slice, len, the comparisons) stay.
func (r *promptRender) funcs() template.FuncMap {
	bounded := func(f func(...any) string) func(...any) (string, error) {
		return func(args ...any) (string, error) {
			small, err := r.small(args)
			if err != nil {
				return "", err
			}
			return clip.Bytes(f(small...), promptValueLimit), nil
		}
	}
	return template.FuncMap{
		tickFunc:   func() (string, error) { return "", r.step() },
		"print":    bounded(fmt.Sprint),
		"println":  bounded(fmt.Sprintln),
		"html":     bounded(template.HTMLEscaper),
		"js":       bounded(template.JSEscaper),
		"urlquery": bounded(template.URLQueryEscaper),
		"printf": func(format string, args ...any) (string, error) {
			if err := checkPrintfFormat(format); err != nil {
				return "", err
			}
			return bounded(func(a ...any) string { return fmt.Sprintf(format, a...) })(args...)
		},
	}
}

// small returns args with every value that may format large (a string past promptValueLimit, a
// map, a slice, the arguments) replaced by its %v text cut to that limit. A call that names one
// large argument many times then formats it once, and the clock is checked between arguments.
func (r *promptRender) small(args []any) ([]any, error) {
	out := make([]any, len(args))
	for i, a := range args {
		if err := r.step(); err != nil {
			return nil, err
		}
		switch v := reflect.ValueOf(a); {
		case v.Kind() <= reflect.Complex128: // nil, bool and numbers
			out[i] = a
		case v.Kind() == reflect.String:
			out[i] = clip.Bytes(v.String(), promptValueLimit)
		default:
			out[i] = clip.Bytes(fmt.Sprint(a), promptValueLimit)
		}
	}
	return out, nil
}

// printfDirective matches a fmt directive up to its verb: %%, or flags, an argument index, a
// width and a precision, where a width or precision may be * (taken from an argument).
var printfDirective = regexp.MustCompile(`%(?:%|[-+# 0]*(?:\[\d+\])?(\*|\d+)?(?:\.(?:\[\d+\])?(\*|\d+)?)?)`)

func checkPrintfFormat(format string) error {
	for _, m := range printfDirective.FindAllStringSubmatch(format, -1) {
		for _, n := range m[1:] {
			if n == "*" {
				return errors.New("a width or precision taken from an argument (*) is not allowed")
			}
			if w, err := strconv.Atoi(n); n != "" && (err != nil || w > maxPrintfWidth) {
				return fmt.Errorf("width or precision %s is more than %d", n, maxPrintfWidth)
			}
		}
	}
	return nil
}

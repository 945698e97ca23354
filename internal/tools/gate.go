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

	"github.com/antlr4-go/antlr/v4"
	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/interpreter"
	"github.com/google/cel-go/parser/gen"

	"github.com/toolnexus/operator/internal/clip"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// GateSpec is one approval rule (README, "Built-ins and approval gates"): calls to matching tools for which When holds are
// parked on an approval Request before the tool runs.
type GateSpec struct {
	// Tools are globs over final tool names with path.Match semantics; empty means every tool.
	Tools []string
	// When is a CEL expression over `tool` (string), `args` (map) and the variables of the
	// GateEnv that compiles it (NewGates: none); empty means always.
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

// GateVariables declares what a gate's When sees besides tool and args, by name: the host's
// facts about the call (for an ApprovalPolicy, the run's namespace and labels).
type GateVariables struct {
	// Strings are string variables.
	Strings []string
	// StringMaps are maps from string to string.
	StringMaps []string
}

// GateEnv compiles gates whose When sees tool, args and the variables it was made with.
type GateEnv struct {
	cel *cel.Env
	// hidden maps each variable named by a word CEL reserves to the name it is declared under,
	// words the other way.
	hidden, words map[string]string
}

// celReserved are the words CEL's grammar reserves (the CEL language definition, "Syntax"):
// the parser refuses them as identifiers, and `namespace` is one. A variable so named is
// declared under another name of the same length, and each expression is compiled with the
// word renamed where it names a variable (see hide), so a policy can write
// `namespace == "prod"` as its documentation says.
var celReserved = map[string]bool{"as": true, "break": true, "const": true, "continue": true, "else": true,
	"for": true, "function": true, "if": true, "import": true, "let": true, "loop": true, "package": true,
	"namespace": true, "return": true, "var": true, "void": true, "while": true}

// NewGateEnv returns the environment of gates over tool, args and vars.
func NewGateEnv(vars GateVariables) (*GateEnv, error) {
	e := &GateEnv{hidden: map[string]string{}, words: map[string]string{}}
	opts := []cel.EnvOption{
		cel.Variable("tool", cel.StringType),
		cel.Variable("args", cel.MapType(cel.StringType, cel.DynType)),
	}
	declare := func(name string, t *cel.Type) {
		if celReserved[name] {
			e.hidden[name], e.words["_"+name[1:]] = "_"+name[1:], name
			name = e.hidden[name]
		}
		opts = append(opts, cel.Variable(name, t))
	}
	for _, name := range vars.Strings {
		declare(name, cel.StringType)
	}
	for _, name := range vars.StringMaps {
		declare(name, cel.MapType(cel.StringType, cel.StringType))
	}
	var err error
	if e.cel, err = cel.NewEnv(opts...); err != nil {
		return nil, fmt.Errorf("building the CEL environment: %w", err)
	}
	return e, nil
}

// hide renames, in expr, every identifier that names a variable declared under a hidden name:
// an identifier token of CEL's own lexer that does not follow a dot (after a dot it selects a
// field, where reserved words are allowed). Strings, comments and escaped identifiers are other
// tokens, left as they are. A hidden name is as long as the word, so positions in errors hold.
func (e *GateEnv) hide(expr string) string {
	if len(e.hidden) == 0 {
		return expr
	}
	src := []rune(expr)
	lexer := gen.NewCELLexer(antlr.NewInputStream(expr))
	lexer.RemoveErrorListeners() // the parser reports what does not lex
	afterDot := false
	for tok := lexer.NextToken(); tok.GetTokenType() != antlr.TokenEOF; tok = lexer.NextToken() {
		if tok.GetChannel() != antlr.TokenDefaultChannel {
			continue
		}
		if hidden, ok := e.hidden[tok.GetText()]; ok && tok.GetTokenType() == gen.CELLexerIDENTIFIER && !afterDot {
			copy(src[tok.GetStart():], []rune(hidden))
		}
		afterDot = tok.GetTokenType() == gen.CELLexerDOT
	}
	return string(src)
}

// shown gives the words their names back in a compiler's message about a hidden expression.
func (e *GateEnv) shown(err error) error {
	if len(e.hidden) == 0 {
		return err
	}
	msg := err.Error()
	for word, hidden := range e.hidden {
		msg = strings.ReplaceAll(msg, hidden, word)
	}
	return errors.New(msg)
}

// Gate is one compiled GateSpec.
type Gate struct {
	tools []toolGlob
	when  cel.Program
	// words are the hidden variable names of when's environment, to the words callers use.
	words  map[string]string
	prompt *template.Template
}

// Compile compiles s; name names the prompt template in its errors. An error names the field
// (tool pattern, when, prompt) and what to fix.
func (e *GateEnv) Compile(name string, s GateSpec) (*Gate, error) {
	g := &Gate{words: e.words}
	for _, p := range s.Tools {
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("tool pattern %q: %w", p, err)
		}
		g.tools = append(g.tools, newToolGlob(p))
	}
	if s.When != "" {
		ast, iss := e.cel.Compile(e.hide(s.When))
		if iss.Err() != nil {
			return nil, fmt.Errorf("when %q: %w", s.When, e.shown(iss.Err()))
		}
		if t := ast.OutputType(); !t.IsExactType(cel.BoolType) && !t.IsExactType(cel.DynType) {
			return nil, fmt.Errorf("when %q yields %s, want bool", s.When, t)
		}
		var err error
		if g.when, err = e.cel.Program(ast, cel.CostLimit(gateCostLimit)); err != nil {
			return nil, fmt.Errorf("when %q: %w", s.When, err)
		}
	}
	if s.Prompt != "" {
		var err error
		if g.prompt, err = parsePrompt(name, s.Prompt); err != nil {
			return nil, fmt.Errorf("prompt: %w", err)
		}
	}
	return g, nil
}

// Gates decides which tool calls need an approval first.
type Gates struct {
	gates []*Gate
	// now is the clock a prompt render is timed with.
	now func() time.Time
}

// NewGates compiles every gate once. An error names the gate index and what to fix.
func NewGates(specs []GateSpec) (*Gates, error) {
	env, err := NewGateEnv(GateVariables{})
	if err != nil {
		return nil, fmt.Errorf("approval gates: %w", err)
	}
	gs := &Gates{now: time.Now}
	for i, s := range specs {
		g, err := env.Compile(fmt.Sprintf("gate%d", i), s)
		if err != nil {
			return nil, fmt.Errorf("approval gate %d: %w", i, err)
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
		if !g.Matches(name) {
			continue
		}
		applies, evalErr := g.Holds(map[string]any{"tool": name, "args": args})
		if !applies {
			continue
		}
		req, err := g.Approval(ApprovalIDPrefix+callID, "Approve the call to "+name+"?", name, args, rawArguments, gs.now)
		if err != nil {
			return nil, fmt.Errorf("approval gate %d: %w", i, err)
		}
		if evalErr != nil {
			return req, fmt.Errorf("approval gate %d: %w; approval is required", i, evalErr)
		}
		return req, nil
	}
	return nil, nil
}

// Matches reports whether one of the gate's tool globs matches the tool name (every name when
// it has none).
func (g *Gate) Matches(name string) bool {
	if len(g.tools) == 0 {
		return true
	}
	for _, p := range g.tools {
		if p.match(name) {
			return true
		}
	}
	return false
}

// toolGlob is a tool pattern. The shapes most patterns have, a name or a prefix and a star, are
// matched without path.Match: a gate is matched on every tool call, against every policy.
type toolGlob struct {
	pattern string
	// literal is the whole pattern (plain), or the part before its one trailing star (prefix).
	literal       string
	plain, prefix bool
}

func newToolGlob(pattern string) toolGlob {
	switch i := strings.IndexAny(pattern, `*?[\`); {
	case i < 0:
		return toolGlob{pattern: pattern, literal: pattern, plain: true}
	case i == len(pattern)-1 && pattern[i] == '*':
		return toolGlob{pattern: pattern, literal: pattern[:i], prefix: true}
	}
	return toolGlob{pattern: pattern}
}

// match is path.Match(g.pattern, name), whose star matches no slash.
func (g toolGlob) match(name string) bool {
	switch {
	case g.plain:
		return name == g.literal
	case g.prefix:
		return strings.HasPrefix(name, g.literal) && !strings.Contains(name[len(g.literal):], "/")
	}
	ok, _ := path.Match(g.pattern, name)
	return ok
}

// Holds reports whether the gate's When holds over vars, which give tool, args and every
// variable of the gate's environment. An undecidable When holds, and the error says why (see
// Check).
func (g *Gate) Holds(vars map[string]any) (bool, error) {
	if g.when == nil {
		return true, nil
	}
	var activation any = vars
	if len(g.words) > 0 {
		activation = wordVars{vars: vars, words: g.words}
	}
	out, _, err := g.when.Eval(activation)
	if err != nil {
		return true, fmt.Errorf("evaluating when: %w", err)
	}
	b, ok := out.Value().(bool)
	if !ok {
		return true, fmt.Errorf("when yielded %s, want bool", out.Type())
	}
	return b, nil
}

// wordVars resolves a hidden variable name by the word it stands for (see GateEnv.hide).
type wordVars struct {
	vars  map[string]any
	words map[string]string
}

func (a wordVars) ResolveName(name string) (any, bool) {
	if word, ok := a.words[name]; ok {
		name = word
	}
	v, ok := a.vars[name]
	return v, ok
}

func (a wordVars) Parent() interpreter.Activation { return nil }

// Approval is the approval Request id for a call of tool the gate applies to: its data are the
// tool and the arguments the approver must see, its prompt the gate's rendered within bounds
// (timed by now), or defaultPrompt when the gate has none. A prompt that cannot be rendered is
// an error wrapping ErrPromptRender.
func (g *Gate) Approval(id, defaultPrompt, tool string, args map[string]any, rawArguments string, now func() time.Time) (*Request, error) {
	data := map[string]any{"tool": tool, "arguments": approvalArguments(args, rawArguments)}
	prompt, err := g.render(defaultPrompt, data, now)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPromptRender, err)
	}
	return &Request{ID: id, Kind: KindApproval, Prompt: prompt, Data: data}, nil
}

// render executes the gate's prompt within its bounds; see renderPrompt.
func (g *Gate) render(defaultPrompt string, data map[string]any, now func() time.Time) (string, error) {
	if g.prompt == nil {
		return defaultPrompt, nil
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

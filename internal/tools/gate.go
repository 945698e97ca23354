package tools

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"text/template"

	"github.com/google/cel-go/cel"
)

// GateSpec is one approval rule (SPEC 4.4): calls to matching tools for which When holds are
// parked on an approval Request before the tool runs.
type GateSpec struct {
	// Tools are globs over final tool names with path.Match semantics; empty means every tool.
	Tools []string
	// When is a CEL expression over `tool` (string) and `args` (map); empty means always.
	// A missing key is an evaluation error (and so requires approval): guard optional
	// arguments with has(args.key).
	When string
	// Prompt is a text/template over .tool and .arguments; empty means
	// "Approve the call to <tool>?".
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
type Gates struct{ gates []gate }

// NewGates compiles every gate once. An error names the gate index and what to fix.
func NewGates(specs []GateSpec) (*Gates, error) {
	env, err := cel.NewEnv(
		cel.Variable("tool", cel.StringType),
		cel.Variable("args", cel.MapType(cel.StringType, cel.DynType)),
	)
	if err != nil {
		return nil, fmt.Errorf("approval gates: building the CEL environment: %w", err)
	}
	gs := &Gates{}
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
			if g.prompt, err = template.New(fmt.Sprintf("gate%d", i)).Parse(s.Prompt); err != nil {
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
		req := &Request{ID: ApprovalIDPrefix + callID, Kind: KindApproval, Prompt: g.render(name, data), Data: data}
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

func (g gate) render(name string, data map[string]any) string {
	fallback := "Approve the call to " + name + "?"
	if g.prompt == nil {
		return fallback
	}
	view := map[string]any{"tool": data["tool"], "arguments": data["arguments"]}
	if args, ok := data["arguments"].(map[string]any); ok {
		view["arguments"] = promptArgs(args)
	}
	var b bytes.Buffer
	if err := g.prompt.Execute(&b, view); err != nil {
		return fallback
	}
	return b.String()
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

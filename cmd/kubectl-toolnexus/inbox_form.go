package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/tools"
)

// formField is one input of a form generated from an MCP elicitation's requested schema: a flat
// object schema whose properties are strings (optionally with a format), numbers, integers,
// booleans or enums (enum with optional enumNames, or oneOf of {const, title}).
type formField struct {
	Name, Label, Description string
	Type                     string // string, number, integer or boolean
	Input                    string // the HTML input type: text, email, url, date, number, checkbox; select for enums
	Options                  []formOption
	Required                 bool
	Default                  string
	Min, Max                 string // minimum/maximum, or minLength/maxLength for strings
}

type formOption struct{ Value, Label string }

// schemaProperty is what the form reads of one property of a requested schema.
type schemaProperty struct {
	Type        string            `json:"type"`
	Title       string            `json:"title"`
	Description string            `json:"description"`
	Format      string            `json:"format"`
	Enum        []string          `json:"enum"`
	EnumNames   []string          `json:"enumNames"`
	OneOf       []json.RawMessage `json:"oneOf"`
	Default     json.RawMessage   `json:"default"`
	Minimum     *float64          `json:"minimum"`
	Maximum     *float64          `json:"maximum"`
	MinLength   *int              `json:"minLength"`
	MaxLength   *int              `json:"maxLength"`
}

// formFields reads a requested schema into form fields, in the order the schema lists its
// properties. It fails for anything but a flat object of primitive properties; the inbox then
// offers the answer as JSON instead.
func formFields(schema json.RawMessage) ([]formField, error) {
	var obj struct {
		Type       string          `json:"type"`
		Properties json.RawMessage `json:"properties"`
		Required   []string        `json:"required"`
	}
	if err := json.Unmarshal(schema, &obj); err != nil {
		return nil, err
	}
	if obj.Type != "object" || len(obj.Properties) == 0 {
		return nil, errors.New("the schema is not an object with properties")
	}
	names, err := objectKeys(obj.Properties)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, errors.New("the schema has no properties")
	}
	var props map[string]schemaProperty
	if err := json.Unmarshal(obj.Properties, &props); err != nil {
		return nil, err
	}
	fields := make([]formField, 0, len(names))
	for _, name := range names {
		f, err := newFormField(name, props[name], slices.Contains(obj.Required, name))
		if err != nil {
			return nil, err
		}
		fields = append(fields, f)
	}
	return fields, nil
}

func newFormField(name string, p schemaProperty, required bool) (formField, error) {
	f := formField{Name: name, Label: p.Title, Description: p.Description, Type: p.Type, Required: required}
	if f.Label == "" {
		f.Label = name
	}
	if len(p.Default) > 0 {
		var v any
		if json.Unmarshal(p.Default, &v) == nil {
			f.Default = fmt.Sprint(v)
		}
	}
	bound := func(v *float64) string {
		if v == nil {
			return ""
		}
		return strconv.FormatFloat(*v, 'f', -1, 64)
	}
	switch p.Type {
	case "string":
		f.Input = map[string]string{"email": "email", "uri": "url", "date": "date"}[p.Format]
		if f.Input == "" {
			f.Input = "text"
		}
		if p.MinLength != nil {
			f.Min = strconv.Itoa(*p.MinLength)
		}
		if p.MaxLength != nil {
			f.Max = strconv.Itoa(*p.MaxLength)
		}
		for i, v := range p.Enum {
			label := v
			if i < len(p.EnumNames) {
				label = p.EnumNames[i]
			}
			f.Options = append(f.Options, formOption{Value: v, Label: label})
		}
		for _, raw := range p.OneOf {
			var o struct {
				Const string `json:"const"`
				Title string `json:"title"`
			}
			if err := json.Unmarshal(raw, &o); err != nil {
				return f, fmt.Errorf("property %q: oneOf holds something other than {const, title}", name)
			}
			f.Options = append(f.Options, formOption{Value: o.Const, Label: cmp.Or(o.Title, o.Const)})
		}
		if len(f.Options) > 0 {
			f.Input = "select"
		}
	case "number", "integer":
		f.Input, f.Min, f.Max = "number", bound(p.Minimum), bound(p.Maximum)
	case "boolean":
		f.Input = "checkbox"
	default:
		return f, fmt.Errorf("property %q has type %q, which the form does not offer", name, p.Type)
	}
	return f, nil
}

// objectKeys lists the keys of a JSON object in the order they are written.
func objectKeys(raw json.RawMessage) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("properties is not an object")
	}
	var keys []string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		keys = append(keys, t.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

// formData turns the submitted form into the answer's data object, typed as the schema says: the
// object an MCP server receives as the elicitation's content. Empty optional fields are left out.
func formData(fields []formField, form url.Values) (map[string]any, error) {
	data := map[string]any{}
	var problems []string
	for _, f := range fields {
		v := strings.TrimSpace(form.Get("f." + f.Name))
		if f.Type == "boolean" {
			data[f.Name] = v != ""
			continue
		}
		if v == "" {
			if f.Required {
				problems = append(problems, f.Label+" is required")
			}
			continue
		}
		switch f.Type {
		case "number":
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				problems = append(problems, f.Label+" must be a number")
			}
			data[f.Name] = n
		case "integer":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				problems = append(problems, f.Label+" must be a whole number")
			}
			data[f.Name] = n
		default:
			if len(f.Options) > 0 && !slices.ContainsFunc(f.Options, func(o formOption) bool { return o.Value == v }) {
				problems = append(problems, f.Label+" must be one of the choices")
			}
			data[f.Name] = v
		}
	}
	if len(problems) > 0 {
		return nil, errors.New(strings.Join(problems, "; "))
	}
	return data, nil
}

// questionAnswers turns the submitted form into the answer's data of a question request:
// {"answers": [{"question": Q, "answer": "choice"}]}, the answer a list when the question takes
// several choices. The question tool hands this object to the model as JSON.
func questionAnswers(qs []tools.Question, form url.Values) (map[string]any, error) {
	answers := make([]map[string]any, 0, len(qs))
	for i, q := range qs {
		key := "q." + strconv.Itoa(i)
		var answer any
		if q.Multiple {
			var picked []string
			for _, v := range form[key] {
				if v = strings.TrimSpace(v); v != "" {
					picked = append(picked, v)
				}
			}
			if len(picked) > 0 {
				answer = picked
			}
		} else if v := strings.TrimSpace(form.Get(key)); v != "" {
			answer = v
		}
		if answer == nil {
			return nil, fmt.Errorf("answer every question: %q has no answer", q.Question)
		}
		answers = append(answers, map[string]any{"question": q.Question, "answer": answer})
	}
	return map[string]any{"answers": answers}, nil
}

// requestData is what the inbox reads of a request's data.
type requestData struct {
	Schema    json.RawMessage  `json:"schema"`
	Questions []tools.Question `json:"questions"`
	// TokenScope says whose a login the operator completes becomes (SPEC §12).
	TokenScope string `json:"tokenScope"`
}

func dataOf(pr *toolnexusv1alpha1.PendingRequest) requestData {
	var d requestData
	if pr.Spec.Request.Data != nil {
		_ = json.Unmarshal(pr.Spec.Request.Data.Raw, &d)
	}
	return d
}

// answerFromForm builds the answer an action of the request page gives, in the shapes the plugin's
// approve, decline and answer commands send.
func answerFromForm(pr *toolnexusv1alpha1.PendingRequest, form url.Values) (toolnexusv1alpha1.Answer, error) {
	withData := func(data any) (toolnexusv1alpha1.Answer, error) {
		raw, err := json.Marshal(data)
		return toolnexusv1alpha1.Answer{OK: true, Data: jsonValue(raw)}, err
	}
	switch action := form.Get("action"); action {
	case "approve", "signed-in":
		return toolnexusv1alpha1.Answer{OK: true}, nil
	case "decline":
		return toolnexusv1alpha1.Answer{OK: false, Reason: cmp.Or(strings.TrimSpace(form.Get("reason")), "declined")}, nil
	case "output":
		return withData(map[string]string{"output": form.Get("output")})
	case "form":
		fields, err := formFields(dataOf(pr).Schema)
		if err != nil {
			return toolnexusv1alpha1.Answer{}, err
		}
		data, err := formData(fields, form)
		if err != nil {
			return toolnexusv1alpha1.Answer{}, err
		}
		return withData(data)
	case "question":
		data, err := questionAnswers(dataOf(pr).Questions, form)
		if err != nil {
			return toolnexusv1alpha1.Answer{}, err
		}
		return withData(data)
	case "data":
		ans, err := dataAnswer(form.Get("data"))
		if err != nil {
			return ans, fmt.Errorf("the data %w", err)
		}
		return ans, nil
	default:
		return toolnexusv1alpha1.Answer{}, fmt.Errorf("unknown action %q", action)
	}
}

package v1alpha1_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// These tests hold the API to the conventions kube-api-linter enforces (maxlength,
// optionalorrequired, ssatags, statusoptional, commentstart), checked on what the API server
// actually receives: the generated CRDs. They run without a cluster.

// field is one node of a CRD schema: a named property, or the items of a list.
type field struct {
	path   string // for example spec.tools[].http.url
	name   string // the JSON name; empty for list items
	schema *apiextensionsv1.JSONSchemaProps
	spec   bool // under spec (or a root field of a kind without spec)
}

// integersWithoutMinimum are integers whose values the manager copies from elsewhere unchecked: a
// minimum would make the API server refuse the whole status patch.
var integersWithoutMinimum = map[string]string{
	"status.usage.promptTokens":     "reported by the model endpoint",
	"status.usage.completionTokens": "reported by the model endpoint",
	"status.usage.totalTokens":      "reported by the model endpoint",
}

// formatsBoundedByThemselves are string formats whose values have a bounded length.
var formatsBoundedByThemselves = []string{"date-time", "date"}

// conventions are the rules every field of every CRD must follow; each returns why a field breaks
// it, or "".
var conventions = map[string]func(f field) string{
	"every string has maxLength, enum or a bounded format": func(f field) string {
		s := f.schema
		if s.Type != "string" || s.MaxLength != nil || len(s.Enum) > 0 || slices.Contains(formatsBoundedByThemselves, s.Format) {
			return ""
		}
		return "string without maxLength: add +kubebuilder:validation:MaxLength (or items:MaxLength)"
	},
	"every list has maxItems": func(f field) string {
		if f.schema.Type != "array" || f.schema.MaxItems != nil {
			return ""
		}
		return "list without maxItems: add +kubebuilder:validation:MaxItems"
	},
	"every list declares its listType": func(f field) string {
		if f.schema.Type != "array" || f.schema.XListType != nil {
			return ""
		}
		return "list without x-kubernetes-list-type: add +listType=atomic, set or map"
	},
	"every integer has a minimum": func(f field) string {
		if f.schema.Type != "integer" || f.schema.Minimum != nil || integersWithoutMinimum[f.path] != "" {
			return ""
		}
		return "integer without minimum: add +kubebuilder:validation:Minimum"
	},
	"every spec integer has a maximum": func(f field) string {
		if !f.spec || f.schema.Type != "integer" || f.schema.Maximum != nil {
			return ""
		}
		return "spec integer without maximum: add +kubebuilder:validation:Maximum"
	},
	"every field is documented, starting with its JSON name": func(f field) string {
		if f.name == "" {
			return ""
		}
		if !strings.HasPrefix(f.schema.Description, f.name+" ") {
			return fmt.Sprintf("description %q does not start with %q: write the field's doc comment", firstWords(f.schema.Description), f.name)
		}
		return ""
	},
	"every CEL rule has a message": func(f field) string {
		for _, r := range f.schema.XValidations {
			if r.Message == "" && r.MessageExpression == "" {
				return fmt.Sprintf("rule %q has no message", r.Rule)
			}
		}
		return ""
	},
}

func TestCRDConventions(t *testing.T) {
	for _, crd := range loadCRDs(t) {
		for _, v := range crd.Spec.Versions {
			root := v.Schema.OpenAPIV3Schema
			fields := rootFields(root)
			for name, check := range conventions {
				t.Run(crd.Name+"/"+v.Name+"/"+name, func(t *testing.T) {
					for _, f := range fields {
						if why := check(f); why != "" {
							t.Errorf("%s: %s", f.path, why)
						}
					}
				})
			}
			t.Run(crd.Name+"/"+v.Name+"/status fields are optional", func(t *testing.T) {
				if slices.Contains(root.Required, "status") {
					t.Errorf("status is required; it must be optional")
				}
				if status, ok := root.Properties["status"]; ok && len(status.Required) > 0 {
					t.Errorf("status requires %v; every status field must be optional", status.Required)
				}
			})
		}
	}
}

// TestAPIFieldMarkers checks the Go source for what the CRD cannot show: every serialised field
// says whether it is optional or required, exactly once.
func TestAPIFieldMarkers(t *testing.T) {
	files, err := filepath.Glob("*_types.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no API type files found: %v", err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		file, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			spec, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := spec.Type.(*ast.StructType)
			if !ok || isList(st) {
				return false
			}
			for _, fld := range st.Fields.List {
				if len(fld.Names) == 0 || fld.Tag == nil || strings.Contains(fld.Tag.Value, `json:"-"`) {
					continue // embedded TypeMeta/ObjectMeta, or not serialised
				}
				optional := hasMarker(fld.Doc, "+optional")
				required := hasMarker(fld.Doc, "+required")
				if optional == required {
					t.Errorf("%s: %s.%s must be marked exactly one of +optional or +required",
						fset.Position(fld.Pos()), spec.Name.Name, fld.Names[0].Name)
				}
			}
			return false
		})
	}
}

func loadCRDs(t *testing.T) []apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("..", "..", "config", "crd", "bases", "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no CRDs under config/crd/bases (run make manifests): %v", err)
	}
	var crds []apiextensionsv1.CustomResourceDefinition
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(raw, &crd); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		crds = append(crds, crd)
	}
	return crds
}

// rootFields flattens a kind's schema below its root, leaving out apiVersion, kind and metadata,
// which the API server owns.
func rootFields(root *apiextensionsv1.JSONSchemaProps) []field {
	var out []field
	for _, name := range sortedKeys(root.Properties) {
		if name == "apiVersion" || name == "kind" || name == "metadata" {
			continue
		}
		s := root.Properties[name]
		out = walk(out, field{path: name, name: name, schema: &s, spec: name != "status"})
	}
	return out
}

func walk(out []field, f field) []field {
	out = append(out, f)
	for _, name := range sortedKeys(f.schema.Properties) {
		s := f.schema.Properties[name]
		out = walk(out, field{path: f.path + "." + name, name: name, schema: &s, spec: f.spec})
	}
	if f.schema.Items != nil && f.schema.Items.Schema != nil {
		out = walk(out, field{path: f.path + "[]", schema: f.schema.Items.Schema, spec: f.spec})
	}
	if f.schema.AdditionalProperties != nil && f.schema.AdditionalProperties.Schema != nil {
		out = walk(out, field{path: f.path + "{}", schema: f.schema.AdditionalProperties.Schema, spec: f.spec})
	}
	return out
}

func sortedKeys(m map[string]apiextensionsv1.JSONSchemaProps) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// isList reports whether st is a <Kind>List, whose items field controller-gen never puts in a CRD.
func isList(st *ast.StructType) bool {
	for _, fld := range st.Fields.List {
		if sel, ok := fld.Type.(*ast.SelectorExpr); ok && len(fld.Names) == 0 && sel.Sel.Name == "ListMeta" {
			return true
		}
	}
	return false
}

func hasMarker(doc *ast.CommentGroup, marker string) bool {
	if doc == nil {
		return false
	}
	for _, c := range doc.List {
		if strings.TrimSpace(strings.TrimPrefix(c.Text, "//")) == marker {
			return true
		}
	}
	return false
}

func firstWords(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

package v1alpha1_test

import (
	"encoding/json"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/tools/wire"
)

// The loop parks a suspension only when a PendingRequest can hold it, by the bounds in package
// wire (it knows nothing of the API). These tests hold those bounds to the CRD the API server
// enforces, so the two cannot drift apart and leave a run retrying a create that is refused.

// TestRequestBoundsMatchTheCRD: each bound the loop checks is the generated schema's.
func TestRequestBoundsMatchTheCRD(t *testing.T) {
	spec := pendingRequestSpecSchema(t)
	cases := []struct {
		path     []string
		min, max int64
	}{
		{[]string{"request", "id"}, 1, wire.MaxRequestIDLen},
		{[]string{"request", "kind"}, 1, wire.MaxKindLen},
		{[]string{"request", "prompt"}, 0, wire.MaxPromptLen},
		{[]string{"request", "url"}, 0, wire.MaxURLLen},
		{[]string{"request", "expiresAt"}, 0, wire.MaxExpiresAtLen},
		{[]string{"toolCall", "name"}, 0, wire.MaxToolNameLen},
		// The loop counts the arguments in bytes, which are never fewer than their characters.
		{[]string{"toolCall", "arguments"}, 0, wire.MaxArgumentsBytes},
	}
	for _, tc := range cases {
		name := "spec." + strings.Join(tc.path, ".")
		t.Run(name, func(t *testing.T) {
			s := spec
			for _, p := range tc.path {
				next, ok := s.Properties[p]
				if !ok {
					t.Fatalf("the CRD has no %s", name)
				}
				s = &next
			}
			var min, max int64
			if s.MinLength != nil {
				min = *s.MinLength
			}
			if s.MaxLength != nil {
				max = *s.MaxLength
			}
			if min != tc.min || max != tc.max {
				t.Errorf("the CRD bounds %s to %d..%d characters, the loop to %d..%d", name, min, max, tc.min, tc.max)
			}
		})
	}
}

// TestPendingRequestAtItsBoundsFitsEtcd: a spec with every field a tool or a model fills at its
// bound, in the characters whose JSON is longest, stays under 512 KiB, so etcd's 1.5 MiB leaves the
// answer and the object's metadata a MiB.
func TestPendingRequestAtItsBoundsFitsEtcd(t *testing.T) {
	escaped := func(n int) string { return strings.Repeat("\x01", n) } // six bytes each: \u0001
	data := `{"d":"` + strings.Repeat("x", wire.MaxDataBytes-len(`{"d":""}`)) + `"}`
	preq := toolnexusv1alpha1.PendingRequest{Spec: toolnexusv1alpha1.PendingRequestSpec{
		RunRef: toolnexusv1alpha1.RunReference{Name: strings.Repeat("r", 253)},
		// The arguments are JSON text, so a quote or a backslash in them is already escaped once:
		// stored as a string, each byte of it becomes two.
		ToolCall: toolnexusv1alpha1.ToolCall{ID: escaped(256), Name: escaped(wire.MaxToolNameLen),
			Arguments: strings.Repeat(`\`, wire.MaxArgumentsBytes)},
		Request: toolnexusv1alpha1.Request{
			ID: escaped(wire.MaxRequestIDLen), Kind: escaped(wire.MaxKindLen), Prompt: escaped(wire.MaxPromptLen),
			URL: escaped(wire.MaxURLLen), Data: &apiextensionsv1.JSON{Raw: []byte(data)},
			ExpiresAt: escaped(wire.MaxExpiresAtLen),
		},
	}}
	raw, err := json.Marshal(preq)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > 512<<10 {
		t.Errorf("a PendingRequest at its bounds is %d bytes of JSON, more than 512 KiB", len(raw))
	}
}

// pendingRequestSpecSchema is the schema of spec in the PendingRequest CRD's served version.
func pendingRequestSpecSchema(t *testing.T) *apiextensionsv1.JSONSchemaProps {
	t.Helper()
	for _, crd := range loadCRDs(t) {
		if crd.Spec.Names.Kind != "PendingRequest" {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if v.Name == toolnexusv1alpha1.GroupVersion.Version && v.Schema != nil && v.Schema.OpenAPIV3Schema != nil {
				spec := v.Schema.OpenAPIV3Schema.Properties["spec"]
				return &spec
			}
		}
	}
	t.Fatal("no PendingRequest CRD of this version under config/crd/bases")
	return nil
}

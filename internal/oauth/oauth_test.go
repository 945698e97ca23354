package oauth

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestUnder(t *testing.T) {
	tests := []struct {
		target, resource string
		want             bool
	}{
		{"https://api.example.com/cal/today", "https://api.example.com/cal", true},
		{"https://api.example.com/cal", "https://api.example.com/cal", true},
		{"https://api.example.com/cal/today", "https://api.example.com/cal/", true},
		{"https://api.example.com/x", "https://api.example.com", true},
		{"https://api.example.com/calendar", "https://api.example.com/cal", false}, // not a path segment
		{"https://api.example.com/mail", "https://api.example.com/cal", false},
		{"http://api.example.com/cal", "https://api.example.com/cal", false}, // another scheme
		{"https://api.example.com:8443/cal", "https://api.example.com/cal", false},
		{"https://evil.example.com/cal", "https://api.example.com/cal", false},
		{"https://api.example.com/cal", "", false},
	}
	for _, tt := range tests {
		if got := Under(tt.target, tt.resource); got != tt.want {
			t.Errorf("Under(%q, %q) = %v, want %v", tt.target, tt.resource, got, tt.want)
		}
	}
}

func TestMetadataCandidates(t *testing.T) {
	tests := []struct {
		name, metadataURL, base string
		want                    []candidate
	}{
		{"challenge at a well-known path names its resource", "https://h/.well-known/oauth-protected-resource/mcp", "https://h/mcp",
			[]candidate{{"https://h/.well-known/oauth-protected-resource/mcp", "https://h/mcp"}}},
		{"challenge at the root well-known path", "https://h/.well-known/oauth-protected-resource", "https://h/api",
			[]candidate{{"https://h/.well-known/oauth-protected-resource", "https://h"},
				{"https://h/.well-known/oauth-protected-resource", "https://h/api"}}},
		{"challenge elsewhere is for the base", "https://h/meta.json", "https://h/api",
			[]candidate{{"https://h/meta.json", "https://h/api"}}},
		{"no challenge URL: the well-known URLs of the path and the origin", "", "https://h/v1/cal",
			[]candidate{{"https://h/.well-known/oauth-protected-resource/v1/cal", "https://h/v1/cal"},
				{"https://h/.well-known/oauth-protected-resource", "https://h"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, metadataCandidates(tt.metadataURL, tt.base), cmp.AllowUnexported(candidate{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestCheckIssuer(t *testing.T) {
	advertised := Endpoints{Issuer: "https://as", IssParameter: true}
	silent := Endpoints{Issuer: "https://as"}
	tests := []struct {
		name   string
		iss    string
		ep     Endpoints
		refuse bool
	}{
		{"advertised and sent", "https://as", advertised, false},
		{"advertised and missing", "", advertised, true},
		{"advertised and another issuer", "https://other", advertised, true},
		{"not advertised, not sent", "", silent, false},
		{"not advertised, sent its own", "https://as", silent, false},
		{"not advertised, another issuer (mix-up)", "https://other", silent, true},
	}
	for _, tt := range tests {
		err := checkIssuer(tt.iss, tt.ep)
		var refused *CallbackError
		if got := errors.As(err, &refused); got != tt.refuse {
			t.Errorf("%s: checkIssuer = %v, want refused %v", tt.name, err, tt.refuse)
		}
	}
}

func TestKeyIDSeparatesFields(t *testing.T) {
	a := Key{Namespace: "a", Scope: "Requester", Subject: "b\x00c", ClientID: "x", Base: "https://h"}
	b := Key{Namespace: "a", Scope: "Requester", Subject: "b", ClientID: "c\x00x", Base: "https://h"}
	if a.ID() == b.ID() {
		t.Error("two keys whose fields join alike share an id")
	}
}

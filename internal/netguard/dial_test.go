package netguard

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolnexus/operator/internal/netguard/netguardtest"
)

func prefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

// TestGuardCheck exercises the decision alone: nothing here dials.
func TestGuardCheck(t *testing.T) {
	tests := []struct {
		name        string
		deny, allow []netip.Prefix
		addr        string
		want        string
	}{
		{name: "metadata endpoint", addr: "169.254.169.254:80",
			want: "netguard: connection to 169.254.169.254:80 refused: 169.254.0.0/16 is denied (link-local)"},
		{name: "IPv4-mapped IPv6 is unmapped first", addr: "[::ffff:169.254.169.254]:80",
			want: "netguard: connection to [::ffff:169.254.169.254]:80 refused: 169.254.0.0/16 is denied (link-local)"},
		{name: "IPv6 link-local with a zone", addr: "[fe80::1%eth0]:443",
			want: "netguard: connection to [fe80::1%eth0]:443 refused: fe80::/10 is denied (link-local)"},
		{name: "private address allowed by default", addr: "10.1.2.3:443"},
		{name: "loopback allowed by default", addr: "127.0.0.1:8080"},
		{name: "global IPv6 allowed by default", addr: "[2001:db8::1]:443"},
		{name: "deny extends the defaults", deny: prefixes("10.0.0.0/8"), addr: "10.1.2.3:443",
			want: "netguard: connection to 10.1.2.3:443 refused: 10.0.0.0/8 is denied (deny list)"},
		{name: "defaults still apply with a deny list", deny: prefixes("10.0.0.0/8"), addr: "169.254.1.1:80",
			want: "netguard: connection to 169.254.1.1:80 refused: 169.254.0.0/16 is denied (link-local)"},
		{name: "a mapped deny prefix matches the IPv4 address", deny: prefixes("::ffff:10.0.0.0/104"), addr: "10.9.9.9:80",
			want: "netguard: connection to 10.9.9.9:80 refused: 10.0.0.0/8 is denied (deny list)"},
		{name: "a deny prefix matches a mapped address", deny: prefixes("10.0.0.0/8"), addr: "[::ffff:10.9.9.9]:80",
			want: "netguard: connection to [::ffff:10.9.9.9]:80 refused: 10.0.0.0/8 is denied (deny list)"},
		{name: "allow wins over link-local", allow: prefixes("169.254.169.254/32"), addr: "169.254.169.254:80"},
		{name: "allow is exact", allow: prefixes("169.254.169.254/32"), addr: "169.254.169.253:80",
			want: "netguard: connection to 169.254.169.253:80 refused: 169.254.0.0/16 is denied (link-local)"},
		{name: "allow wins over the deny list", deny: prefixes("10.0.0.0/8"), allow: prefixes("10.0.0.0/24"), addr: "10.0.0.7:80"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := newGuard(tt.deny, tt.allow).check(netip.MustParseAddrPort(tt.addr))
			if got := errString(err); got != tt.want {
				t.Errorf("check(%s) = %q, want %q", tt.addr, got, tt.want)
			}
			var denied *DeniedError
			if tt.want != "" && !errors.As(err, &denied) {
				t.Errorf("error %T is not a *DeniedError", err)
			}
		})
	}
}

// TestControlChecksTheDialedAddress calls the dialer hook the way net.Dialer does, after
// resolution; nothing here dials.
func TestControlChecksTheDialedAddress(t *testing.T) {
	g := newGuard(nil, nil)
	if err := g.control(context.Background(), "tcp4", "169.254.169.254:80", nil); err == nil {
		t.Error("control allowed 169.254.169.254:80")
	}
	if err := g.control(context.Background(), "tcp6", "[::1]:80", nil); err != nil {
		t.Errorf("control refused [::1]:80: %v", err)
	}
	want := `netguard: cannot check tcp address "metadata:80": ParseAddr("metadata"): unable to parse IP`
	if got := errString(g.control(context.Background(), "tcp", "metadata:80", nil)); got != want {
		t.Errorf("unresolved address: %q, want %q", got, want)
	}
}

func TestParseCIDRs(t *testing.T) {
	tests := []struct {
		in      string
		want    []netip.Prefix
		wantErr string
	}{
		{in: ""},
		{in: " , "},
		{in: "10.0.0.0/8", want: prefixes("10.0.0.0/8")},
		{in: "10.0.0.0/8, fd00::/8 ,", want: prefixes("10.0.0.0/8", "fd00::/8")},
		{in: "10.1.2.3/8", want: prefixes("10.0.0.0/8")},
		{in: "127.0.0.2", want: prefixes("127.0.0.2/32")},
		{in: "::1", want: prefixes("::1/128")},
		{in: "::ffff:169.254.0.0/112", want: prefixes("169.254.0.0/16")},
		{in: "10.0.0.0/8,metadata", wantErr: `netguard: "metadata" is not a CIDR such as 10.0.0.0/8 or fd00::/8`},
		{in: "10.0.0.0/33", wantErr: `netguard: "10.0.0.0/33" is not a CIDR such as 10.0.0.0/8 or fd00::/8`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseCIDRs(tt.in)
			if errString(err) != tt.wantErr {
				t.Errorf("error = %q, want %q", errString(err), tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("prefixes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestClientRefusesDeniedAddresses(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	tests := []struct {
		name        string
		deny, allow []netip.Prefix
		wantErr     string // a suffix; empty means the request succeeds
	}{
		{name: "not denied", deny: prefixes("127.0.0.3/32")},
		{name: "denied", deny: prefixes("127.0.0.2/32"), wantErr: "refused: 127.0.0.2/32 is denied (deny list)"},
		{name: "denied by a wider prefix", deny: prefixes("127.0.0.0/8"), wantErr: "refused: 127.0.0.0/8 is denied (deny list)"},
		{name: "allow overrides the deny list", deny: prefixes("127.0.0.0/8"), allow: prefixes("127.0.0.2/32")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, accepted := netguardtest.Serve(t, "127.0.0.2:0", ok)
			resp, err := Config{Deny: tt.deny, Allow: tt.allow}.Client().Get(url)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Get: %v", err)
				}
				_ = resp.Body.Close()
				if n := accepted.Load(); n != 1 {
					t.Errorf("server accepted %d connections, want 1", n)
				}
				return
			}
			if err == nil {
				_ = resp.Body.Close()
				t.Fatal("Get succeeded, want a refusal")
			}
			var denied *DeniedError
			if !errors.As(err, &denied) || !strings.HasSuffix(err.Error(), tt.wantErr) {
				t.Errorf("error = %v, want a *DeniedError ending %q", err, tt.wantErr)
			}
			if n := accepted.Load(); n != 0 {
				t.Errorf("server accepted %d connections, want none", n)
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

package netguard

import (
	"context"
	"fmt"
	"net/netip"
	"syscall"
)

// linkLocal is denied by default: it holds the cloud metadata endpoint 169.254.169.254, which
// hands out node credentials. AWS's IPv6 endpoint fd00:ec2::254 is not link-local: add it to Deny
// where it applies.
var linkLocal = []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("fe80::/10")}

// DeniedError is a connection the guard refused before it was made.
type DeniedError struct {
	// Addr is the resolved address the dial was for.
	Addr netip.AddrPort
	// Rule is the deny prefix that matched it.
	Rule netip.Prefix
	// Reason says which list the rule comes from: "link-local" or "deny list".
	Reason string
}

func (e *DeniedError) Error() string {
	return fmt.Sprintf("netguard: connection to %s refused: %s is denied (%s)", e.Addr, e.Rule, e.Reason)
}

type rule struct {
	prefix netip.Prefix
	reason string
}

// guard decides, per resolved address, whether a connection may be made.
type guard struct {
	deny  []rule
	allow []netip.Prefix
}

func newGuard(deny, allow []netip.Prefix) guard {
	g := guard{}
	for _, p := range linkLocal {
		g.deny = append(g.deny, rule{prefix: p, reason: "link-local"})
	}
	for _, p := range deny {
		g.deny = append(g.deny, rule{prefix: normalize(p), reason: "deny list"})
	}
	for _, p := range allow {
		g.allow = append(g.allow, normalize(p))
	}
	return g
}

// check returns a *DeniedError when addr may not be reached. The address is unmapped and its
// zone dropped first: ::ffff:169.254.169.254 is 169.254.169.254 on the wire, and a prefix never
// contains an address that carries a zone (fe80::1%eth0).
func (g guard) check(addr netip.AddrPort) error {
	ip := addr.Addr().Unmap().WithZone("")
	for _, p := range g.allow {
		if p.Contains(ip) {
			return nil
		}
	}
	for _, r := range g.deny {
		if r.prefix.Contains(ip) {
			return &DeniedError{Addr: addr, Rule: r.prefix, Reason: r.reason}
		}
	}
	return nil
}

// control is the net.Dialer hook: it runs after name resolution, once per address tried, and
// before the connect system call.
func (g guard) control(_ context.Context, network, address string, _ syscall.RawConn) error {
	addr, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("netguard: cannot check %s address %q: %w", network, address, err)
	}
	return g.check(addr)
}

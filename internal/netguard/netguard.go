// Package netguard bounds the manager's outbound HTTP: which addresses a connection may reach,
// where a redirect may lead, and how much of a response body may be read. Every request a run
// causes (model, HTTP tool, MCP server) goes to an endpoint the run's author chose, through a
// process every namespace shares, so the endpoint is untrusted.
//
// The address check runs at dial time on the resolved IP, so DNS names, rebinding and redirects
// cannot route around it. With HTTP(S)_PROXY set the manager dials the proxy, and the check
// applies to the proxy's address: the proxy must then enforce its own policy.
package netguard

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// DefaultMaxResponseBytes bounds one response body when Config names no bound. It matches the
// largest model response the loop accepts.
const DefaultMaxResponseBytes int64 = 16 << 20

// MaxResponseHeaderBytes bounds the response headers of one request.
const MaxResponseHeaderBytes = 1 << 20

// DefaultMaxIdleConns is how many idle connections a client keeps when Config names no number,
// and the most the manager keeps: a connection per step in flight up to it, so that a wave of
// steps does not dial anew, and no more, since an idle connection's buffers are memory no step's
// budget counts.
const DefaultMaxIdleConns = 256

// Config says what the manager's HTTP client may reach and read.
type Config struct {
	// Deny extends the default deny list (link-local: 169.254.0.0/16 and fe80::/10).
	Deny []netip.Prefix
	// Allow wins over every deny rule, the default ones included.
	Allow []netip.Prefix
	// MaxResponseBytes bounds every response body; zero or less means DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// MaxIdleConns is how many idle connections are kept, in total and to one host (every
	// namespace's runs may share one model endpoint): the steps that may be in flight at once.
	// Zero or less means DefaultMaxIdleConns.
	MaxIdleConns int
}

// Client returns an HTTP client whose connections are checked against c, whose redirects stay
// within the origin (CheckRedirect) and whose response bodies stop at c.MaxResponseBytes. It sets
// no client-wide timeout: callers bound each request with its context.
func (c Config) Client() *http.Client {
	return &http.Client{Transport: c.Transport(), CheckRedirect: CheckRedirect}
}

// Transport returns the RoundTripper behind Client: http.DefaultTransport's settings with the
// guarded dialer and the response bounds.
func (c Config) Transport() http.RoundTripper {
	g := newGuard(c.Deny, c.Allow)
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, ControlContext: g.control}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = dialer.DialContext
	t.MaxResponseHeaderBytes = MaxResponseHeaderBytes
	// Many runs share a few endpoints (one model provider): keep a connection per request in
	// flight to it rather than http.DefaultTransport's 2, so a wave of steps does not dial (and
	// handshake TLS) anew every turn.
	idle := c.MaxIdleConns
	if idle <= 0 {
		idle = DefaultMaxIdleConns
	}
	t.MaxIdleConns, t.MaxIdleConnsPerHost = idle, idle
	limit := c.MaxResponseBytes
	if limit <= 0 {
		limit = DefaultMaxResponseBytes
	}
	return &limitTransport{base: t, limit: limit}
}

// ParseCIDRs parses a comma-separated list of CIDRs, as given to a flag. A bare address is its
// own /32 or /128, and an IPv4-mapped IPv6 prefix becomes the IPv4 prefix it maps.
func ParseCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for field := range strings.SplitSeq(s, ",") {
		field = strings.TrimSpace(field)
		if field == "" {
			continue
		}
		p, err := netip.ParsePrefix(field)
		if err != nil {
			addr, addrErr := netip.ParseAddr(field)
			if addrErr != nil || addr.Zone() != "" {
				return nil, fmt.Errorf("netguard: %q is not a CIDR such as 10.0.0.0/8 or fd00::/8", field)
			}
			p = netip.PrefixFrom(addr, addr.BitLen())
		}
		out = append(out, normalize(p))
	}
	return out, nil
}

// normalize masks p and turns an IPv4-mapped IPv6 prefix (::ffff:a.b.c.d/n, n >= 96) into its
// IPv4 form, because addresses are unmapped before they are checked.
func normalize(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

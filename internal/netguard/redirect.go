package netguard

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// MaxRedirects is how many redirects one request may follow.
const MaxRedirects = 10

// RedirectError is a redirect the client refused to follow.
type RedirectError struct {
	// From and To are origins (scheme://host:port), never whole URLs.
	From, To string
	// TooMany is set when the request already followed MaxRedirects redirects.
	TooMany bool
}

func (e *RedirectError) Error() string {
	if e.TooMany {
		return fmt.Sprintf("netguard: redirect from %s to %s refused: more than %d redirects", e.From, e.To, MaxRedirects)
	}
	return fmt.Sprintf("netguard: redirect from %s to %s refused: a redirect may not leave the origin", e.From, e.To)
}

// CheckRedirect is an http.Client CheckRedirect that follows at most MaxRedirects redirects, all
// within the origin of the first request. net/http copies the first request's headers onto every
// redirect, so a redirect to another origin would hand it the configured headers and keys.
func CheckRedirect(req *http.Request, via []*http.Request) error {
	from, to := Origin(via[0].URL), Origin(req.URL)
	if from != to {
		return &RedirectError{From: from, To: to}
	}
	if len(via) > MaxRedirects {
		return &RedirectError{From: Origin(via[len(via)-1].URL), To: to, TooMany: true}
	}
	return nil
}

// Origin is scheme://host:port with the default port filled in and the host in lower case, so
// that http://Example.com and http://example.com:80 are one origin.
func Origin(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

package main

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"strconv"
)

// maxInboxBody bounds what the inbox reads of a request body (an answer form).
const maxInboxBody = 64 << 10

// loopbackAddress checks that address (host:port) names a loopback interface and returns it with
// "localhost" replaced by 127.0.0.1, so the inbox never listens where another machine reaches it.
func loopbackAddress(address string) (string, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return "", fmt.Errorf("--address %q: want host:port, e.g. 127.0.0.1:0: %v", address, err)
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return "", fmt.Errorf("--address %q: the inbox listens on a loopback address only (127.0.0.1 or [::1]), since it acts with your identity", address)
	}
	return net.JoinHostPort(host, port), nil
}

// newToken returns a random 256-bit token, URL-safe.
func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// guard admits only the person who holds the printed URL, through a browser pointed at the
// address the inbox is bound to:
//   - Host must be that address: a page of another site whose name resolves to 127.0.0.1 (DNS
//     rebinding) sends its own name and is refused;
//   - every request carries the token, in the URL's query the first time (it is then moved into an
//     HttpOnly, SameSite=Strict cookie and taken out of the address bar) or in the cookie;
//   - a request that changes something (any method but GET and HEAD) must also come with an
//     Origin of the inbox itself, so another web site cannot make the browser submit a form (CSRF).
//
// Every response forbids framing, caching, a Referer to other sites, and scripts or styles from
// anywhere but the inbox.
type guard struct {
	host  string // the bound address, host:port, as the browser sends it in Host
	token string
	next  http.Handler
}

// cookieName is per port: cookies are not separated by port, and two inboxes may run at once.
func (g *guard) cookieName() string {
	_, port, _ := net.SplitHostPort(g.host)
	return "toolnexus_inbox_" + port
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: under no-referrer a browser sends "Origin: null" with the
	// inbox's own forms, and the Origin check could not tell them from another site's.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	if r.Host != g.host {
		http.Error(w, "wrong Host: the inbox answers only at http://"+g.host, http.StatusMisdirectedRequest)
		return
	}
	if q := r.URL.Query().Get("token"); q != "" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		if !g.valid(q) {
			http.Error(w, "wrong token: open the URL kubectl toolnexus inbox printed", http.StatusForbidden)
			return
		}
		http.SetCookie(w, &http.Cookie{Name: g.cookieName(), Value: q, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		u := *r.URL
		query := u.Query()
		query.Del("token")
		u.RawQuery = query.Encode()
		http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
		return
	}
	c, err := r.Cookie(g.cookieName())
	if err != nil || !g.valid(c.Value) {
		http.Error(w, "no token: open the URL kubectl toolnexus inbox printed", http.StatusForbidden)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if r.Header.Get("Origin") != "http://"+g.host {
			http.Error(w, "wrong Origin: answers are taken only from the inbox's own pages", http.StatusForbidden)
			return
		}
		if r.ContentLength > maxInboxBody {
			http.Error(w, "request body over "+strconv.Itoa(maxInboxBody)+" bytes", http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxInboxBody)
	}
	g.next.ServeHTTP(w, r)
}

func (g *guard) valid(token string) bool {
	return subtle.ConstantTimeCompare([]byte(token), []byte(g.token)) == 1
}

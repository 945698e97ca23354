// Package netguardtest has the loopback servers that tests of the network guard, and of the
// clients built on it, share. Everything listens on 127.0.0.0/8.
package netguardtest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// Serve serves h on addr, a loopback address such as "127.0.0.2:0", and counts the connections
// the server accepts: a refused dial leaves the count at zero.
func Serve(t testing.TB, addr string, h http.Handler) (url string, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	counting := &countingListener{Listener: ln}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = counting
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, &counting.accepted
}

type countingListener struct {
	net.Listener
	accepted atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// Redirects is a server that redirects, and another origin to redirect to.
type Redirects struct {
	// Origin serves, on 127.0.0.1:
	//   /cross     307 to Other + "/steal"
	//   /same      307 to /final
	//   /final     the request headers, as the server received them
	//   /chain/n   302 to /chain/n-1, and at /chain/0 "end of the chain"
	Origin string
	// Other is a server on 127.0.0.1 named by the host name localhost: the same address, another
	// origin. It answers with the request headers.
	Other string
	// OtherRequests counts the requests Other received.
	OtherRequests *atomic.Int32
}

// NewRedirects starts both servers.
func NewRedirects(t testing.TB) *Redirects {
	t.Helper()
	r := &Redirects{OtherRequests: &atomic.Int32{}}
	echo := func(w http.ResponseWriter, req *http.Request) { _ = req.Header.Write(w) }
	other, _ := Serve(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.OtherRequests.Add(1)
		echo(w, req)
	}))
	r.Other = strings.Replace(other, "127.0.0.1", "localhost", 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/cross", func(w http.ResponseWriter, req *http.Request) {
		http.Redirect(w, req, r.Other+"/steal", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/same", func(w http.ResponseWriter, req *http.Request) {
		http.Redirect(w, req, "/final", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/final", echo)
	mux.HandleFunc("/chain/{n}", func(w http.ResponseWriter, req *http.Request) {
		var n int
		_, _ = fmt.Sscan(req.PathValue("n"), &n)
		if n <= 0 {
			_, _ = io.WriteString(w, "end of the chain")
			return
		}
		http.Redirect(w, req, fmt.Sprintf("/chain/%d", n-1), http.StatusFound)
	})
	r.Origin, _ = Serve(t, "127.0.0.1:0", mux)
	return r
}

package audit

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/toolnexus/operator/internal/notify"
)

// Sink is where the manager sends the audit trail (--audit-sink-url).
type Sink struct {
	url     string
	client  *http.Client
	timeout time.Duration
}

// NewSink checks rawURL and returns the sink it names, reached with client, each attempt bounded
// by timeout. The error never quotes the URL: it may carry a credential.
func NewSink(rawURL string, client *http.Client, timeout time.Duration) (*Sink, error) {
	u, err := url.Parse(rawURL)
	switch {
	case err != nil:
		return nil, errors.New("--audit-sink-url is not a valid URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, errors.New("--audit-sink-url must start with http:// or https://")
	case u.Host == "":
		return nil, errors.New("--audit-sink-url must name a host, as in https://audit.example.com/events")
	case client == nil || timeout <= 0:
		return nil, errors.New("an audit sink needs an HTTP client and an attempt timeout")
	}
	return &Sink{url: rawURL, client: client, timeout: timeout}, nil
}

// Send delivers e with one POST. What the sink answers is read only up to notify.Post's small
// drain bound; whether to try again is the Result's.
func (s *Sink) Send(ctx context.Context, e Event) notify.Result {
	body, err := CloudEvent(e)
	if err != nil {
		return notify.Result{Err: err}
	}
	return notify.Post(ctx, s.client, s.url, nil, notify.CloudEventsContentType, body, s.timeout)
}

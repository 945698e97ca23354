package a2a

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/toolnexus/operator/internal/clip"
)

// DefaultMaxResponseBytes bounds one response, or one event of a stream, a Client reads.
const DefaultMaxResponseBytes = 4 << 20

// Client speaks the JSON-RPC binding to one agent endpoint (an AgentInterface URL).
type Client struct {
	// URL is the agent's JSON-RPC endpoint.
	URL string
	// HTTPClient carries the requests; nil is http.DefaultClient.
	HTTPClient *http.Client
	// Header is sent with every request (Authorization, for one).
	Header http.Header
	// MaxResponseBytes bounds a response or a stream event; 0 is DefaultMaxResponseBytes.
	MaxResponseBytes int64

	next atomic.Int64
}

// HTTPError is a response that is not a JSON-RPC answer: the endpoint refused the request at the
// HTTP level (401 without a token, for one).
type HTTPError struct {
	StatusCode int
	// Body is the start of the response body.
	Body string
}

func (e *HTTPError) Error() string {
	if e.Body == "" {
		return fmt.Sprintf("HTTP %d", e.StatusCode)
	}
	return fmt.Sprintf("HTTP %d: %s", e.StatusCode, e.Body)
}

// SendMessage sends a message, starting a task or continuing the one it names.
func (c *Client) SendMessage(ctx context.Context, req SendMessageRequest) (*SendMessageResponse, error) {
	var out SendMessageResponse
	if err := c.Call(ctx, MethodSendMessage, req, &out); err != nil {
		return nil, err
	}
	if out.Task == nil && out.Message == nil {
		return nil, Errorf(CodeInvalidAgentResponse, "", "SendMessage answered neither a task nor a message")
	}
	return &out, nil
}

// GetTask reads the task id.
func (c *Client) GetTask(ctx context.Context, id string) (*Task, error) {
	var out Task
	if err := c.Call(ctx, MethodGetTask, GetTaskRequest{ID: id}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CancelTask asks the agent to stop the task id.
func (c *Client) CancelTask(ctx context.Context, id string) (*Task, error) {
	var out Task
	if err := c.Call(ctx, MethodCancelTask, CancelTaskRequest{ID: id}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListTasks lists the caller's tasks.
func (c *Client) ListTasks(ctx context.Context, req ListTasksRequest) (*ListTasksResponse, error) {
	var out ListTasksResponse
	if err := c.Call(ctx, MethodListTasks, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Card reads the agent card served under the endpoint (URL + WellKnownCardPath).
func (c *Client) Card(ctx context.Context) (*AgentCard, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(c.URL, "/")+"/"+WellKnownCardPath, nil)
	if err != nil {
		return nil, err
	}
	c.headers(req)
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := c.read(resp)
	if err != nil {
		return nil, err
	}
	var card AgentCard
	if err := json.Unmarshal(body, &card); err != nil {
		return nil, fmt.Errorf("the agent card is not JSON: %w", err)
	}
	return &card, nil
}

// Call sends one JSON-RPC request and decodes its result into result. An error the agent answered
// is an *Error; one the HTTP layer answered an *HTTPError.
func (c *Client) Call(ctx context.Context, method string, params, result any) error {
	resp, err := c.post(ctx, method, params, "application/json")
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := c.read(resp)
	if err != nil {
		return err
	}
	return decodeResponse(body, result)
}

// Stream sends a streaming request (SendStreamingMessage, SubscribeToTask) and calls each for
// every event until the agent closes the stream, each returns an error, or ctx ends. An error
// event ends the stream with that *Error.
func (c *Client) Stream(ctx context.Context, method string, params any, each func(StreamResponse) error) error {
	resp, err := c.post(ctx, method, params, "text/event-stream")
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		_, err := c.read(resp)
		return err
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		// An agent may answer a streaming request that fails at once with a plain response.
		body, err := c.read(resp)
		if err != nil {
			return err
		}
		var ev StreamResponse
		if err := decodeResponse(body, &ev); err != nil {
			return err
		}
		return each(ev)
	}
	return readEvents(resp.Body, c.maxBytes(), func(data []byte) error {
		var ev StreamResponse
		if err := decodeResponse(data, &ev); err != nil {
			return err
		}
		return each(ev)
	})
}

// readEvents calls each with the data of every Server-Sent Event of r (its data lines joined).
func readEvents(r io.Reader, limit int64, each func([]byte) error) error {
	scanner := bufio.NewScanner(r)
	scanner.Buffer(make([]byte, 0, 64<<10), int(limit))
	var data bytes.Buffer
	for scanner.Scan() {
		line := scanner.Text()
		switch {
		case line == "":
			if data.Len() == 0 {
				continue
			}
			if err := each(data.Bytes()); err != nil {
				return err
			}
			data.Reset()
		case strings.HasPrefix(line, "data:"):
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
			if int64(data.Len()) > limit {
				return fmt.Errorf("a stream event exceeds %d bytes", limit)
			}
		}
		// Comments (": keep-alive"), event names and ids carry nothing this binding uses.
	}
	if err := scanner.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("a stream line exceeds %d bytes", limit)
		}
		return err
	}
	if data.Len() > 0 {
		return each(data.Bytes())
	}
	return nil
}

func (c *Client) post(ctx context.Context, method string, params any, accept string) (*http.Response, error) {
	raw, err := json.Marshal(params)
	if err != nil {
		return nil, err
	}
	id := strconv.FormatInt(c.next.Add(1), 10)
	body, err := json.Marshal(Request{JSONRPC: "2.0", ID: json.RawMessage(id), Method: method, Params: raw})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	c.headers(req)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", accept)
	return c.httpClient().Do(req)
}

func (c *Client) headers(req *http.Request) {
	for k, vs := range c.Header {
		req.Header[k] = vs
	}
	req.Header.Set(VersionHeader, ProtocolVersion)
}

// read reads a bounded body; a status other than 200 is an *HTTPError.
func (c *Client) read(resp *http.Response) ([]byte, error) {
	limit := c.maxBytes()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &HTTPError{StatusCode: resp.StatusCode, Body: strings.TrimSpace(clip.Bytes(string(body), 512))}
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("the response exceeds %d bytes", limit)
	}
	return body, nil
}

func (c *Client) maxBytes() int64 {
	if c.MaxResponseBytes > 0 {
		return c.MaxResponseBytes
	}
	return DefaultMaxResponseBytes
}

func (c *Client) httpClient() *http.Client {
	if c.HTTPClient != nil {
		return c.HTTPClient
	}
	return http.DefaultClient
}

// decodeResponse decodes a JSON-RPC response's result into result, or returns its error.
func decodeResponse(body []byte, result any) error {
	var resp Response
	if err := json.Unmarshal(body, &resp); err != nil {
		return fmt.Errorf("the answer is not a JSON-RPC response: %w", err)
	}
	if resp.Error != nil {
		return resp.Error
	}
	if len(resp.Result) == 0 {
		return errors.New("the JSON-RPC response has neither a result nor an error")
	}
	if err := json.Unmarshal(resp.Result, result); err != nil {
		return fmt.Errorf("the result is not what the method returns: %w", err)
	}
	return nil
}

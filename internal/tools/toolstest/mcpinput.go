package toolstest

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// InputServer is an MCP server built with the Go SDK whose tools ask for input in rounds: a
// tools/call is answered with input requests and a requestState (resultType input_required, to a
// client of revision 2026-07-28; the SDK itself asks a 2025-11-25 client with elicitation/create
// instead), and the call made again with the answers and that requestState gets the result. The
// requestState is signed with a key of the server's: one changed on the way, or issued before
// RotateKey, is refused with a JSON-RPC error, as a server that must not trust its clients does.
//
// Its tools:
//   - provision: asks at once for a region (a form) and a consent (a URL), and answers
//     "provisioned in <region> (consent: <action>)";
//   - grant: asks for a consent (a URL) alone, and answers "granted (<action>)";
//   - again: asks for the region, and after the answer asks for it again, forever;
//   - wizard: asks for a name, then for a color, then answers "<name> likes <color>";
//   - shed: answers input_required without any input request (a server shedding load);
//   - bulky: asks for the region with a requestState of BulkyStateBytes.
type InputServer struct {
	URL string

	mu     sync.Mutex
	key    []byte
	calls  map[string]int
	issued []string
	echoed []string
}

// BulkyStateBytes is the size of the bulky tool's requestState: past what a run's record holds.
const BulkyStateBytes = 70 << 10

// RegionSchema is the form the provision, again and bulky tools ask with.
var RegionSchema = map[string]any{
	"type":       "object",
	"properties": map[string]any{"region": map[string]any{"type": "string", "enum": []any{"eu", "us"}}},
	"required":   []any{"region"},
}

// ConsentURL is where the provision and grant tools send a person to consent.
const ConsentURL = "https://consent.example.com/grant?state=1"

// inputState is what a requestState carries.
type inputState struct {
	Tool  string `json:"tool"`
	Round int    `json:"round"`
	Name  string `json:"name,omitempty"`
	Pad   string `json:"pad,omitempty"`
}

// ServeInputs starts an input server speaking the given revisions (the SDK's default, 2026-07-28
// first, when none are given); it closes when the test ends.
func ServeInputs(t interface{ Cleanup(func()) }, versions ...string) *InputServer {
	s := &InputServer{calls: map[string]int{}}
	s.RotateKey()
	server := mcp.NewServer(&mcp.Implementation{Name: "inputs", Version: "v0"}, &mcp.ServerOptions{SupportedProtocolVersions: versions})
	object := map[string]any{"type": "object"}
	region := &mcp.ElicitParams{Mode: "form", Message: "Which region?", RequestedSchema: RegionSchema}
	consent := &mcp.ElicitParams{Mode: "url", Message: "Grant access to the project", URL: ConsentURL, ElicitationID: "el-consent"}
	nameForm := &mcp.ElicitParams{Mode: "form", Message: "Your name?", RequestedSchema: map[string]any{"type": "object",
		"properties": map[string]any{"name": map[string]any{"type": "string"}}, "required": []any{"name"}}}
	colorForm := &mcp.ElicitParams{Mode: "form", Message: "Your favourite color?", RequestedSchema: map[string]any{"type": "object",
		"properties": map[string]any{"color": map[string]any{"type": "string"}}, "required": []any{"color"}}}
	tools := map[string]func(st *inputState, responses map[string]*mcp.ElicitResult) *mcp.CallToolResult{
		"provision": func(st *inputState, r map[string]*mcp.ElicitResult) *mcp.CallToolResult {
			if st == nil {
				return s.ask("provision", 1, "", "", map[string]*mcp.ElicitParams{"region": region, "consent": consent})
			}
			return text(fmt.Sprintf("provisioned in %s (consent: %s)", field(r["region"], "region"), action(r["consent"])))
		},
		"grant": func(st *inputState, r map[string]*mcp.ElicitResult) *mcp.CallToolResult {
			if st == nil {
				return s.ask("grant", 1, "", "", map[string]*mcp.ElicitParams{"consent": consent})
			}
			return text(fmt.Sprintf("granted (%s)", action(r["consent"])))
		},
		"again": func(st *inputState, _ map[string]*mcp.ElicitResult) *mcp.CallToolResult {
			round := 1
			if st != nil {
				round = st.Round + 1
			}
			return s.ask("again", round, "", "", map[string]*mcp.ElicitParams{"region": region})
		},
		"wizard": func(st *inputState, r map[string]*mcp.ElicitResult) *mcp.CallToolResult {
			switch {
			case st == nil:
				return s.ask("wizard", 1, "", "", map[string]*mcp.ElicitParams{"name": nameForm})
			case st.Round == 1:
				return s.ask("wizard", 2, field(r["name"], "name"), "", map[string]*mcp.ElicitParams{"color": colorForm})
			}
			return text(fmt.Sprintf("%s likes %s", st.Name, field(r["color"], "color")))
		},
		"shed": func(*inputState, map[string]*mcp.ElicitResult) *mcp.CallToolResult {
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{}}
		},
		"bulky": func(st *inputState, r map[string]*mcp.ElicitResult) *mcp.CallToolResult {
			if st == nil {
				return s.ask("bulky", 1, "", strings.Repeat("x", BulkyStateBytes), map[string]*mcp.ElicitParams{"region": region})
			}
			return text("bulky in " + field(r["region"], "region"))
		},
	}
	for name, tool := range tools {
		server.AddTool(&mcp.Tool{Name: name, Description: "asks for input", InputSchema: object},
			func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				s.mu.Lock()
				s.calls[name]++
				s.mu.Unlock()
				if req.Params.RequestState == "" {
					return tool(nil, nil), nil
				}
				st, err := s.verify(req.Params.RequestState, name)
				if err != nil {
					return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "requestState refused: " + err.Error()}
				}
				responses := map[string]*mcp.ElicitResult{}
				for k, v := range req.Params.InputResponses {
					if r, ok := v.(*mcp.ElicitResult); ok {
						responses[k] = r
					}
				}
				return tool(st, responses), nil
			})
	}
	// Stateless serves 2026-07-28 (server/discover); only a stateful handler can elicit within a
	// call, which a 2025-11-25 client needs.
	stateless := len(versions) == 0 || slices.Contains(versions, "2026-07-28")
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: stateless}))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// ask is an input_required result with a signed requestState.
func (s *InputServer) ask(tool string, round int, name, pad string, requests map[string]*mcp.ElicitParams) *mcp.CallToolResult {
	raw, _ := json.Marshal(inputState{Tool: tool, Round: round, Name: name, Pad: pad})
	s.mu.Lock()
	defer s.mu.Unlock()
	body := base64.RawURLEncoding.EncodeToString(raw)
	state := body + "." + s.sign(body)
	s.issued = append(s.issued, state)
	ir := mcp.InputRequestMap{}
	for k, p := range requests {
		ir[k] = p
	}
	return &mcp.CallToolResult{InputRequests: ir, RequestState: state}
}

func (s *InputServer) sign(body string) string {
	mac := hmac.New(sha256.New, s.key)
	mac.Write([]byte(body))
	return hex.EncodeToString(mac.Sum(nil))
}

// verify checks a requestState the client echoed and reads it.
func (s *InputServer) verify(state, tool string) (*inputState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.echoed = append(s.echoed, state)
	body, sig, ok := strings.Cut(state, ".")
	if !ok || !hmac.Equal([]byte(sig), []byte(s.sign(body))) {
		return nil, fmt.Errorf("it was tampered with or has expired")
	}
	raw, err := base64.RawURLEncoding.DecodeString(body)
	var st inputState
	if err != nil || json.Unmarshal(raw, &st) != nil || st.Tool != tool {
		return nil, fmt.Errorf("it is not one of tool %s", tool)
	}
	return &st, nil
}

// RotateKey changes the signing key: every requestState issued before is refused from now on.
func (s *InputServer) RotateKey() {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	s.mu.Lock()
	s.key = key
	s.mu.Unlock()
}

// Calls is how many tools/call reached the tool, first calls and retries alike.
func (s *InputServer) Calls(tool string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[tool]
}

// Issued lists the requestStates the server gave out, in order.
func (s *InputServer) Issued() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.issued...)
}

// Echoed lists the requestStates clients sent back, in order.
func (s *InputServer) Echoed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.echoed...)
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

// field is a form's answer to name, or the action when it was not accepted.
func field(r *mcp.ElicitResult, name string) string {
	if r == nil {
		return "(no answer)"
	}
	if r.Action != "accept" {
		return "(" + r.Action + ")"
	}
	return fmt.Sprint(r.Content[name])
}

func action(r *mcp.ElicitResult) string {
	if r == nil {
		return "(no answer)"
	}
	return r.Action
}

package gateway

import (
	"fmt"
	"net/http"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/a2a"
	"github.com/toolnexus/operator/internal/clip"
)

// DescriptionAnnotation on an Agent is the description its card gives (at most 2048 bytes are
// shown); without it the card says which agent it is.
const DescriptionAnnotation = "toolnexus.dev/a2a-description"

// bearerScheme names the card's only security scheme.
const bearerScheme = "kubernetes"

// serveCard answers with the card of the agent the path names. The card too is for authenticated
// callers only, and only for an Agent they may read: an unauthenticated caller learns nothing,
// not even which agents exist.
func (g *Gateway) serveCard(w http.ResponseWriter, r *http.Request) {
	ep, ok := g.open(w, r)
	if !ok {
		return
	}
	agent := &toolnexusv1alpha1.Agent{}
	if err := ep.caller.client.Get(r.Context(), types.NamespacedName{Namespace: ep.namespace, Name: ep.agent}, agent); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("there is no Agent %s/%s that you may read", ep.namespace, ep.agent)})
			return
		}
		ep.log.Error(err, "Cannot read the Agent for its card")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "the Agent cannot be read now"})
		return
	}
	writeJSON(w, http.StatusOK, g.card(agent))
}

// card is the agent card of agent.
func (g *Gateway) card(agent *toolnexusv1alpha1.Agent) a2a.AgentCard {
	description := clip.Marked(agent.Annotations[DescriptionAnnotation], 2048)
	if description == "" {
		description = fmt.Sprintf("The toolnexus Agent %s/%s: a message starts a run of it; a task waiting on a person is input-required "+
			"(auth-required for a login) until a follow-up message answers it.", agent.Namespace, agent.Name)
	}
	return a2a.AgentCard{
		Name:        agent.Namespace + "/" + agent.Name,
		Description: description,
		SupportedInterfaces: []a2a.AgentInterface{{URL: g.Endpoint(agent.Namespace, agent.Name),
			ProtocolBinding: a2a.ProtocolBindingJSONRPC, ProtocolVersion: a2a.ProtocolVersion}},
		Provider: &a2a.AgentProvider{Organization: "toolnexus", URL: g.opts.PublicURL},
		Version:  strconv.FormatInt(agent.Generation, 10),
		Capabilities: a2a.AgentCapabilities{Streaming: ptr.To(true), PushNotifications: ptr.To(false),
			ExtendedAgentCard: ptr.To(false)},
		SecuritySchemes: map[string]a2a.SecurityScheme{bearerScheme: {HTTPAuthSecurityScheme: &a2a.HTTPAuthSecurityScheme{
			Scheme: "Bearer", Description: "A Kubernetes bearer token of a user (not a ServiceAccount): the gateway reviews it and acts as that user"}}},
		SecurityRequirements: []a2a.SecurityRequirement{{Schemes: map[string]a2a.StringList{bearerScheme: {List: []string{}}}}},
		DefaultInputModes:    []string{"text/plain", "application/json"},
		DefaultOutputModes:   []string{"text/plain"},
		Skills: []a2a.AgentSkill{{ID: "run", Name: agent.Name, Description: description, Tags: []string{"toolnexus"},
			InputModes: []string{"text/plain", "application/json"}, OutputModes: []string{"text/plain"}}},
	}
}

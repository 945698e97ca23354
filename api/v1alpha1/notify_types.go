package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// NotifyFormat is the wire format of a notification sink.
// +kubebuilder:validation:Enum=cloudevents;slack
type NotifyFormat string

const (
	// NotifyFormatCloudEvents posts a CloudEvents 1.0 event in structured mode
	// (Content-Type: application/cloudevents+json).
	NotifyFormatCloudEvents NotifyFormat = "cloudevents"
	// NotifyFormatSlack posts a Slack incoming-webhook message (text and Block Kit blocks).
	NotifyFormatSlack NotifyFormat = "slack"
)

// NotifyEvent is a moment in a PendingRequest's life that a sink can be told about.
// +kubebuilder:validation:Enum=Opened;Answered;Expired;Escalated
type NotifyEvent string

const (
	// NotifyOpened: the request was created and waits for an answer.
	NotifyOpened NotifyEvent = "Opened"
	// NotifyAnswered: a person or automation answered the request.
	NotifyAnswered NotifyEvent = "Answered"
	// NotifyExpired: the request expired unanswered (spec.suspension.timeout).
	NotifyExpired NotifyEvent = "Expired"
	// NotifyEscalated: an escalation step of the request's policy applied; only the step's own
	// sinks are told.
	NotifyEscalated NotifyEvent = "Escalated"
)

// NotifySink is one receiver of the notifications of a run's PendingRequests.
// +kubebuilder:validation:XValidation:rule="has(self.url) != has(self.urlFrom)",message="a notify sink needs exactly one of url or urlFrom (a Secret key holding the URL, e.g. a Slack webhook)"
type NotifySink struct {
	// name of the sink, shown in the request's Notified condition and in logs instead of its URL.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// format of the message: cloudevents (the default) or slack.
	// +optional
	// +kubebuilder:default=cloudevents
	Format NotifyFormat `json:"format,omitempty"`

	// url the message is posted to. Use urlFrom when the URL itself is a credential (a Slack
	// webhook URL is).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('http://') || self.startsWith('https://')",message="notify[].url must start with http:// or https://"
	URL string `json:"url,omitempty"`

	// urlFrom reads the URL from a Secret in the run's namespace when a message is sent (for an
	// ApprovalPolicy's sink, in the manager's namespace). It is never logged or shown.
	// +optional
	URLFrom *SecretValueSource `json:"urlFrom,omitempty"`

	// headers sent with every message, as for HTTP tools.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Headers []HTTPHeader `json:"headers,omitempty"`

	// on lists the events the sink is told about; default all three.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:default={Opened,Answered,Expired}
	On []NotifyEvent `json:"on,omitempty"`
}

// NotificationOutcome is how the delivery of one event to one sink ended.
// +kubebuilder:validation:Enum=Delivered;Failed
type NotificationOutcome string

const (
	// NotificationDelivered: the sink answered 2xx.
	NotificationDelivered NotificationOutcome = "Delivered"
	// NotificationFailed: the manager gave up (a 4xx other than 408/429, a missing Secret, or
	// every retry failed).
	NotificationFailed NotificationOutcome = "Failed"
)

// NotificationRecord is the manager's record of one finished delivery: an event it no longer
// has to send to a sink. Only the manager writes it (config/policies).
type NotificationRecord struct {
	// sink is the name of the sink in spec.notify.
	// +required
	// +kubebuilder:validation:MaxLength=63
	Sink string `json:"sink"`

	// event that was sent.
	// +required
	Event NotifyEvent `json:"event"`

	// outcome is Delivered or Failed.
	// +required
	Outcome NotificationOutcome `json:"outcome"`

	// attempts made by the manager process that finished the delivery.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Attempts int32 `json:"attempts,omitempty"`

	// reason of a failed delivery, as the Notified condition shows it: NotificationFailed,
	// SecretNotFound or SecretNotAllowed.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason,omitempty"`

	// message says why a delivery failed.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// time the delivery finished.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
}

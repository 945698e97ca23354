package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// AgentRun condition types.
const (
	// ConditionSucceeded is the run's terminal summary: Unknown while the run is active, True when
	// the model gave its final answer, False when the run ended any other way (incomplete, failed,
	// cancelled). `kubectl wait --for=condition=Succeeded` waits for a successful end.
	ConditionSucceeded = "Succeeded"

	// ConditionSuspended is True while at least one PendingRequest of the run is open.
	ConditionSuspended = "Suspended"

	// ConditionReconciling is True while the run is active and absent once it ended: with
	// ConditionStalled it lets kstatus (Argo CD, Flux, `kubectl wait`) read a run as InProgress,
	// Current or Failed.
	ConditionReconciling = "Reconciling"

	// ConditionStalled is True when the run ended without success (failed, incomplete,
	// cancelled), and absent otherwise.
	ConditionStalled = "Stalled"

	// ConditionToolsReady is False when a tool source (an MCP server) could not be reached; its
	// tools are left out and the run goes on without them.
	ConditionToolsReady = "ToolsReady"
)

// Reasons of the AgentRun Succeeded condition.
const (
	// ReasonPending: the run was accepted and has not taken its first step.
	ReasonPending = "Pending"
	// ReasonRunning: the run is taking steps.
	ReasonRunning = "Running"
	// ReasonWaitingForAnswer: the run is parked on one or more PendingRequests.
	ReasonWaitingForAnswer = "WaitingForAnswer"
	// ReasonSecretNotFound: a referenced Secret or key is missing; the run starts when it appears.
	ReasonSecretNotFound = "SecretNotFound"
	// ReasonModelRetrying: the model endpoint failed transiently; the run retries with backoff.
	ReasonModelRetrying = "ModelRetrying"
	// ReasonCompleted: the model gave its final answer.
	ReasonCompleted = "Completed"
	// ReasonMaxTurns: the run used maxTurns model turns without a final answer.
	ReasonMaxTurns = "MaxTurns"
	// ReasonInvalidSpec: the spec passed admission but cannot run (for example a `when`
	// expression that does not compile).
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonModelError: the model endpoint refused the request, or kept failing past retries.
	ReasonModelError = "ModelError"
	// ReasonRequestExpired: a PendingRequest expired and spec.suspension.onTimeout is Fail.
	ReasonRequestExpired = "RequestExpired"
	// ReasonTranscriptTooLarge: the transcript outgrew what the run can store.
	ReasonTranscriptTooLarge = "TranscriptTooLarge"
	// ReasonTranscriptCorrupt: the stored transcript cannot be decoded (edited or damaged by hand).
	ReasonTranscriptCorrupt = "TranscriptCorrupt"
	// ReasonStateMismatch: the run's record and the PendingRequest it would act on disagree (a
	// request this run did not create, or one whose call differs from the record's); the run fails
	// closed and runs nothing.
	ReasonStateMismatch = "StateMismatch"
	// ReasonSecretNotAllowed: a referenced Secret lacks the label the manager requires
	// (--require-secret-label); the run starts when the Secret is labelled.
	ReasonSecretNotAllowed = "SecretNotAllowed"
	// ReasonCancelled: spec.cancel was set.
	ReasonCancelled = "Cancelled"
	// ReasonRequestNameInUse: a PendingRequest of a previous run of the same name is being deleted
	// but kept until its audit events are delivered; the run's request is created once it is gone.
	ReasonRequestNameInUse = "RequestNameInUse"
)

// Reasons of the AgentRun Suspended and ToolsReady conditions.
const (
	// ReasonNoOpenRequests: no PendingRequest of the run is open.
	ReasonNoOpenRequests = "NoOpenRequests"
	// ReasonOpenRequests: at least one PendingRequest of the run is open.
	ReasonOpenRequests = "OpenRequests"
	// ReasonToolsAvailable: every tool source answered.
	ReasonToolsAvailable = "ToolsAvailable"
	// ReasonMCPServerUnavailable: an MCP server could not be reached; its tools are left out.
	ReasonMCPServerUnavailable = "MCPServerUnavailable"
)

// PendingRequest condition types.
const (
	// ConditionAnswered is True once status.answer is set (by a person, an automation, or the
	// controller on expiry or cancellation).
	ConditionAnswered = "Answered"
	// ConditionResolved is True once the run has consumed the answer.
	ConditionResolved = "Resolved"
	// ConditionNotified is True when every sink of spec.notify, and of the escalation steps
	// applied, took every event due so far, Unknown while deliveries are under way, and False
	// once one was given up on.
	ConditionNotified = "Notified"
)

// Reasons of the PendingRequest Notified condition (with ReasonSecretNotFound and
// ReasonSecretNotAllowed when a sink's Secret cannot be read).
const (
	// ReasonNotificationsDelivered: every sink took every event due so far.
	ReasonNotificationsDelivered = "Delivered"
	// ReasonDelivering: a delivery is under way or waits for its next attempt.
	ReasonDelivering = "Delivering"
	// ReasonNotificationFailed: a sink refused an event, or kept failing past the retries.
	ReasonNotificationFailed = "NotificationFailed"
)

// Reasons of the PendingRequest conditions.
const (
	// ReasonAwaitingAnswer: Answered is False, status.answer is not set yet.
	ReasonAwaitingAnswer = "AwaitingAnswer"
	// ReasonApproved: an approval or authorization request was answered ok.
	ReasonApproved = "Approved"
	// ReasonAnswered: an input, question, tool_call or other request was answered ok.
	ReasonAnswered = "Answered"
	// ReasonDeclined: the answer was ok: false.
	ReasonDeclined = "Declined"
	// ReasonExpired: the request expired unanswered (answered by system:expired).
	ReasonExpired = "Expired"
	// ReasonAnswerConsumed: Resolved is True: the call ran with the answer, or the answer settled
	// it (a decline, an expiry).
	ReasonAnswerConsumed = "AnswerConsumed"
	// ReasonAnswerTaken: the run took the answer in, and its call has not run with it yet
	// (Resolved False).
	ReasonAnswerTaken = "AnswerTaken"
	// ReasonGatePassed: the answer approved a gate of the call, which went on to a later gate
	// (Resolved True); the call runs only once its last gate's request is AnswerConsumed.
	ReasonGatePassed = "GatePassed"
	// ReasonAnswerNotConsumed: Resolved is False, the run has not taken an answer in yet.
	ReasonAnswerNotConsumed = "AnswerNotConsumed"
	// ReasonRunGone: the run ended before it took an answer in; the request was cancelled.
	ReasonRunGone = "RunGone"
)

// ExpiredAnswerer is the answeredBy value of an answer the controller writes on expiry.
const ExpiredAnswerer = "system:expired"

// RunLabel is set on every PendingRequest and AgentRunRecord to the name of its AgentRun.
const RunLabel = "toolnexus.dev/run"

// ShardLabel names the shard (the manager started with --shard=NAME) that runs an AgentRun: set
// on a Namespace by an administrator, stamped on its AgentRuns by the API server
// (config/policies, toolnexus-shard-stamp) and copied by the manager onto every PendingRequest
// and AgentRunRecord of the run. Objects without it belong to the manager started without --shard.
const ShardLabel = "toolnexus.dev/shard"

// TraceparentAnnotation, set on an AgentRun to a W3C traceparent
// (00-<trace id>-<span id>-<flags>), makes the run's trace a child of the caller's span (a
// pipeline, a CronJob) when the manager exports traces. A malformed value is ignored.
const TraceparentAnnotation = "toolnexus.dev/traceparent"

// SecretAccessLabel marks a Secret that AgentRuns may read when the manager runs with
// --require-secret-label; its value must be "true".
const SecretAccessLabel = "toolnexus.dev/agentrun-access"

// StatusConditions gives condition helpers the run's conditions to set.
func (r *AgentRun) StatusConditions() *[]metav1.Condition { return &r.Status.Conditions }

// Started reports whether the status says the run has started (its record has been saved).
func (s *AgentRunStatus) Started() bool { return s.TranscriptRef != nil || s.StartTime != nil }

// StatusConditions gives condition helpers the request's conditions to set.
func (p *PendingRequest) StatusConditions() *[]metav1.Condition { return &p.Status.Conditions }

// StatusConditions gives condition helpers the policy's conditions to set.
func (p *ApprovalPolicy) StatusConditions() *[]metav1.Condition { return &p.Status.Conditions }

// QuorumAnswerer is the answeredBy value of the answer the manager writes once a request that
// needs several approvals (spec.required > 1) is decided by its status.approvals.
const QuorumAnswerer = "system:quorum"

// OAuthAnswerer is the answeredBy value of the answer the manager writes when a person completed
// the login an authorization request asks for (SPEC §12): the call is then made again, signed in.
const OAuthAnswerer = "system:oauth"

// AuditFinalizer keeps a PendingRequest until the manager has delivered its audit events
// (--audit-sink-url), so deleting its run cannot lose them.
const AuditFinalizer = "toolnexus.dev/audit"

// ExternalWorkFinalizer keeps an AgentRun whose record waits on external work (an MCP task) until
// the manager has told the work's holder to stop it (tasks/cancel), a few bounded attempts, so
// deleting the run does not leave the task running.
const ExternalWorkFinalizer = "toolnexus.dev/external-work"

// ReasonInvalidPolicy: the ApprovalPolicy's selectors, when or prompt cannot be used; it refuses
// every call it would gate until fixed.
const ReasonInvalidPolicy = "InvalidPolicy"

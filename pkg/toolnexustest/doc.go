// Package toolnexustest is the test kit for people who build on the Toolnexus operator: answering
// bots, GitOps checks, policy authors. It runs the real operator in a test's process against a real
// kube-apiserver and etcd (envtest), and fakes only what lies outside the operator, over real HTTP
// on loopback:
//
//   - NewModel is a scripted OpenAI-compatible model (chat completions): text and tool-call
//     replies, HTTP failures, delays, and replies computed from the request; it records what it
//     was sent.
//   - NewToolServer is an HTTP tool speaking the operator's suspension wire protocol: it records
//     each call's arguments, Idempotency-Key and the Answer it was retried with, and Suspend,
//     NeedsApproval, NeedsInput and AuthRequired make a call park its run on a PendingRequest.
//   - Start starts envtest, installs the operator's CRDs, admission policies and RBAC from the
//     repository's config/ and runs the manager in-process as its ServiceAccount. Env.User makes
//     certificate users (Env.Grant binds them a role), Env.WaitForRequest and Env.WaitForPhase wait
//     on runs, and Approve, Decline and Answer answer a request as a given user's client, bound to
//     the request they were given (answer.requestUID).
//   - A suite that installs and runs the operator its own way (a Helm chart, a GitOps tool, the
//     manager's binary) uses the model, the tool server, the answers and the package-level
//     WaitForRequest and WaitForPhase, which read as the client they are given, without Start.
//
// Start needs the control plane's binaries (kube-apiserver, etcd, kubectl): the directory
// KUBEBUILDER_ASSETS names, or else, in a checkout of the operator, what its hack/controlplane.sh
// builds from Go modules. It installs the config/ of the operator's source the test is built from
// (a replace directive pointing at a checkout, as examples/answer-bot does, or the module cache),
// with that kubectl's kustomize; a build with -trimpath has no such path and cannot use Start.
// Outside a checkout, set KUBEBUILDER_ASSETS (setup-envtest use prints a directory that fits).
package toolnexustest

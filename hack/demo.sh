#!/usr/bin/env bash
# make demo: the operator's story in one command. Brings up the local stack of `make dev` in the
# background (or uses the one `make dev` is already running), then: an agent run asks for
# approval, parks on a PendingRequest, a non-approver is refused, the approver answers with
# kubectl patch, and the run finishes. Exits non-zero as soon as a step fails; tears down what it
# started.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source hack/lib/stack.sh

# A fresh namespace per demo: the local cluster runs no kube-controller-manager, so a deleted
# namespace would stay Terminating and owned objects are not garbage-collected.
ns=toolnexus-demo-$(date +%Y%m%d-%H%M%S)
step=0
step() { step=$((step + 1)); printf '\n\033[1;36m%d. %s\033[0m\n' "$step" "$*"; }
show() { # show CMD...: prints it (with short paths), then runs it
	local line="$*"
	printf '\033[2m$ %s\033[0m\n' "${line//$dev/.dev}"
	"$@"
}

if [ -f "$dev/ready" ] && port_busy "$MODEL_ADDR" && port_busy "$PROBE_ADDR"; then
	assets=$("$root/hack/controlplane.sh")
	export KUBECONFIG="$dev/kubeconfig"
	model_setup
	say "Using the stack 'make dev' is running"
else
	trap 'say "Tearing down"; stack_down' EXIT
	trap 'exit 130' INT TERM
	stack_up
fi
alice="$dev/kubeconfig-alice"
bob="$dev/kubeconfig-bob"
kubectl() { "$assets/kubectl" -n "$ns" "$@"; }

step "A fresh namespace, with the Secret the sample's apiKeySecretRef names"
show kubectl create namespace "$ns"
ensure_llm_secret "$ns"

step "Apply an AgentRun: buy a GPU with a tool that needs spend approval (model: $model_desc)"
show kubectl apply -f config/samples/approval-tool.yaml

step "The tool asks for approval: the run suspends"
show kubectl wait --for=condition=Suspended ar/buy-gpu --timeout=120s
show kubectl get ar buy-gpu

step "The suspended tool call is a PendingRequest"
preq=$(kubectl get preq -l toolnexus.dev/run=buy-gpu -o jsonpath='{.items[0].metadata.name}')
[ -n "$preq" ] || die "no PendingRequest for buy-gpu"
show kubectl get preq
show kubectl describe preq "$preq"

if [ -d "$root/config/policies" ]; then
	step "bob is not an approver of this run: the API server refuses his answer"
	printf '\033[2m$ kubectl --kubeconfig .dev/kubeconfig-bob patch preq %s --subresource=status ...\033[0m\n' "$preq"
	if kubectl --kubeconfig "$bob" patch preq "$preq" --subresource=status --type=merge -p '{"status":{"answer":{"ok":true}}}'; then
		die "bob's answer was accepted; the approver policy (config/policies) should have refused it"
	fi
fi

step "alice approves it: the answer is a status patch"
show kubectl --kubeconfig "$alice" patch preq "$preq" --subresource=status --type=merge -p '{"status":{"answer":{"ok":true}}}'
show kubectl get preq "$preq" -o jsonpath='answeredBy={.status.answeredBy} answeredAt={.status.answeredAt}{"\n"}'

step "The tool is called again with the answer attached, and the run finishes"
show kubectl wait --for=condition=Succeeded ar/buy-gpu --timeout=120s
show kubectl get ar buy-gpu

step "The run's final text"
text=$(kubectl get ar buy-gpu -o jsonpath='{.status.text}')
printf '%s\n' "$text"
[ -n "$text" ] || die "the run has no status.text"

printf '\n\033[1;32mDemo complete.\033[0m More samples, one per suspension kind: config/samples/. Run the stack yourself with: make dev\n'

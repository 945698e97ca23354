#!/usr/bin/env bash
# make demo: the operator's story in one command. Brings up the local stack of `make dev` in the
# background (or uses the one `make dev` is already running), then: an agent run asks for
# approval and parks on a PendingRequest; a non-approver's answer is refused by the API server;
# the approver reviews the request with kubectl toolnexus show and pastes the command it prints,
# bound to the request's uid; the run finishes. Exits non-zero as soon as a step fails; tears down
# what it started.
#
# Every command it prints ($ ...) is the text it runs: pasted from the repository into a shell
# that ran the printed export line, it works the same (the e2e test TestPrintedCommands pastes
# them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source hack/lib/stack.sh

# A fresh namespace per demo: the local cluster runs no kube-controller-manager, so a deleted
# namespace would stay Terminating and owned objects are not garbage-collected.
ns=toolnexus-demo-$(date +%Y%m%d-%H%M%S)
step=0
step() { step=$((step + 1)); printf '\n\033[1;36m%d. %s\033[0m\n' "$step" "$*"; }
# cmdline CMD...: the command as a person pastes it, words quoted where they must be and paths
# relative to the repository.
cmdline() {
	local line="" word
	for word; do line+="${line:+ }$(shquote "$word")"; done
	printf %s "${line//"$root/"/}"
}
print_cmd() { printf '\033[2m$ %s\033[0m\n' "$1"; }
# run CMD...: prints the command, then runs exactly the text printed.
run() {
	local line
	line=$(cmdline "$@")
	print_cmd "$line"
	eval "$line"
}

if [ -f "$dev/ready" ] && port_busy "$MODEL_ADDR" && port_busy "$PROBE_ADDR"; then
	assets=$("$root/hack/controlplane.sh")
	go build -o "$bin/" ./cmd/kubectl-toolnexus || die "go build failed"
	stack_env
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
printf '\nEvery command below works pasted as printed, from %s, in a shell that ran:\n  %s\n' "$root" "$(env_line)"

step "A fresh namespace, with the Secret the sample's apiKeySecretRef names"
run kubectl create namespace "$ns"
ensure_llm_secret "$ns"
printf '\033[2m(the Secret llm holds the model key: given on stdin, not printed)\033[0m\n'

step "Apply an AgentRun: buy a GPU with a tool that needs spend approval (model: $model_desc)"
run kubectl -n "$ns" apply -f "$samples/approval-tool.yaml"

step "The tool asks for approval: the run suspends"
run kubectl -n "$ns" wait --for=condition=Suspended ar/buy-gpu --timeout=120s
run kubectl -n "$ns" get ar buy-gpu

step "The suspended tool call is a PendingRequest"
preq=$(kubectl -n "$ns" get ar buy-gpu -o jsonpath='{.status.pending[0].name}')
[ -n "$preq" ] || die "buy-gpu lists no PendingRequest"
run kubectl -n "$ns" wait --for=create "preq/$preq" --timeout=60s
run kubectl -n "$ns" get preq
# Read before alice reviews it: what is approved must be the object she saw.
uid=$(kubectl -n "$ns" get preq "$preq" -o jsonpath='{.metadata.uid}')

if [ -d "$root/config/policies" ]; then
	step "bob is not an approver of this run: the API server refuses his answer"
	if run kubectl --kubeconfig "$bob" -n "$ns" patch preq "$preq" --subresource=status --type=merge \
		-p "{\"status\":{\"answer\":{\"ok\":true,\"requestUID\":\"$uid\"}}}"; then
		die "bob's answer was accepted; the approver policy (config/policies) should have refused it"
	fi
fi

step "alice reviews it: the tool call, its arguments, its uid and the commands that answer it"
line=$(cmdline kubectl toolnexus show "$preq" -n "$ns")
print_cmd "$line"
shown=$(eval "$line")
printf '%s\n' "$shown"
grep -q "^UID: *$uid\$" <<<"$shown" || die "show printed another request than the one read (uid $uid)"

step "alice pastes the approve command show printed: an answer bound to the request she saw"
# The command is built here from the request's name and uid, never taken from show's output (a
# prompt a model wrote could hold a line that looks like one), and must be the one show printed.
approve=$(cmdline kubectl toolnexus approve "$preq" -n "$ns" --uid "$uid")
sed 's/^ *//' <<<"$shown" | grep -qxF -- "$approve" || die "show did not print the command: $approve"
line="$approve $(cmdline --kubeconfig "$alice")"
print_cmd "$line"
eval "$line"
run kubectl -n "$ns" get preq "$preq" -o jsonpath='answeredBy={.status.answeredBy} requestUID={.status.answer.requestUID}{"\n"}'

step "The tool is called again with the answer attached, and the run finishes"
run kubectl -n "$ns" wait --for=condition=Succeeded ar/buy-gpu --timeout=120s
run kubectl -n "$ns" get ar buy-gpu

step "The run's final text (the plugin escapes what the model wrote)"
[ -n "$(kubectl -n "$ns" get ar buy-gpu -o jsonpath='{.status.text}')" ] || die "the run has no status.text"
run kubectl toolnexus wait buy-gpu -n "$ns" --timeout=10s

printf '\n\033[1;32mDemo complete.\033[0m More samples, one per suspension kind: config/samples/. Run the stack yourself with: make dev\n'

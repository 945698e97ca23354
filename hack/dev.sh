#!/usr/bin/env bash
# make dev: runs the operator for real on this machine — a local kube-apiserver and etcd with the
# CRDs, admission policies and RBAC installed, a model endpoint (a real one if OPENAI_API_KEY /
# ANTHROPIC_API_KEY is set, else the deterministic stand-in), the sample tools, and the manager —
# until Ctrl-C, which stops everything it started. State lives in .dev/ and is reused by the next
# run; `rm -rf .dev` starts afresh. See hack/lib/stack.sh for the model settings and for running a
# second stack beside this one.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/stack.sh"

trap 'echo; say "Stopping"; stack_down' EXIT
trap 'exit 0' INT TERM
stack_up
# The cluster's state outlives a session: a run of an earlier one would not suspend again.
earlier=""
if kubectl get ar buy-gpu >/dev/null 2>&1; then
	earlier="
Note: ar/buy-gpu is left from an earlier session in $dev, so it will not suspend again: stop, run
rm -rf $(shquote "$dev") for a fresh cluster and start again, or try another sample.
"
fi

# Every command below works pasted as printed, in that order, in a shell of its own: the
# PendingRequest's name comes from the run's status, and alice's approval is bound (--uid) to the
# request read before she reviews it, so a request replaced meanwhile is refused. The e2e test
# TestPrintedCommands pastes them.
cat <<MSG

Toolnexus is running. Model: $model_desc
In another terminal, paste these as they are:

  $(env_line)

  kubectl apply -f $(shquote "$samples/approval-tool.yaml")        # more in config/samples/
  kubectl wait --for=condition=Suspended ar/buy-gpu --timeout=120s
  kubectl get ar,preq
  preq=\$(kubectl get ar buy-gpu -o jsonpath='{.status.pending[0].name}')
  kubectl wait --for=create "preq/\$preq"
  uid=\$(kubectl get preq "\$preq" -o jsonpath='{.metadata.uid}')
  kubectl toolnexus show "\$preq"        # what alice approves: the tool call, its arguments, the uid
  kubectl toolnexus approve "\$preq" --uid "\$uid" --kubeconfig $(shquote "$dev/kubeconfig-alice")
  kubectl wait --for=condition=Succeeded ar/buy-gpu --timeout=120s && kubectl toolnexus wait buy-gpu    # the final text, escaped

Users: $dev/kubeconfig (admin), $dev/kubeconfig-alice (approver), $dev/kubeconfig-bob (not an approver).
Logs: $dev/logs/. Metrics: http://$METRICS_ADDR/metrics. Ctrl-C stops everything.
OAuth login callback (register it as your OAuth client's redirect URI): http://$OAUTH_ADDR/oauth/callback$earlier
MSG

# Runs until Ctrl-C, or until one of the processes exits on its own.
wait -n "${stack_pids[@]}" || true
say "A process exited; see $dev/logs/"
exit 1

#!/usr/bin/env bash
# make dev: runs the operator for real on this machine — a local kube-apiserver and etcd with the
# CRDs, admission policies and RBAC installed, a model endpoint (a real one if OPENAI_API_KEY /
# ANTHROPIC_API_KEY is set, else the deterministic stand-in), the sample tools, and the manager —
# until Ctrl-C, which stops everything it started. State lives in .dev/ and is reused by the next
# run; `rm -rf .dev` starts afresh. See hack/lib/stack.sh for the model settings.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/stack.sh"

trap 'echo; say "Stopping"; stack_down' EXIT
trap 'exit 0' INT TERM
stack_up

cat <<MSG

Toolnexus is running. Model: $model_desc
In another terminal:

  export KUBECONFIG=$dev/kubeconfig
  alias kubectl=$assets/kubectl

  kubectl apply -f config/samples/approval-tool.yaml          # more in config/samples/
  kubectl wait --for=condition=Suspended ar/buy-gpu
  kubectl get ar,preq
  kubectl describe preq -l toolnexus.dev/run=buy-gpu
  kubectl --kubeconfig $dev/kubeconfig-alice patch preq \$(kubectl get preq -l toolnexus.dev/run=buy-gpu -o name) \\
    --subresource=status --type=merge -p '{"status":{"answer":{"ok":true}}}'
  kubectl wait --for=condition=Succeeded ar/buy-gpu && kubectl get ar buy-gpu -o jsonpath='{.status.text}{"\n"}'

Users: .dev/kubeconfig (admin), .dev/kubeconfig-alice (approver), .dev/kubeconfig-bob (not an approver).
Logs: .dev/logs/. Metrics: http://$METRICS_ADDR/metrics. Ctrl-C stops everything.
MSG

# Runs until Ctrl-C, or until one of the processes exits on its own.
wait -n "${stack_pids[@]}" || true
say "A process exited; see .dev/logs/"
exit 1

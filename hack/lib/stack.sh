# shellcheck shell=bash
# The local stack that hack/dev.sh and hack/demo.sh run, to be sourced: a local control plane
# (hack/localcluster), the model endpoint, the sample tools and the manager, all on loopback, all
# data under .dev/. stack_up starts them in the background and records their pids; stack_down
# stops exactly those pids.
#
# Model endpoint, chosen from the environment:
#   OPENAI_API_KEY (+ OPENAI_BASE_URL, default https://api.openai.com/v1; OPENAI_MODEL, default
#     gpt-4o-mini)  -> a relay to that endpoint
#   ANTHROPIC_API_KEY (+ ANTHROPIC_BASE_URL, default https://api.anthropic.com/v1, its
#     OpenAI-compatible API; ANTHROPIC_MODEL, default claude-sonnet-4-5)  -> a relay to it
#   OPENAI_BASE_URL alone (a local Ollama, vLLM...)  -> a relay to it, without a key
#   nothing  -> the project's deterministic stand-in model (cmd/standin-model)
# Either way it listens on 127.0.0.1:18080/v1, which config/samples names, and the Secret "llm"
# (key apiKey) holds the key; the relay passes the operator's Authorization header on.
#
# A second stack can run beside `make dev` (the e2e test of the printed commands runs one):
# TOOLNEXUS_DEV_DIR (default .dev), TOOLNEXUS_MODEL_ADDR, TOOLNEXUS_TOOLS_ADDR, TOOLNEXUS_PROBE_ADDR,
# TOOLNEXUS_METRICS_ADDR, TOOLNEXUS_OAUTH_ADDR (host:port), TOOLNEXUS_APISERVER_PORT, TOOLNEXUS_ETCD_PORT (0 picks free
# ports). With other model or tools addresses, the samples are copied into $dev/samples naming them.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dev=${TOOLNEXUS_DEV_DIR:-$root/.dev}
bin="$dev/bin"
MODEL_ADDR=${TOOLNEXUS_MODEL_ADDR:-127.0.0.1:18080}
TOOLS_ADDR=${TOOLNEXUS_TOOLS_ADDR:-127.0.0.1:18081}
PROBE_ADDR=${TOOLNEXUS_PROBE_ADDR:-127.0.0.1:18082}
METRICS_ADDR=${TOOLNEXUS_METRICS_ADDR:-127.0.0.1:18083}
OAUTH_ADDR=${TOOLNEXUS_OAUTH_ADDR:-127.0.0.1:18084}
APISERVER_PORT=${TOOLNEXUS_APISERVER_PORT:-16443}
ETCD_PORT=${TOOLNEXUS_ETCD_PORT:-12379}
stack_pids=()

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf '\033[31mERROR: %s\033[0m\n' "$*" >&2; exit 1; }

# shquote WORD: WORD as a shell reads it back, quoted only when it must be: what the scripts print
# for a person to paste.
shquote() {
	case $1 in
	'' | *[!A-Za-z0-9_./:=@%+,-]*) printf "'%s'" "${1//\'/\'\\\'\'}" ;;
	*) printf %s "$1" ;;
	esac
}

# stack_env puts the kubectl the project builds (a fresh machine has none on PATH) and the
# kubectl-toolnexus plugin on PATH, as $dev/path, which the scripts tell people to export too; and
# sets samples, the directory of the samples that name this stack's model and tools.
stack_env() {
	mkdir -p "$dev/path"
	ln -sf "$assets/kubectl" "$dev/path/kubectl"
	ln -sf "$bin/kubectl-toolnexus" "$dev/path/kubectl-toolnexus"
	export PATH="$dev/path:$PATH"
	samples="$root/config/samples"
	if [ "$MODEL_ADDR" != 127.0.0.1:18080 ] || [ "$TOOLS_ADDR" != 127.0.0.1:18081 ]; then
		samples="$dev/samples"
		mkdir -p "$samples"
		local f
		for f in "$root"/config/samples/*.yaml; do
			sed -e "s#http://127.0.0.1:18080#http://$MODEL_ADDR#g" -e "s#http://127.0.0.1:18081#http://$TOOLS_ADDR#g" \
				"$f" >"$samples/${f##*/}"
		done
	fi
}

# env_line is the line that gives a person's shell what the printed commands need.
env_line() {
	printf 'export KUBECONFIG=%s PATH=%s:$PATH' "$(shquote "$dev/kubeconfig")" "$(shquote "$dev/path")"
}

port_busy() { (exec 3<>"/dev/tcp/${1%:*}/${1#*:}") 2>/dev/null; }

# wait_http URL SECONDS PID: until URL answers 2xx, or fail when PID died.
wait_http() {
	local deadline=$((SECONDS + $2))
	while ((SECONDS < deadline)); do
		curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
		kill -0 "$3" 2>/dev/null || return 1
		sleep 0.3
	done
	return 1
}

start_bg() { # start_bg NAME CMD... : runs CMD with its output in .dev/logs/NAME.log
	local name=$1
	shift
	"$@" >>"$dev/logs/$name.log" 2>&1 &
	stack_pids+=($!)
	eval "pid_$name=$!"
}

stack_down() {
	local i
	for ((i = ${#stack_pids[@]} - 1; i >= 0; i--)); do
		kill -TERM "${stack_pids[i]}" 2>/dev/null || true
	done
	for pid in "${stack_pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	stack_pids=()
}

model_setup() { # sets model_args, model_key, model_desc
	model_args=(--addr "$MODEL_ADDR")
	if [ -n "${OPENAI_API_KEY:-}" ] || [ -n "${OPENAI_BASE_URL:-}" ]; then
		model_args+=(--upstream "${OPENAI_BASE_URL:-https://api.openai.com/v1}" --upstream-model "${OPENAI_MODEL:-gpt-4o-mini}")
		model_key=${OPENAI_API_KEY:-none}
		model_desc="${OPENAI_MODEL:-gpt-4o-mini} at ${OPENAI_BASE_URL:-https://api.openai.com/v1} (relayed via http://$MODEL_ADDR/v1)"
	elif [ -n "${ANTHROPIC_API_KEY:-}" ]; then
		model_args+=(--upstream "${ANTHROPIC_BASE_URL:-https://api.anthropic.com/v1}" --upstream-model "${ANTHROPIC_MODEL:-claude-sonnet-4-5}")
		model_key=$ANTHROPIC_API_KEY
		model_desc="${ANTHROPIC_MODEL:-claude-sonnet-4-5} at ${ANTHROPIC_BASE_URL:-https://api.anthropic.com/v1} (relayed via http://$MODEL_ADDR/v1)"
	else
		model_key=stand-in-needs-no-key
		model_desc="the STAND-IN model (deterministic, not an LLM) at http://$MODEL_ADDR/v1; set OPENAI_API_KEY or ANTHROPIC_API_KEY for a real one"
	fi
}

# ensure_llm_secret NAMESPACE: the Secret the samples' apiKeySecretRef names. The key goes
# through stdin, never a command line.
ensure_llm_secret() {
	printf %s "$model_key" | kubectl create secret generic llm -n "$1" --from-file=apiKey=/dev/stdin \
		--dry-run=client -o yaml | kubectl apply --server-side --force-conflicts --field-manager=toolnexus-dev -f - >/dev/null
}

stack_up() {
	command -v go >/dev/null || die "Go is not on PATH"
	command -v curl >/dev/null || die "curl is not on PATH"
	mkdir -p "$bin" "$dev/logs"
	local addrs=("$MODEL_ADDR" "$TOOLS_ADDR" "$PROBE_ADDR" "$METRICS_ADDR" "$OAUTH_ADDR")
	[ "$APISERVER_PORT" = 0 ] || addrs+=("127.0.0.1:$APISERVER_PORT")
	[ "$ETCD_PORT" = 0 ] || addrs+=("127.0.0.1:$ETCD_PORT")
	for addr in "${addrs[@]}"; do
		port_busy "$addr" && die "$addr is in use: is 'make dev' already running? Stop it (Ctrl-C) first."
	done

	say "Building the control plane (once; cached) and the binaries"
	assets=$("$root/hack/controlplane.sh")
	(cd "$root" && go build -o "$bin/" ./cmd/manager ./cmd/standin-model ./cmd/sample-tools ./cmd/kubectl-toolnexus ./hack/localcluster) ||
		die "go build failed"
	stack_env

	say "Starting etcd and kube-apiserver (data in $dev; logs in $dev/logs)"
	rm -f "$dev/ready"
	start_bg localcluster "$bin/localcluster" --dir "$dev" --assets "$assets" --repo "$root" \
		--apiserver-port "$APISERVER_PORT" --etcd-port "$ETCD_PORT"
	local deadline=$((SECONDS + 180))
	until [ -f "$dev/ready" ]; do
		kill -0 "$pid_localcluster" 2>/dev/null || { tail -n 20 "$dev/logs/localcluster.log" >&2; die "the local cluster did not start"; }
		((SECONDS < deadline)) || die "the local cluster was not ready within 180s; see $dev/logs/"
		sleep 0.3
	done
	export KUBECONFIG="$dev/kubeconfig"

	model_setup
	say "Starting the model endpoint: $model_desc"
	start_bg model "$bin/standin-model" "${model_args[@]}"
	say "Starting the sample tools at http://$TOOLS_ADDR"
	start_bg tools "$bin/sample-tools" --addr "$TOOLS_ADDR"
	ensure_llm_secret default

	local manager_kubeconfig="$dev/kubeconfig-manager" identity="its ServiceAccount (config/rbac)"
	if [ ! -d "$root/config/rbac" ]; then
		manager_kubeconfig="$dev/kubeconfig"
		identity="admin (config/rbac is absent)"
	fi
	say "Starting the manager as $identity; log in $dev/logs/manager.log"
	# The manager "runs in" toolnexus-system, where config/rbac lets it keep logins.
	start_bg manager env KUBECONFIG="$manager_kubeconfig" POD_NAMESPACE=toolnexus-system "$bin/manager" \
		--health-probe-bind-address="$PROBE_ADDR" --metrics-bind-address="$METRICS_ADDR" --metrics-secure=false \
		--oauth-callback-bind-address="$OAUTH_ADDR" --oauth-redirect-url="http://$OAUTH_ADDR/oauth/callback" \
		--zap-log-level="${MANAGER_LOG_LEVEL:-info}"
	wait_http "http://$MODEL_ADDR/v1/models" 30 "$pid_model" || die "the model endpoint did not start; see $dev/logs/model.log"
	wait_http "http://$TOOLS_ADDR/oauth/authorize" 30 "$pid_tools" || die "the sample tools did not start; see $dev/logs/tools.log"
	wait_http "http://$PROBE_ADDR/readyz" 60 "$pid_manager" || { tail -n 20 "$dev/logs/manager.log" >&2; die "the manager did not become ready"; }
}

#!/usr/bin/env bash
# Builds kube-apiserver, kubectl and etcd from Go modules (go.sum-verified, no binary downloads)
# and installs them where setup-envtest keeps binaries, so KUBEBUILDER_ASSETS works and a second
# call is instant. Prints the assets directory on stdout.
#
# The Kubernetes version follows k8s.io/kubernetes in hack/tools/kube/go.mod; etcd follows
# hack/tools/etcd/go.mod.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
k8s_version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {sub(/^v/, "", $3); print $3}' "$here/tools/kube/go.mod")
store=${ENVTEST_STORE:-${XDG_DATA_HOME:-$HOME/.local/share}/kubebuilder-envtest}
assets="$store/k8s/${k8s_version}-$(go env GOOS)-$(go env GOARCH)"

step=0
build() { # build <module dir> <package> <output name>
	local out="$assets/$3"
	step=$((step + 1))
	[ -x "$out" ] && return 0
	if [ ! -f "$assets/.announced" ]; then
		echo "The local control plane is built from Go modules once (15 to 25 minutes on 2 cores the" >&2
		echo "first time, module downloads included); later runs reuse $assets." >&2
		touch "$assets/.announced"
	fi
	echo "[$step/3] building $3 from $2" >&2
	local start=$SECONDS
	(cd "$here/tools/$1" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out.tmp" "$2") &
	local pid=$!
	# go build says nothing while it works: say that it does.
	while ! wait_for "$pid" 30; do
		echo "[$step/3] still building $3 ($((SECONDS - start))s so far)" >&2
	done
	wait "$pid"
	mv "$out.tmp" "$out"
	echo "[$step/3] built $3 in $((SECONDS - start))s" >&2
}

wait_for() { # wait_for <pid> <seconds>: true once pid has exited, false after seconds
	local i
	for ((i = 0; i < $2; i++)); do
		kill -0 "$1" 2>/dev/null || return 0
		sleep 1
	done
	! kill -0 "$1" 2>/dev/null
}

mkdir -p "$assets"
build etcd go.etcd.io/etcd/server/v3 etcd
build kube k8s.io/kubernetes/cmd/kubectl kubectl
build kube k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver
echo "$assets"

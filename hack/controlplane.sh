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

build() { # build <module dir> <package> <output name>
	local out="$assets/$3"
	[ -x "$out" ] && return 0
	echo "building $3 from $2 (once; cached in $assets)" >&2
	(cd "$here/tools/$1" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out.tmp" "$2")
	mv "$out.tmp" "$out"
}

mkdir -p "$assets"
build etcd go.etcd.io/etcd/server/v3 etcd
build kube k8s.io/kubernetes/cmd/kubectl kubectl
build kube k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver
echo "$assets"

//go:build tools

// Package tools pins the etcd server that hack/controlplane.sh builds.
package tools

import _ "go.etcd.io/etcd/server/v3"

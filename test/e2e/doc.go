// Package e2e runs the built manager binary against a real kube-apiserver and etcd with real
// token-authenticated users, drives it with the real kubectl, and talks to the stand-in model and
// the sample tools over HTTP. TestHelmChart installs, upgrades and uninstalls the Helm chart with
// the Helm v4 SDK and runs the manager as the chart's Deployment configures it. The tests are
// behind the e2e build tag:
//
//	go test -tags e2e ./test/e2e/
package e2e

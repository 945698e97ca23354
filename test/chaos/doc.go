// Package chaos proves the durability guarantees (docs/design.md) under faults: the built manager binary runs 100 agent runs against
// a real kube-apiserver and etcd while it is SIGKILLed at random moments, the API server is
// stopped and restarted (etcd kept), two leader-elected replicas fail over, and one of two shards
// (--shard) is SIGKILLed mid-run while the other goes on untouched. A fake model and
// a fake tool server, both speaking the real wire protocols, record what they were asked, so the
// test can check that every run ends, every answer is consumed exactly once, no call gets a
// second PendingRequest, and count the at-least-once re-executions. The test is behind the chaos
// build tag:
//
//	go test -tags chaos -v ./test/chaos/
package chaos

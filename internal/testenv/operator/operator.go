// Package operator runs the operator in-process on a test environment, wired by controller.Setup
// as cmd/manager wires it, with the identity of the rest.Config it is given (the manager's
// ServiceAccount, where a suite checks what config/rbac lets it do). A Manager starts, stops and
// restarts the way the process would: each start is a new manager with new caches, a new metrics
// registry and whatever else options gives it.
//
// It imports internal/controller, so only external test packages (package x_test) may use it: an
// in-package test of internal/controller or of a package it imports would make a cycle, and uses
// package testenv alone.
package operator

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/toolnexus/operator/internal/controller"
	"github.com/toolnexus/operator/internal/testenv"
)

// Manager is the operator of one suite, stopped or running.
type Manager struct {
	config  *rest.Config
	options func() controller.Options
	running *process
}

// process is one run of the manager, from Start to Stop.
type process struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// New returns a stopped Manager that will act as config's user. options is called on every Start,
// so what a process owns (a tracer provider, a metrics registry) is its own; a nil Registry is a
// new one, a nil options the defaults. The manager is stopped when t ends: t is the suite's, and a
// spec that stops and starts the manager leaves it running for the next.
func New(t testenv.T, config *rest.Config, options func() controller.Options) *Manager {
	m := &Manager{config: config, options: options}
	t.Cleanup(func() {
		if err := m.Stop(); err != nil {
			t.Errorf("operator: %v", err)
		}
	})
	return m
}

// Start starts a new manager with every controller of the operator; it runs until Stop.
func (m *Manager) Start(t testenv.T) {
	t.Helper()
	if m.running != nil {
		t.Fatalf("operator: Start while the manager runs: Stop it first, or Restart")
	}
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatalf("operator: %v", err)
	}
	var o controller.Options
	if m.options != nil {
		o = m.options()
	}
	// The cache cmd/manager builds: managed fields stripped, the run's kinds of o.Shard alone.
	cacheOpts, err := controller.CacheOptions(o.Shard, nil)
	if err != nil {
		t.Fatalf("operator: %v", err)
	}
	mgr, err := ctrl.NewManager(m.config, ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0", Cache: cacheOpts,
		// Each start registers the controllers again under their names.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatalf("operator: creating the manager: %v", err)
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	if err := controller.Setup(mgr, o); err != nil {
		t.Fatalf("operator: setting up the controllers: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &process{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.err = mgr.Start(ctx)
	}()
	m.running = p
}

// Stop stops the running manager, waits until it has, and returns the error it stopped with, if
// any. A stopped Manager stays stopped.
func (m *Manager) Stop() error {
	p := m.running
	if p == nil {
		return nil
	}
	m.running = nil
	p.cancel()
	<-p.done
	if p.err != nil {
		return fmt.Errorf("the manager stopped with: %w", p.err)
	}
	return nil
}

// Restart stops the running manager and starts a new one, as a restarted process would.
func (m *Manager) Restart(t testenv.T) {
	t.Helper()
	if err := m.Stop(); err != nil {
		t.Fatalf("operator: %v", err)
	}
	m.Start(t)
}

// Done is closed when the running manager has stopped, whether by Stop or on its own; nil when
// none runs.
func (m *Manager) Done() <-chan struct{} {
	if m.running == nil {
		return nil
	}
	return m.running.done
}

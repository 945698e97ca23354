package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"runtime"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
)

func newInboxCommand(o *options) *cobra.Command {
	var address string
	var open bool
	cmd := &cobra.Command{
		Use:   "inbox [--address 127.0.0.1:0] [--open]",
		Short: "Serve a local web page to answer PendingRequests, live, with your identity",
		Long: `Serve a web inbox on a loopback address: the open PendingRequests of the namespace (-n, or
the kubeconfig's), or of every namespace with -A, updated live; a request's details, its run's
state and transcript; and buttons and forms to approve, decline or answer it.

The inbox talks to the API server with your kubeconfig and identity, like every other command:
the API server decides who may answer and stamps answeredBy. It listens on loopback only and
prints its URL with a random token; only a browser holding that token, at that address, is
served, and answers are taken only from the inbox's own pages.`,
		Example: `  kubectl toolnexus inbox --open
  kubectl toolnexus inbox -A --address 127.0.0.1:8400`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.runInbox(cmd.Context(), address, open)
		},
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1:0", "Loopback address to listen on; port 0 picks a free one.")
	cmd.Flags().BoolVar(&open, "open", false, "Open the inbox in a browser.")
	cmd.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "Show the requests of every namespace (needs list and watch across the cluster).")
	return cmd
}

func (o *options) runInbox(ctx context.Context, address string, open bool) error {
	address, err := loopbackAddress(address)
	if err != nil {
		return err
	}
	// The informers log through controller-runtime; what matters reaches the page or the error.
	ctrllog.SetLogger(logr.Discard())
	ns := o.listNamespace()
	// Listing first turns a missing permission into a clear error instead of a cache that waits.
	for _, list := range []client.ObjectList{&toolnexusv1alpha1.PendingRequestList{}, &toolnexusv1alpha1.AgentRunList{}} {
		if err := o.client.List(ctx, list, client.InNamespace(ns), client.Limit(1)); err != nil {
			return err
		}
	}
	cfg, err := o.config.ToRESTConfig()
	if err != nil {
		return err
	}
	opts := cache.Options{Scheme: o.client.Scheme()}
	if ns != "" {
		opts.DefaultNamespaces = map[string]cache.Config{ns: {}}
	}
	objects, err := cache.New(cfg, opts)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in := newInbox(o, objects, ns)
	for _, obj := range []client.Object{&toolnexusv1alpha1.PendingRequest{}, &toolnexusv1alpha1.AgentRun{}} {
		informer, err := objects.GetInformer(ctx, obj)
		if err != nil {
			return err
		}
		if _, err := informer.AddEventHandler(in.hub.handler()); err != nil {
			return err
		}
	}
	cacheDone := make(chan error, 1)
	go func() { cacheDone <- objects.Start(ctx) }()
	if !objects.WaitForCacheSync(ctx) {
		return errors.New("the inbox could not read the PendingRequests and AgentRuns")
	}

	listener, err := net.Listen("tcp", address)
	if err != nil {
		return err
	}
	token, err := newToken()
	if err != nil {
		return err
	}
	host := listener.Addr().String()
	srv := &http.Server{
		Handler:           &guard{host: host, token: token, next: in.routes()},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	url := "http://" + host + "/?token=" + token
	fmt.Fprintln(o.out, url)
	fmt.Fprintln(o.errOut, "Serving the inbox at the URL above with your kubeconfig identity; Ctrl-C stops it.")
	if open {
		if err := openBrowser(url); err != nil {
			fmt.Fprintf(o.errOut, "Could not open a browser (%v): open the URL yourself.\n", err)
		}
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(listener) }()
	select {
	case err = <-served:
	case err = <-cacheDone:
	case <-ctx.Done():
	}
	shutdown, stop := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer stop()
	cancel()
	_ = srv.Shutdown(shutdown)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// openBrowser asks the desktop to open url, best effort.
func openBrowser(url string) error {
	var cmd *exec.Cmd
	switch runtime.GOOS {
	case "darwin":
		cmd = exec.Command("open", url)
	case "windows":
		cmd = exec.Command("rundll32", "url.dll,FileProtocolHandler", url)
	default:
		cmd = exec.Command("xdg-open", url)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }()
	return nil
}

// Command a2a-gateway serves the cluster's toolnexus Agents over A2A 1.0 (JSON-RPC binding). It is
// optional and runs apart from the manager, as its own ServiceAccount, because it holds the right
// to impersonate users and groups: it authenticates each caller's Kubernetes token with a
// TokenReview and makes every read and write as that caller (config/a2a-gateway, docs/security.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	toolnexusv1alpha1 "github.com/toolnexus/operator/api/v1alpha1"
	"github.com/toolnexus/operator/internal/a2a/gateway"
)

func main() {
	var (
		bindAddr, publicURL, certFile, keyFile, audiences string
		maxBody                                           int64
		blocking, maxStream                               time.Duration
		maxStreams                                        int
	)
	flag.StringVar(&bindAddr, "bind-address", ":8443", "Address the gateway listens on.")
	flag.StringVar(&publicURL, "public-url", "", "URL callers reach the gateway at (https://a2a.example.com); agent cards name their endpoints under it. Required.")
	flag.StringVar(&certFile, "tls-cert-file", "", "TLS certificate to serve with; with --tls-private-key-file. Without both the gateway serves plain HTTP, for a TLS-terminating proxy or mesh in front of it.")
	flag.StringVar(&keyFile, "tls-private-key-file", "", "Private key of --tls-cert-file.")
	flag.StringVar(&audiences, "token-audiences", "", "Comma-separated audiences a caller's token must be issued for (TokenReview audiences); empty accepts the API server's own.")
	flag.Int64Var(&maxBody, "max-body-bytes", gateway.DefaultMaxBodyBytes, "Largest request body accepted.")
	flag.DurationVar(&blocking, "blocking-timeout", gateway.DefaultBlockingTimeout, "How long a blocking SendMessage waits for its task to end or ask for input before it answers with the task as it is.")
	flag.DurationVar(&maxStream, "max-stream-duration", gateway.DefaultMaxStreamDuration, "How long a stream stays open; the client subscribes again to go on.")
	flag.IntVar(&maxStreams, "max-streams", gateway.DefaultMaxStreams, "Streams and blocking sends open at once.")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("a2a-gateway")
	if err := run(bindAddr, certFile, keyFile, gateway.Options{
		PublicURL: publicURL, Audiences: splitList(audiences), MaxBodyBytes: maxBody,
		BlockingTimeout: blocking, MaxStreamDuration: maxStream, MaxStreams: maxStreams, Log: log,
	}); err != nil {
		log.Error(err, "The gateway stopped")
		os.Exit(1)
	}
}

func run(bindAddr, certFile, keyFile string, o gateway.Options) error {
	if (certFile == "") != (keyFile == "") {
		return errors.New("--tls-cert-file and --tls-private-key-file go together")
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(toolnexusv1alpha1.AddToScheme(scheme))
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("reading the gateway's own credentials: %w", err)
	}
	o.Config, o.Scheme = cfg, scheme
	g, err := gateway.New(o)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Addr: bindAddr, Handler: g.Handler(),
		// Requests are small; streams write for as long as MaxStreamDuration, so writes have no
		// server-wide deadline.
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errs := make(chan error, 1)
	go func() {
		o.Log.Info("Serving A2A", "address", bindAddr, "publicURL", o.PublicURL, "tls", certFile != "")
		if certFile != "" {
			errs <- srv.ListenAndServeTLS(certFile, keyFile)
		} else {
			errs <- srv.ListenAndServe()
		}
	}()
	select {
	case err := <-errs:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// Command fakellm serves the deterministic upstream of package fakellm, for
// demos and benchmarks of the gateway. It listens on loopback unless told
// otherwise: it answers anyone without credentials by default.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/internal/fakellm"
)

func main() {
	if err := run(); err != nil {
		slog.Error("fakellm", "err", err)
		os.Exit(1)
	}
}

func run() error {
	var cfg fakellm.Config
	listen := flag.String("listen", "127.0.0.1:9090", "address to listen on")
	flag.DurationVar(&cfg.Latency, "latency", 0, "pause before the first byte of each answer")
	flag.IntVar(&cfg.Chunks, "chunks", fakellm.DefaultChunks, "content chunks (output tokens) per answer")
	flag.DurationVar(&cfg.ChunkInterval, "chunk-interval", 0, "pause between chunks")
	flag.StringVar(&cfg.FixturesDir, "fixtures", "", "directory of recorded responses for X-Fake-Replay (empty: replay disabled)")
	flag.StringVar(&cfg.APIKey, "api-key", "", "require this key (Authorization: Bearer, or x-api-key on /v1/messages)")
	shutdownWait := flag.Duration("shutdown-timeout", 10*time.Second, "how long to let open streams finish on SIGTERM/SIGINT")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", flag.Args())
	}
	if cfg.Chunks < 0 {
		return errors.New("-chunks must not be negative")
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           fakellm.New(cfg),
		ReadHeaderTimeout: 10 * time.Second,
		// The benchmark holds hundreds of streams open; idle keep-alive
		// connections are reused, not torn down, between its requests.
		IdleTimeout: 2 * time.Minute,
	}
	// The resolved address is printed on stdout so scripts can start fakellm
	// on port 0 and read where it went.
	fmt.Printf("fakellm listening on %s\n", ln.Addr())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	stop() // a second signal kills at once
	sctx, cancel := context.WithTimeout(context.Background(), *shutdownWait)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Streams paced for minutes would hold shutdown forever.
		_ = srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

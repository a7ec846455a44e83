// Command plainproxy is the physical floor of a Go reverse proxy: httputil.ReverseProxy with
// FlushInterval -1 (every write flushed, as a streaming gateway must) and a transport tuned
// like the gateway's, nothing else. `make bench` measures tollgate against it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9191", "address to listen on")
	upstream := flag.String("upstream", "http://127.0.0.1:9090", "upstream base URL")
	flag.Parse()
	if err := run(*listen, *upstream); err != nil {
		fmt.Fprintln(os.Stderr, "plainproxy:", err)
		os.Exit(1)
	}
}

func run(listen, upstream string) error {
	target, err := url.Parse(upstream)
	if err != nil || target.Host == "" {
		return fmt.Errorf("bad -upstream %q", upstream)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	rp.Transport = &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          2048,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 120 * time.Second,
	}
	rp.ErrorLog = log.New(os.Stderr, "plainproxy: ", log.LstdFlags)
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	// Full duplex: without it, an upstream whose headers come before the transport has seen
	// the end of the caller's body (its check for bytes past Content-Length) makes the server
	// drain that body under the transport's feet as the headers go out; the transport's write
	// fails and it closes the upstream connection mid-stream (the caller gets a cut stream,
	// ReverseProxy logs "use of closed network connection"). That cut 3-21 of the 1536
	// streams of every streams-512 round; tollgate reads a body whole before it forwards it.
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
			http.Error(w, "full duplex: "+err.Error(), http.StatusInternalServerError)
			return
		}
		rp.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	fmt.Printf("plainproxy listening on %s -> %s\n", ln.Addr(), target)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

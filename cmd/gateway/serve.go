package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/proxy"
)

// serve runs the gateway until SIGTERM/SIGINT, then drains: stop accepting, let calls in
// flight finish up to shutdown_timeout, wait for their settlements, exit.
func serve(ctx context.Context, args []string) error {
	e, err := setup(ctx, "serve", args, true, nil)
	if err != nil {
		return err
	}
	defer e.Close()
	cfg := e.cfg
	keys := metering.Keys{}
	leases := metering.NewLeases(e.rdb, keys, cfg.Instance, cfg.Holds.LeaseTTL, cfg.Holds.HeartbeatInterval, e.log)
	srv := proxy.New(proxy.Deps{
		Config: cfg, Store: e.store(), Redis: e.rdb, Keys: keys,
		Tally:  metering.NewTally(e.rdb, keys, cfg.Holds.TallyTTL),
		Leases: leases, Log: e.log,
	})

	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	go leases.Run(bg)

	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.ListenAddr, err)
	}
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          zap.NewStdLog(e.log),
	}
	e.log.Info("gateway listening", zap.String("addr", ln.Addr().String()))
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()

	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	e.log.Info("shutting down: draining calls in flight", zap.Duration("deadline", cfg.Limits.ShutdownTimeout))
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Limits.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		// Calls still streaming at the deadline are cut; closing their connections cancels
		// their requests, and their deferred settlements charge what they used.
		e.log.Warn("drain deadline passed; cutting remaining calls", zap.Error(err))
		_ = hs.Close()
	}
	wctx, wcancel := context.WithTimeout(context.Background(), cfg.Limits.SettleTimeout+5*time.Second)
	defer wcancel()
	if err := srv.WaitSettlements(wctx); err != nil && !errors.Is(err, context.Canceled) {
		e.log.Error("settlements still pending at exit; the reconciler will settle them", zap.Error(err))
	}
	e.log.Info("gateway stopped")
	return nil
}

func reconcileOnce(ctx context.Context, args []string) error {
	return errors.New("reconcile: not built yet")
}

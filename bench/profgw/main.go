// Command profgw is the gateway's `serve` wiring plus net/http/pprof on a second loopback
// listener, for profiling under `make bench` load (PROFILE=1 scripts/bench.sh). It is a
// bench-only copy of cmd/gateway/serve.go: the proxy, holds and metering code is the same.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/proxy"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "profgw:", err)
		os.Exit(1)
	}
}

func run() error {
	pprofAddr := flag.String("pprof", "127.0.0.1:6060", "pprof listener")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := config.Load("")
	if err != nil {
		return err
	}
	log, err := zap.NewProductionConfig().Build()
	if err != nil {
		return err
	}
	db, err := holds.Open(ctx, cfg.MySQLDSN)
	if err != nil {
		return err
	}
	defer db.Close()
	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	plans := make(map[string]holds.Plan, len(cfg.Plans))
	for name, p := range cfg.Plans {
		m := func(c config.Credits) int64 { return c.MicroAt(cfg.CreditMicro) }
		plans[name] = holds.Plan{AllowanceMicro: m(p.AllowanceCredits), HoldNormalMicro: m(p.HoldNormalCredits),
			HoldHeavyMicro: m(p.HoldHeavyCredits), HeavyAfterTurns: p.HeavyAfterTurns, MaxInFlight: p.MaxInFlight,
			MaxRunCostMicro: m(p.MaxRunCostCredits), DiscountBP: p.DiscountBP}
	}
	keys := metering.Keys{}
	leases := metering.NewLeases(rdb, keys, cfg.Instance, cfg.Holds.LeaseTTL, cfg.Holds.HeartbeatInterval, log)
	srv := proxy.New(proxy.Deps{
		Config: cfg, Store: holds.NewStore(db, plans, "standard", log), Redis: rdb, Keys: keys,
		Tally:  metering.NewTally(rdb, keys, cfg.Holds.TallyTTL),
		Leases: leases, Log: log,
	})
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	go leases.Run(bg)

	runtime.SetBlockProfileRate(0)
	runtime.SetMutexProfileFraction(5)
	go func() { _ = http.ListenAndServe(*pprofAddr, nil) }() // DefaultServeMux carries pprof

	ln, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	fmt.Printf("profgw listening on %s, pprof on %s\n", ln.Addr(), *pprofAddr)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	_ = srv.WaitSettlements(wctx)
	return nil
}

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/plans"
)

// Keys is what setup hands to run.
type Keys struct {
	Users              []string `json:"users"` // one key per ordinary user, in user order
	Hot                string   `json:"hot"`
	HotID              uint64   `json:"hot_id"`
	Drain              string   `json:"drain"`
	DrainID            uint64   `json:"drain_id"`
	DrainAllowance     int64    `json:"drain_allowance_micro"`
	HotMaxInFlight     int      `json:"hot_max_in_flight"`
	HotAllowanceMicro  int64    `json:"hot_allowance_micro"`
	UserAllowanceMicro int64    `json:"user_allowance_micro"`
}

func setupCmd(args []string) error {
	fs := flag.NewFlagSet("setup", flag.ContinueOnError)
	dsn := fs.String("dsn", os.Getenv("MYSQL_DSN"), "MySQL DSN")
	n := fs.Int("users", 1000, "ordinary users (standard plan, one key each)")
	hotInFlight := fs.Int("hot-max-in-flight", 128, "max_in_flight of the hot user")
	hotCredits := fs.Int64("hot-allowance-credits", 100_000_000, "daily allowance of the hot user, credits")
	drainCredits := fs.Int64("drain-allowance-credits", 100, "daily allowance of the drain user (balance check), credits")
	out := fs.String("out", "keys.json", "where to write the keys")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	db, err := holds.Open(ctx, *dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	cfg := config.Default()
	st := holds.NewStore(db, plans.FromConfig(cfg), cfg.DefaultPlan, zap.NewNop())
	tag := time.Now().UTC().Format("150405")
	mk := func(name string) (uint64, string, error) {
		u, err := st.CreateUser(ctx, name, "")
		if err != nil {
			return 0, "", err
		}
		k, err := st.CreateKey(ctx, u.ID)
		return u.ID, k, err
	}
	keys := Keys{Users: make([]string, *n), HotMaxInFlight: *hotInFlight,
		UserAllowanceMicro: cfg.Plans[cfg.DefaultPlan].AllowanceCredits.MicroAt(cfg.CreditMicro)}
	var wg sync.WaitGroup
	errc := make(chan error, *n)
	sem := make(chan struct{}, 16)
	for i := range *n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, k, err := mk(fmt.Sprintf("bench-%s-u%04d", tag, i))
			if err != nil {
				errc <- err
				return
			}
			keys.Users[i] = k
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return err
	}
	hotMicro := *hotCredits * cfg.CreditMicro
	if keys.HotID, keys.Hot, err = mk("bench-" + tag + "-hot"); err != nil {
		return err
	}
	if err := st.SetUserLimits(ctx, keys.HotID, &hotMicro, hotInFlight, nil); err != nil {
		return err
	}
	keys.HotAllowanceMicro = hotMicro
	drainMicro := *drainCredits * cfg.CreditMicro
	if keys.DrainID, keys.Drain, err = mk("bench-" + tag + "-drain"); err != nil {
		return err
	}
	if err := st.SetUserLimits(ctx, keys.DrainID, &drainMicro, hotInFlight, nil); err != nil {
		return err
	}
	keys.DrainAllowance = drainMicro
	b, _ := json.MarshalIndent(keys, "", " ")
	if err := os.WriteFile(*out, b, 0o600); err != nil {
		return err
	}
	fmt.Printf("setup: %d users, hot user %d (max_in_flight %d), drain user %d (allowance %d micro) -> %s\n",
		*n, keys.HotID, *hotInFlight, keys.DrainID, drainMicro, *out)
	return nil
}

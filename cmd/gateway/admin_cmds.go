package main

// The operator's subcommands: the same operations as the admin API (package admin), for an
// operator with database access and no admin token, or a script. They print what the API
// answers (JSON, credits as exact decimals), through the same admin.Views.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/pricing"
)

// adminUsage lists the subcommands of this file, for the usage text.
const adminUsage = `  user list      [-after NAME] [-limit 100]
  user show      -name NAME
  user set       -name NAME [-plan P] [-allowance CREDITS|none] [-max-in-flight N|none] [-discount-bp BP|none]
  user disable   -name NAME   (refused from the next admission; calls in flight finish)
  user enable    -name NAME
  key list       -user NAME [-after KEY_ID] [-limit 100]   (newest first; prefixes, never keys)
  key revoke     -key KEY | -user NAME -prefix PREFIX
  grant          -user NAME -amount CREDITS -key IDEMPOTENCY_KEY [-reason TEXT]
                 (negative amount = refund; the same -key again prints the original grant)
  balance        -user NAME
  runs           [-user NAME] [-state queued|running|settled] [-since T] [-until T]
                 [-settled-since T] [-settled-until T] [-after CURSOR] [-limit 100]
  report         [-from YYYY-MM-DD] [-to YYYY-MM-DD] [-user NAME] [-format csv|json]
  instances      [-after ID] [-limit 100]   (gateway processes, newest first: alive, silent, dead, retired)
  prune          -days N [-batch 1000]   (delete runs settled more than N >= 7 days ago, past the
                 longest tally_ttl and replay_ttl the gateways recorded; their sums are kept, so
                 reports' totals, audit and balances read the same; a user's day keeps at most
                 100 models by name, the rest summed under an empty model)
                 (user list, key list, runs and instances print a page as the API answers it: has_more,
                 and last_id, to pass as -after for the next page; -limit at most 1000)
`

func userList(ctx context.Context, args []string) error {
	return listPage(ctx, "user list", "users", "list users whose name sorts after this (the last_id of the previous page)",
		args, (*holds.Store).ListUsers, admin.Views.User, func(u holds.UserDetail) any { return u.Name })
}

// instancesCmd lists the gateway processes' rows, newest start first, a page at a time, as
// GET /admin/instances does.
func instancesCmd(ctx context.Context, args []string) error {
	return listPage(ctx, "instances", "processes", "list the processes after this id (the last_id of the previous page)",
		args, (*holds.Store).ListInstances, admin.Views.Instance, func(in holds.InstanceRow) any { return in.ID })
}

// keyList lists a user's keys, newest first, a page at a time: the prefixes `key revoke
// -prefix` takes, never the keys.
func keyList(ctx context.Context, args []string) error {
	var user string
	var after uint64
	var limit int
	e, st, v, err := adminEnv(ctx, "key list", args, func(fs *flag.FlagSet) {
		fs.StringVar(&user, "user", "", "user name")
		fs.Uint64Var(&after, "after", 0, "list the keys after this key id (the last_id of the previous page)")
		fs.IntVar(&limit, "limit", 100, fmt.Sprintf("at most this many keys (1-%d)", admin.MaxListLimit))
	})
	if err != nil {
		return err
	}
	defer e.Close()
	if err := limitFlag(limit); err != nil {
		return err
	}
	d, err := namedUser(ctx, st, "user", user)
	if err != nil {
		return err
	}
	keys, err := st.ListKeys(ctx, d.ID, after, limit+1)
	if err != nil {
		return ofUser(d, err)
	}
	return printJSON(admin.List(keys, limit, v.Key, func(k holds.KeyInfo) any { return k.ID }))
}

func userShow(ctx context.Context, args []string) error {
	return perUser(ctx, "user show", args, "name", nil, func(_ *env, _ *holds.Store, v admin.Views, d holds.UserDetail) error {
		return printJSON(v.User(d))
	})
}

// userSet changes a plan and per-user overrides, together or not at all (holds.ChangeUser);
// they apply from the next admission. "none" drops an override: the plan's figure applies.
func userSet(ctx context.Context, args []string) error {
	var plan, allowance, maxInFlight, discountBP string
	return perUser(ctx, "user set", args, "name", func(fs *flag.FlagSet) {
		fs.StringVar(&plan, "plan", "", "move the user to this plan")
		fs.StringVar(&allowance, "allowance", "", "daily allowance override, in credits (none: the plan's)")
		fs.StringVar(&maxInFlight, "max-in-flight", "", "calls in flight override (none: the plan's)")
		fs.StringVar(&discountBP, "discount-bp", "", "discount override, in basis points 0-10000 (none: the plan's)")
	}, func(e *env, st *holds.Store, v admin.Views, d holds.UserDetail) error {
		c := holds.UserChange{Plan: plan}
		var err error
		if c.Allowance, err = optOverride("allowance", allowance, func(s string) (int64, bool) {
			m, err := pricing.ParseCredits(s, e.cfg.CreditMicro)
			return m, err == nil && m >= 0
		}, "a non-negative number of credits in steps of "+pricing.FormatCredits(1, e.cfg.CreditMicro)); err != nil {
			if _, perr := pricing.ParseCredits(allowance, e.cfg.CreditMicro); perr != nil {
				// What is wrong with it, when the wanted form does not say (too large: it was
				// one).
				return fmt.Errorf("%w (%v)", err, perr)
			}
			return err
		}
		if c.MaxInFlight, err = optOverride("max-in-flight", maxInFlight, intIn(1, 10_000), "an integer 1-10000"); err != nil {
			return err
		}
		if c.DiscountBP, err = optOverride("discount-bp", discountBP, intIn(0, 10_000), "an integer 0-10000"); err != nil {
			return err
		}
		if c == (holds.UserChange{}) {
			return errors.New("nothing to set: give -plan, -allowance, -max-in-flight or -discount-bp")
		}
		if err := st.ChangeUser(ctx, d.ID, c); err != nil {
			if errors.Is(err, holds.ErrUnknownPlan) {
				return ofUser(d, fmt.Errorf("%w (configured: %v)", err, st.PlanNames()))
			}
			return ofUser(d, err)
		}
		if d, err = st.UserDetail(ctx, d.Name); err != nil {
			return err
		}
		return printJSON(v.User(d))
	})
}

// optOverride reads an override flag: "" leaves it, "none" drops it, else parse must accept it.
func optOverride[T any](name, s string, parse func(string) (T, bool), want string) (holds.Override[T], error) {
	switch s {
	case "":
		return holds.Override[T]{}, nil
	case "none":
		return holds.Override[T]{Clear: true}, nil
	}
	v, ok := parse(s)
	if !ok {
		return holds.Override[T]{}, fmt.Errorf("-%s %q: want %s, or none", name, s, want)
	}
	return holds.SetTo(v), nil
}

// intIn parses an integer in [lo, hi].
func intIn(lo, hi int) func(string) (int, bool) {
	return func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && n >= lo && n <= hi
	}
}

func userDisable(ctx context.Context, args []string) error {
	return userSetDisabled(ctx, "user disable", args, true)
}
func userEnable(ctx context.Context, args []string) error {
	return userSetDisabled(ctx, "user enable", args, false)
}

// userSetDisabled is user disable (disable) and user enable; changed says whether the user
// was not so before.
func userSetDisabled(ctx context.Context, cmd string, args []string, disable bool) error {
	return perUser(ctx, cmd, args, "name", nil, func(_ *env, st *holds.Store, _ admin.Views, d holds.UserDetail) error {
		op := st.EnableUser
		if disable {
			op = st.DisableUser
		}
		changed, err := op(ctx, d.ID)
		if err != nil {
			return ofUser(d, err)
		}
		if d, err = st.UserDetail(ctx, d.Name); err != nil {
			return err
		}
		// No credits and no plan terms: run with any config (convertsCredits), it shows none it
		// could have read wrong.
		out := map[string]any{"object": "user", "id": d.ID, "name": d.Name, "plan": d.Plan, "disabled": d.DisabledAt != nil,
			"changed": changed}
		if d.DisabledAt != nil {
			out["disabled_at"] = *d.DisabledAt
		}
		return printJSON(out)
	})
}

func keyRevoke(ctx context.Context, args []string) error {
	var key, user, prefix string
	e, st, _, err := adminEnv(ctx, "key revoke", args, func(fs *flag.FlagSet) {
		fs.StringVar(&key, "key", "", "the key to revoke, in full")
		fs.StringVar(&user, "user", "", "with -prefix: the user whose keys to revoke")
		fs.StringVar(&prefix, "prefix", "", "with -user: revoke the user's live keys with this prefix (as gateway key list lists them)")
	})
	if err != nil {
		return err
	}
	defer e.Close()
	switch {
	case key != "" && user == "" && prefix == "":
		if _, err := st.RevokeAPIKey(ctx, key); err != nil {
			return err
		}
		fmt.Printf("revoked key %s\n", holds.ShownPrefix(key))
	case key == "" && user != "" && prefix != "":
		d, err := st.UserDetail(ctx, user)
		if err != nil {
			return err
		}
		n, err := st.RevokeKeysByPrefix(ctx, d.ID, prefix)
		if err != nil {
			return ofUser(d, err)
		}
		fmt.Printf("revoked %d key(s) of %s with prefix %s\n", n, user, prefix)
	default:
		return errors.New("give either -key KEY, or -user NAME and -prefix PREFIX")
	}
	return nil
}

// grantCmd credits prepaid credits once per -key: running it again (a retried script) prints
// the original grant and credits nothing.
func grantCmd(ctx context.Context, args []string) error {
	var user, amount, key, reason string
	e, st, v, err := adminEnv(ctx, "grant", args, func(fs *flag.FlagSet) {
		fs.StringVar(&user, "user", "", "user name")
		fs.StringVar(&amount, "amount", "", "credits, decimal; negative for a refund")
		fs.StringVar(&key, "key", "", "idempotency key (a payment id, a ticket number): the same key credits once")
		fs.StringVar(&reason, "reason", "", "note kept with the grant")
	})
	if err != nil {
		return err
	}
	defer e.Close()
	for _, f := range [][2]string{{"user", user}, {"amount", amount}, {"key", key}} {
		if err := need(f[0], f[1]); err != nil {
			return err
		}
	}
	micro, err := pricing.ParseCredits(amount, e.cfg.CreditMicro)
	if err != nil {
		return fmt.Errorf("-amount: %w", err)
	}
	d, err := st.UserDetail(ctx, user)
	if err != nil {
		return err
	}
	g, created, err := st.Grant(ctx, holds.GrantRequest{UserID: d.ID, AmountMicro: micro, IdempotencyKey: key, Reason: reason})
	var below *holds.GrantBelowZeroError
	if errors.As(err, &below) {
		// The store's figures are micro-USD; the operator typed credits.
		return fmt.Errorf("grant %q to %s: %w", key, d.Name, credited{below, v.GrantBelowZero(below)})
	}
	if err != nil {
		return ofUser(d, err)
	}
	if !created {
		fmt.Fprintln(os.Stderr, "gateway: this key was granted before; nothing was credited now")
	}
	return printJSON(v.Grant(d.Name, g, !created))
}

func balanceCmd(ctx context.Context, args []string) error {
	return perUser(ctx, "balance", args, "user", nil, func(_ *env, st *holds.Store, v admin.Views, d holds.UserDetail) error {
		b, err := st.Balance(ctx, d.ID)
		if err != nil {
			return ofUser(d, err)
		}
		return printJSON(v.Balance(d, b))
	})
}

func runsCmd(ctx context.Context, args []string) error {
	var user, state, since, until, settledSince, settledUntil, after string
	var limit int
	e, st, v, err := adminEnv(ctx, "runs", args, func(fs *flag.FlagSet) {
		fs.StringVar(&after, "after", "", "only runs listed after this cursor: the last_id of the previous page (or, as before, its last run's id)")
		fs.StringVar(&user, "user", "", "only this user's runs")
		fs.StringVar(&state, "state", "", "queued, running or settled")
		fs.StringVar(&since, "since", "", "created at or after (RFC 3339 or YYYY-MM-DD, UTC)")
		fs.StringVar(&until, "until", "", "created before (RFC 3339 or YYYY-MM-DD, UTC)")
		fs.StringVar(&settledSince, "settled-since", "", "settled at or after (RFC 3339 or YYYY-MM-DD, UTC): settled runs, by settlement")
		fs.StringVar(&settledUntil, "settled-until", "", "settled before (RFC 3339 or YYYY-MM-DD, UTC): settled runs, by settlement")
		fs.IntVar(&limit, "limit", 100, fmt.Sprintf("at most this many runs, newest first (1-%d)", admin.MaxListLimit))
	})
	if err != nil {
		return err
	}
	defer e.Close()
	if err := limitFlag(limit); err != nil {
		return err
	}
	// One more than asked for: whether it comes is has_more.
	f := holds.RunFilter{State: holds.State(state), Limit: limit + 1, After: after}
	if f.Since, err = parseWhen("since", since); err != nil {
		return err
	}
	if f.Until, err = parseWhen("until", until); err != nil {
		return err
	}
	if f.SettledSince, err = parseWhen("settled-since", settledSince); err != nil {
		return err
	}
	if f.SettledUntil, err = parseWhen("settled-until", settledUntil); err != nil {
		return err
	}
	if f.UserID, err = userFilter(ctx, st, user); err != nil {
		return err
	}
	runs, err := st.ListRuns(ctx, f)
	if err != nil {
		return err
	}
	return printJSON(admin.List(runs, limit, v.Run, func(r holds.UserRun) any { return f.Cursor(r.Run) }))
}

func parseWhen(name, s string) (time.Time, error) {
	t, err := admin.ParseTime(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("-%s: %w", name, err)
	}
	return t, nil
}

// dayFlag reads a -from/-to day; "" is def.
func dayFlag(name, s string, def time.Time) (time.Time, error) {
	if s == "" {
		return def, nil
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("-%s %q: want YYYY-MM-DD", name, s)
	}
	return t, nil
}

// reportCmd prints the usage report by user, UTC day of settlement and model: CSV by
// default (for a spreadsheet), JSON with totals and the day ledger with -format json.
func reportCmd(ctx context.Context, args []string) error {
	var from, to, user, format string
	e, st, v, err := adminEnv(ctx, "report", args, func(fs *flag.FlagSet) {
		fs.StringVar(&from, "from", "", "first UTC day, YYYY-MM-DD (default: today, by the database's clock)")
		fs.StringVar(&to, "to", "", "last UTC day, YYYY-MM-DD, inclusive (default: today, by the database's clock)")
		fs.StringVar(&user, "user", "", "only this user")
		fs.StringVar(&format, "format", "csv", "csv or json")
	})
	if err != nil {
		return err
	}
	defer e.Close()
	if format != "csv" && format != "json" {
		return fmt.Errorf("-format %q: want csv or json", format)
	}
	// Today is the ledger's: the database's UTC day, not this machine's.
	var today time.Time
	if from == "" || to == "" {
		if today, err = st.Today(ctx); err != nil {
			return err
		}
	}
	fromT, err := dayFlag("from", from, today)
	if err != nil {
		return err
	}
	toT, err := dayFlag("to", to, today)
	if err != nil {
		return err
	}
	userID, err := userFilter(ctx, st, user)
	if err != nil {
		return err
	}
	rep, err := st.Usage(ctx, fromT, toT, userID)
	if err != nil {
		return err
	}
	if rep.LedgerMicro != rep.Totals.ChargedMicro {
		fmt.Fprintf(os.Stderr, "gateway: warning: report charged %s credits but the day ledger says %s\n",
			v.Credits(rep.Totals.ChargedMicro), v.Credits(rep.LedgerMicro))
	}
	if format == "json" {
		return printJSON(v.Report(rep))
	}
	return v.WriteReportCSV(os.Stdout, rep)
}

// pruneCmd deletes settled runs older than -days (see holds.PruneSettled): the usage report,
// the audit and the balances read the same after. The cutoff must also pass dedup.replay_ttl,
// during which an Idempotency-Key replay reads the run its attempt settled, and
// holds.tally_ttl, during which the run's tally stays in Redis under its id: a named run's id
// is its user and X-Run-Id, so a pruned run named again is a new run under the same id, whose
// budget and settlement would count a tally still there, charging the pruned run's calls again.
func pruneCmd(ctx context.Context, args []string) error {
	var days, batch int
	e, st, _, err := adminEnv(ctx, "prune", args, func(fs *flag.FlagSet) {
		fs.IntVar(&days, "days", 0, "delete runs settled more than this many days ago (at least 7)")
		fs.IntVar(&batch, "batch", 1000, "runs per transaction (1 to 10000)")
	})
	if err != nil {
		return err
	}
	defer e.Close()
	// The upper bound keeps the age a Duration can hold (a larger one wrapped below 7 days).
	const maxDays = 100 * 366
	if days < int(holds.MinPruneAge/(24*time.Hour)) || days > maxDays {
		return fmt.Errorf("-days %d: %w: at least %d, at most %d", days, holds.ErrBadFilter, holds.MinPruneAge/(24*time.Hour), maxDays)
	}
	if batch < 1 || batch > holds.MaxPruneBatch {
		// Here, not from the store: its refusal came with "run it again to go on", which
		// failed the same way.
		return fmt.Errorf("-batch %d: %w: 1 to %d", batch, holds.ErrBadFilter, holds.MaxPruneBatch)
	}
	age := time.Duration(days) * 24 * time.Hour
	if age <= e.cfg.Dedup.ReplayTTL {
		return fmt.Errorf("-days %d: %w: must pass dedup.replay_ttl (%v), while an Idempotency-Key replay reads its run",
			days, holds.ErrBadFilter, e.cfg.Dedup.ReplayTTL)
	}
	if age <= e.cfg.Holds.TallyTTL {
		return fmt.Errorf("-days %d: %w: must pass holds.tally_ttl (%v), while a run's tally is in Redis: a pruned run's id "+
			"opened again (its X-Run-Id sent again) would count that tally as its own", days, holds.ErrBadFilter, e.cfg.Holds.TallyTTL)
	}
	if err := pastTheFleetsTTLs(ctx, st, days, age); err != nil {
		return err
	}
	res, err := st.PruneSettled(ctx, age, batch)
	if err != nil {
		// Each batch commits whole: what was pruned stays pruned, and a rerun goes on.
		return fmt.Errorf("%w (%d runs pruned in %d batches before it; run it again to go on)", err, res.Runs, res.Batches)
	}
	fmt.Printf("pruned %d settled runs older than %d days in %d batches\n", res.Runs, days, res.Batches)
	return nil
}

// pastTheFleetsTTLs refuses a prune cutoff (age, of -days days) within the longest
// holds.tally_ttl or dedup.replay_ttl any of the fleet's gateways has served with, as they
// recorded them (holds.LongestTTL): the command's own config checked only its own, and run
// without the gateways' (the defaults, 48 h and 24 h) beside gateways keeping tallies 10 days,
// `prune -days 8` deleted runs whose tallies a run's id sent again would count. Nothing recorded
// (no gateway of this version has served the database) is refused too: how long the fleet's
// Redis keeps them is unknown.
func pastTheFleetsTTLs(ctx context.Context, st *holds.Store, days int, age time.Duration) error {
	tally, replay, err := st.LongestTTLs(ctx)
	if errors.Is(err, holds.ErrNoLongestTTLs) {
		return fmt.Errorf("prune refused: %w, so how long the gateways' Redis keeps a run's tally or an Idempotency-Key's record is unknown; "+
			"start the gateway (`gateway serve -config FILE`: it records its holds.tally_ttl and dedup.replay_ttl), then run this again; nothing was done", err)
	}
	if err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	for _, b := range []struct {
		setting, why string
		ttl          holds.LongestTTL
	}{
		{"holds.tally_ttl", "a run's tally is in Redis: a pruned run's id opened again would count that tally as its own", tally},
		{"dedup.replay_ttl", "an Idempotency-Key replay reads its run", replay},
	} {
		if age <= b.ttl.TTL {
			return fmt.Errorf("-days %d: %w: must pass the fleet's longest %s %v, recorded by gateway %s at %s, while %s",
				days, holds.ErrBadFilter, b.setting, b.ttl.TTL, b.ttl.SetBy, b.ttl.SetAt.UTC().Format(time.RFC3339), b.why)
		}
	}
	return nil
}

// adminEnv is setup plus the store and the views every admin subcommand uses.
func adminEnv(ctx context.Context, name string, args []string, extra func(*flag.FlagSet)) (*env, *holds.Store, admin.Views, error) {
	e, err := setup(ctx, name, args, false, extra)
	if err != nil {
		return nil, nil, admin.Views{}, err
	}
	e.log = e.log.With(zap.String("command", name))
	return e, e.store(), admin.Views{CreditMicro: e.cfg.CreditMicro}, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("print: %w", err)
	}
	return nil
}

func need(flagName, value string) error {
	if value == "" {
		return fmt.Errorf("-%s is required", flagName)
	}
	return nil
}

// perUser runs a subcommand about one user, whom the required -flagName names (user show,
// set, enable and disable, balance): adminEnv with that flag and extra's, then the user
// looked up (namedUser), then run with both; the env is closed after. An unknown name is
// refused before run, naming the name as typed.
func perUser(ctx context.Context, cmd string, args []string, flagName string, extra func(*flag.FlagSet),
	run func(e *env, st *holds.Store, v admin.Views, d holds.UserDetail) error,
) error {
	var name string
	e, st, v, err := adminEnv(ctx, cmd, args, func(fs *flag.FlagSet) {
		fs.StringVar(&name, flagName, "", "user name")
		if extra != nil {
			extra(fs)
		}
	})
	if err != nil {
		return err
	}
	defer e.Close()
	d, err := namedUser(ctx, st, flagName, name)
	if err != nil {
		return err
	}
	return run(e, st, v, d)
}

// namedUser is the user a required -flag names (holds.ErrUnknownUser, with the name, if none).
func namedUser(ctx context.Context, st *holds.Store, flagName, name string) (holds.UserDetail, error) {
	if err := need(flagName, name); err != nil {
		return holds.UserDetail{}, err
	}
	return st.UserDetail(ctx, name)
}

// userFilter is the id of the user an optional -user names, for a listing or report of that
// user's alone; 0, every user's, when none is named.
func userFilter(ctx context.Context, st *holds.Store, name string) (uint64, error) {
	if name == "" {
		return 0, nil
	}
	d, err := st.UserDetail(ctx, name)
	if err != nil {
		return 0, err
	}
	return d.ID, nil
}

// ofUser names the user an operator typed on an error of the store's, which names users by
// their id ("revoke keys of user 42: ...": a number the operator never typed nor sees).
func ofUser(d holds.UserDetail, err error) error {
	return fmt.Errorf("user %s: %w", d.Name, err)
}

// limitFlag checks a listing's -limit against the API's bound.
func limitFlag(limit int) error {
	if limit < 1 || limit > admin.MaxListLimit {
		return fmt.Errorf("-limit %d: want 1-%d", limit, admin.MaxListLimit)
	}
	return nil
}

// listPage runs a listing whose cursor is a string, a page at a time as the admin API's list
// endpoints answer: it reads one row more than -limit so the page can say has_more.
func listPage[T any](ctx context.Context, cmd, noun, afterUsage string, args []string,
	read func(*holds.Store, context.Context, string, int) ([]T, error),
	view func(admin.Views, T) map[string]any, cursor func(T) any,
) error {
	var after string
	var limit int
	e, st, v, err := adminEnv(ctx, cmd, args, func(fs *flag.FlagSet) {
		fs.StringVar(&after, "after", "", afterUsage)
		fs.IntVar(&limit, "limit", 100, fmt.Sprintf("at most this many %s (1-%d)", noun, admin.MaxListLimit))
	})
	if err != nil {
		return err
	}
	defer e.Close()
	if err := limitFlag(limit); err != nil {
		return err
	}
	rows, err := read(st, ctx, after, limit+1)
	if err != nil {
		return err
	}
	return printJSON(admin.List(rows, limit, func(r T) map[string]any { return view(v, r) }, cursor))
}

// credited is a store refusal reworded in credits for the operator, still matching its
// sentinel (errors.Is).
type credited struct {
	err error
	msg string
}

func (c credited) Error() string { return c.msg }
func (c credited) Unwrap() error { return c.err }

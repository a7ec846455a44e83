// Command gateway is tollgate: `gateway serve` runs the metered proxy; the other subcommands
// are the operator's tools (migrate, reconcile, users, keys, the demo account).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/plans"
	"github.com/tollgate/tollgate/metering/runstate"
	tgsql "github.com/tollgate/tollgate/sql"
)

var usage = `usage: gateway <command> [flags]

commands:
  serve          run the gateway (flags: -config FILE, -pprof ADDR, -migrate: apply missing migrations first,
                 -change-credit-micro: record this config's credit_micro as the fleet's though another is recorded,
                 -change-redis-prefix: likewise its redis_key_prefix)
  migrate        [-lock-wait 2s]   apply missing database migrations (safe to run twice)
  reconcile      settle expired holds once (-once; -force: without the lock) and exit
  user create    -name NAME [-plan P]   (default: the config's default_plan; either one the gateways serve)
  key create     -user NAME   (prints the key once)
  demo-setup     create the demo user and a key; prints KEY=<key>
  audit          check the books: day ledger = Σ settled charges per user and day, and prepaid
                 credits = Σ grants − Σ prepaid parts per user (exit 1 if not)
` + adminUsage + `

Every command reads -config FILE (optional), -debug (verbose logs) and the environment:
MYSQL_DSN, REDIS_URL, REDIS_CLUSTER, UPSTREAM_URL, UPSTREAM_API_KEY, LISTEN_ADDR, ADMIN_TOKEN,
TOLLGATE_INSTANCE, TOLLGATE_REDIS_PREFIX. The commands that convert credits (grant, balance,
report, runs, user show/list/set, reconcile) refuse a config whose credit_micro is not the one
the gateways serve at, and those that use the plans' terms (grant, balance, user show/list/set,
reconcile) one whose plans are not the gateways'; reconcile refuses a redis_key_prefix other
than theirs, and prune a -days within the longest tally_ttl or replay_ttl a gateway served
with: pass them the gateways' -config. user create refuses a -plan the gateways serve no
terms for, and without -plan a config whose default_plan is not theirs. The others (user
disable/enable, key, instances, audit, demo-setup, migrate) run with any config.
`

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h: the flag set has printed its help, which is what was asked for
		}
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// commandFamilies are the commands named in two words, with their second words.
var commandFamilies = map[string]string{
	"user": "create, list, show, set, disable, enable",
	"key":  "create, list, revoke",
}

// shutdownSignals end a command; serve drains on the first and dies on the next. SIGHUP too:
// the terminal or SSH session that ran the command went away. Left to Go's default it killed a
// serving gateway on the spot, its calls charged their whole hold by the reconciler, where
// SIGTERM drains them and charges what they used. A signal the process was started ignoring
// stays ignored (nohup's SIGHUP, a script's background job's SIGINT): Notify would undo that.
// Read before anything asks for a signal, once Notify has, Ignored no longer tells.
// SIGTERM is always among them (and the list is never empty: Notify with none relays every
// signal).
var shutdownSignals = notIgnored(os.Interrupt, syscall.SIGHUP)

// commandTimeout bounds every command but serve and migrate (reconcile -once, reports,
// grants, audit, prune: a prune stopped by it keeps the batches it committed).
const commandTimeout = 10 * time.Minute

func run(args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return errors.New("no command")
	}
	ctx, stop := signal.NotifyContext(context.Background(), shutdownSignals...)
	defer stop()
	cmd, rest := args[0], args[1:]
	if subs, family := commandFamilies[cmd]; family {
		// A forgotten subcommand (`gateway user`, `gateway key -user bob`) is not an unknown
		// command: the README lists the family, so say what it holds.
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
			fmt.Fprint(os.Stderr, usage)
			return fmt.Errorf("%s needs a subcommand: %s", cmd, subs)
		}
		cmd, rest = cmd+" "+rest[0], rest[1:]
	}
	if cmd != "serve" && cmd != "migrate" { // migrate: an index on a large table takes what it takes
		// A one-shot command gives up rather than wait on a database that does not answer:
		// the store retries an unreachable one until its context ends.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, commandTimeout)
		defer cancel()
	}
	switch cmd {
	case "serve":
		return serve(ctx, stop, rest)
	case "migrate":
		return migrate(ctx, rest)
	case "reconcile":
		return reconcileOnce(ctx, rest)
	case "user create":
		return userCreate(ctx, rest)
	case "key create":
		return keyCreate(ctx, rest)
	case "demo-setup":
		return demoSetup(ctx, rest)
	case "user list":
		return userList(ctx, rest)
	case "user show":
		return userShow(ctx, rest)
	case "user set":
		return userSet(ctx, rest)
	case "user disable":
		return userDisable(ctx, rest)
	case "user enable":
		return userEnable(ctx, rest)
	case "key list":
		return keyList(ctx, rest)
	case "key revoke":
		return keyRevoke(ctx, rest)
	case "grant":
		return grantCmd(ctx, rest)
	case "balance":
		return balanceCmd(ctx, rest)
	case "runs":
		return runsCmd(ctx, rest)
	case "report":
		return reportCmd(ctx, rest)
	case "audit":
		return auditCmd(ctx, rest)
	case "prune":
		return pruneCmd(ctx, rest)
	case "instances":
		return instancesCmd(ctx, rest)
	case "help", "-h", "--help":
		fmt.Print(usage)
		return nil
	}
	fmt.Fprint(os.Stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}

func notIgnored(sigs ...os.Signal) []os.Signal {
	out := []os.Signal{syscall.SIGTERM}
	for _, s := range sigs {
		if !signal.Ignored(s) {
			out = append(out, s)
		}
	}
	return out
}

// env is what every command shares: config, logger, database and Redis.
type env struct {
	cfg *config.Config
	log *zap.Logger
	db  *sqlx.DB
	rdb redis.UniversalClient // a *redis.ClusterClient with redis_cluster

	// root is log without its instance field, for runAs to name another.
	root *zap.Logger
}

func (e *env) Close() {
	if e.db != nil {
		e.db.Close()
	}
	if e.rdb != nil {
		e.rdb.Close()
	}
	_ = e.log.Sync()
}

// runAs names the process instance (cfg.Instance), in what it takes (locks, leases) and in its
// log lines alike: a line must name the process that wrote it. Call it before the logger or
// the config is handed on.
func (e *env) runAs(instance string) {
	e.cfg.Instance = instance
	e.log = e.root.With(zap.String("instance", instance))
}

// store builds the holds store with the configured plans.
func (e *env) store() *holds.Store {
	return holds.NewStore(e.db, plans.FromConfig(e.cfg), e.cfg.DefaultPlan, e.log)
}

// setup parses the common flags and opens what the command needs.
func setup(ctx context.Context, name string, args []string, needRedis bool, extra func(*flag.FlagSet)) (*env, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	cfgPath := fs.String("config", "", "YAML config file (optional)")
	debug := fs.Bool("debug", false, "debug logging")
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	// Every value is a flag, and parsing stops at the first word that is not one: a stray word
	// (`user create alice`) would leave -name empty, and drop every flag after it unread.
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%s: unexpected argument %q: values are given as flags (-name NAME, -user NAME, …; gateway help lists them)", name, fs.Arg(0))
	}
	load := config.Load
	if !needRedis {
		load = config.LoadWithoutRedis
	}
	cfg, err := load(*cfgPath)
	if err != nil {
		return nil, err
	}
	log := newLogger(*debug, zapcore.Lock(os.Stderr))
	routeLibraryLogs(log)
	e := &env{cfg: cfg, root: log}
	e.runAs(cfg.Instance)
	open := holds.Open
	if name == "audit" || name == "report" {
		// They group every settled hold before their first row: no read timeout, the
		// command's own bounds them (commandTimeout, Ctrl-C).
		open = holds.OpenForReports
	}
	if e.db, err = open(ctx, cfg.MySQLDSN); err != nil {
		e.Close()
		return nil, err
	}
	if !migratesItsOwnSchema[name] {
		// A binary's statements name the columns of its own schema: on one behind it, a command
		// failed at its first statement on a missing column ("Unknown column …"), saying nothing
		// of the migration skipped, and one whose statements happened to fit wrote.
		if err := schemaCurrent(ctx, e.db); err != nil {
			e.Close()
			return nil, err
		}
	}
	if err := agreesWithTheFleet(ctx, e, name); err != nil {
		e.Close()
		return nil, err
	}
	if needRedis {
		rdb, addr, err := newRedisClient(cfg.RedisURL, cfg.RedisCluster)
		if err != nil {
			e.Close()
			return nil, err
		}
		e.rdb = rdb
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := e.rdb.Ping(pctx).Err(); err != nil {
			e.Close()
			return nil, fmt.Errorf("redis %s: %w", addr, err)
		}
		if err := checkRedisKeepsKeys(pctx, e.rdb, cfg.RedisAllowEviction, e.log); err != nil {
			e.Close()
			return nil, fmt.Errorf("redis %s: %w", addr, err)
		}
	}
	return e, nil
}

// migratesItsOwnSchema are the commands that bring the schema up to date themselves (serve
// -migrate, demo-setup) or are how it is done; serve checks it after its -migrate.
var migratesItsOwnSchema = map[string]bool{"serve": true, "migrate": true, "demo-setup": true}

// schemaCurrent refuses a schema behind this binary, naming what it lacks and the command
// that applies it.
func schemaCurrent(ctx context.Context, db *sqlx.DB) error {
	pending, err := tgsql.Pending(ctx, db.DB)
	if err != nil {
		return fmt.Errorf("check schema: %w", err)
	}
	if len(pending) > 0 {
		return fmt.Errorf("the database schema is behind this gateway (%s not applied): run `gateway migrate` first", strings.Join(pending, ", "))
	}
	return nil
}

// convertsCredits are the operator's commands that read or write amounts in credits (or split
// a charge by a plan's allowance, which the config gives in credits): each converts at its
// config's credit_micro, and refuses one other than the fleet's (creditUnitIsTheFleets). The
// others (key, instances, prune, audit, user create, user disable|enable) show no credits and
// run with any credit_micro: disabling a user is what an operator may need at once, mid-upgrade or
// mid-rollout of new plans, when nothing or something else is recorded.
var convertsCredits = map[string]bool{
	"user list": true, "user show": true, "user set": true,
	"grant": true, "balance": true, "runs": true, "report": true, "reconcile": true,
}

// usesPlanTerms are the operator's commands that compute or move money by the plans' terms
// (a charge split by the allowance, a refund bounded by it, a balance or a user's effective
// terms shown): each takes them from its config, and refuses plans other than the fleet's
// (planTermsAreTheFleets). runs and report read what was charged, and use no plan terms.
var usesPlanTerms = map[string]bool{
	"user list": true, "user show": true, "user set": true,
	"grant": true, "balance": true, "reconcile": true,
}

// readsFleetRedis are the operator's commands that read the serving gateways' Redis keys (a
// run's tally and lease, the reconcile lock): each names them by its config's
// redis_key_prefix, and refuses one other than the fleet's (redisPrefixIsTheFleets).
var readsFleetRedis = map[string]bool{"reconcile": true}

// agreesWithTheFleet refuses to run command with a config whose credit_micro, plans or Redis
// key prefix, where command uses them, are not those the fleet's gateways recorded.
func agreesWithTheFleet(ctx context.Context, e *env, command string) error {
	if convertsCredits[command] {
		if err := creditUnitIsTheFleets(ctx, e, command); err != nil {
			return err
		}
	}
	if readsFleetRedis[command] {
		if err := redisPrefixIsTheFleets(ctx, e, command); err != nil {
			return err
		}
	}
	if usesPlanTerms[command] {
		return planTermsAreTheFleets(ctx, e, command)
	}
	return nil
}

// creditUnitIsTheFleets refuses to run command with a credit_micro other than the one the
// fleet's gateways serve at, as `gateway serve` recorded it (holds.CreditUnit): run without the
// fleet's -config, or with a stale one, a grant of 5 credits at the default 1000 was 5000
// micro-USD, half a credit of a fleet serving at 10000, and every figure shown was off by as
// much, with nothing to tell. Nothing recorded (no gateway of this version has served the
// database: a fresh one, or one just migrated with the old gateways still serving) is refused
// too: the command cannot know what a credit is worth there.
func creditUnitIsTheFleets(ctx context.Context, e *env, command string) error {
	err := e.store().CheckCreditUnit(ctx, e.cfg.CreditMicro)
	var mismatch *holds.CreditUnitMismatchError
	differs := errors.As(err, &mismatch)
	if differs {
		err = fmt.Errorf("%w: it would convert credits at %d micro-USD each, not the fleet's %d", err, mismatch.Config, mismatch.Recorded.CreditMicro)
	}
	return notTheFleets(command, err, differs, holds.ErrNoCreditUnit, "what a credit is worth there", "the credit_micro it serves at")
}

// planTermsAreTheFleets refuses to run command with plans whose terms are not those the
// fleet's gateways serve by, as the last one started recorded them (holds.PlanTerms): with a
// copy of the config that fell behind, `reconcile -once` split charges between the day's
// allowance and prepaid credits by another allowance than the gateways, and `balance` showed
// it, with nothing to tell. Nothing recorded is refused too, as by creditUnitIsTheFleets.
func planTermsAreTheFleets(ctx context.Context, e *env, command string) error {
	err := e.store().CheckPlanTerms(ctx)
	var mismatch *holds.PlanTermsMismatchError
	differs := errors.As(err, &mismatch)
	if differs {
		err = fmt.Errorf("%w: it would reckon allowances, holds and charges by other plan terms than the gateways'", err)
	}
	return notTheFleets(command, err, differs, holds.ErrNoPlanTerms, "by which plan terms the fleet charges", "the plan terms it serves by")
}

// redisPrefixIsTheFleets refuses to run command with a redis_key_prefix other than the one the
// fleet's gateways name their Redis keys under, as `gateway serve` recorded it
// (holds.RedisPrefix): run without the gateways' TOLLGATE_REDIS_PREFIX, `reconcile -once`
// found none of their leases and tallies, and charged live calls, and tallied ones, their whole
// holds. Nothing recorded is refused too, as by creditUnitIsTheFleets.
func redisPrefixIsTheFleets(ctx context.Context, e *env, command string) error {
	err := e.store().CheckRedisPrefix(ctx, e.cfg.RedisKeyPrefix)
	var mismatch *holds.RedisPrefixMismatchError
	differs := errors.As(err, &mismatch)
	if differs {
		err = fmt.Errorf("%w: it would find none of the gateways' leases and tallies, and charge their calls their whole holds", err)
	}
	return notTheFleets(command, err, differs, holds.ErrNoRedisPrefix, "under which prefix the gateways' Redis keys are", "the prefix it serves under")
}

// notTheFleets words the refusal of command when the store's check of a setting the fleet's
// gateways record (err) fails: its config's differs (differs), nothing is recorded (none:
// unknown is then not known, and records is what serve records), or the record is unreadable.
func notTheFleets(command string, err error, differs bool, none error, unknown, records string) error {
	switch {
	case err == nil:
		return nil
	case differs:
		return fmt.Errorf("%s refused: %w; pass the fleet's config (-config FILE) and run it again; nothing was done", command, err)
	case errors.Is(err, none):
		return fmt.Errorf("%s refused: %w, so %s is unknown; start the gateway "+
			"(`gateway serve -config FILE`: it records %s), then run this with the same -config; "+
			"nothing was done", command, err, unknown, records)
	}
	return fmt.Errorf("%s: %w", command, err)
}

func migrate(ctx context.Context, args []string) error {
	lockWait := tgsql.DefaultLockWait
	e, err := setup(ctx, "migrate", args, false, func(fs *flag.FlagSet) {
		fs.Func("lock-wait", fmt.Sprintf("how long each schema change waits for a table in use, a `duration` in whole seconds (default %v); "+
			"the serving gateways' statements on that table queue behind the wait", tgsql.DefaultLockWait), func(v string) error {
			d, err := time.ParseDuration(v)
			if err != nil {
				return err
			}
			if d < time.Second || d%time.Second != 0 {
				// The server's lock_wait_timeout counts whole seconds: 1500ms was quietly 1 s.
				return fmt.Errorf("%v: give whole seconds, at least 1s", d)
			}
			lockWait = d
			return nil
		})
	})
	if err != nil {
		return err
	}
	defer e.Close()
	done, err := applyMigrations(ctx, e, lockWait)
	for _, name := range done {
		fmt.Println("applied", name)
	}
	if err != nil {
		return err
	}
	if len(done) == 0 {
		fmt.Println("database is up to date")
	}
	return nil
}

// migrateOnStart is `serve -migrate` (DESIGN §1: migrations apply "on start when asked"):
// what `gateway migrate` does, logged, before the schema check that would refuse the start.
func migrateOnStart(ctx context.Context, e *env) error {
	done, err := applyMigrations(ctx, e, tgsql.DefaultLockWait)
	for _, name := range done {
		e.log.Info("migration applied", zap.String("migration", name))
	}
	if err != nil {
		return fmt.Errorf("serve -migrate: %w", err)
	}
	return nil
}

// applyMigrations applies the missing migrations on a handle of its own, without the money
// paths' 30 s read timeout: the DDL of a migration on a large table, or the wait for another
// runner's lock, may take longer.
func applyMigrations(ctx context.Context, e *env, lockWait time.Duration) ([]string, error) {
	db, err := holds.OpenForMigrate(ctx, e.cfg.MySQLDSN)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	return tgsql.MigrateWaiting(ctx, db.DB, lockWait)
}

func userCreate(ctx context.Context, args []string) error {
	var name, plan string
	// adminEnv, as every other account command: its lines (a write retried while the database
	// is read_only) name the command.
	e, st, _, err := adminEnv(ctx, "user create", args, func(fs *flag.FlagSet) {
		fs.StringVar(&name, "name", "", "user name (unique)")
		fs.StringVar(&plan, "plan", "", "plan name (default: the config's default_plan)")
	})
	if err != nil {
		return err
	}
	defer e.Close()
	if plan == "" {
		// The plan is this config's default_plan: beside a fleet whose default_plan is another
		// (the command run without the fleet's -config), a new user would be put on a plan the
		// gateways give no new user, one with a larger allowance perhaps.
		if err := defaultPlanIsTheFleets(ctx, st, e.cfg.DefaultPlan); err != nil {
			return err
		}
	} else if err := planIsTheFleets(ctx, st, plan); err != nil {
		return err
	}
	u, err := st.CreateUser(ctx, name, plan)
	if errors.Is(err, holds.ErrUnknownPlan) {
		// As `user set` and POST /admin/users do: the operator need not open the config.
		return fmt.Errorf("%w (configured: %v)", err, st.PlanNames())
	}
	if err != nil {
		return err
	}
	fmt.Printf("user %d %s (plan %s)\n", u.ID, u.Name, u.Plan)
	return nil
}

// defaultPlanIsTheFleets refuses to create a user on this config's default_plan (user create
// without -plan) when the fleet's gateways recorded another one with their plan terms. Nothing
// recorded (a fresh database) leaves the config's: there is no fleet to differ from.
func defaultPlanIsTheFleets(ctx context.Context, st *holds.Store, configDefault string) error {
	fleetDefault, found, err := st.RecordedDefaultPlan(ctx)
	if err != nil {
		return fmt.Errorf("user create: read the fleet's default_plan: %w", err)
	}
	if found && fleetDefault != configDefault {
		return fmt.Errorf("user create refused: this config's default_plan is %q, the fleet's %q: pass the fleet's config (-config FILE), "+
			"or name the plan (-plan); nothing was done", configDefault, fleetDefault)
	}
	return nil
}

// planIsTheFleets refuses to create a user on plan (user create -plan) when the fleet's gateways
// recorded their plan terms and plan is not among them: looked up in this config alone (one
// with a plan drafted but not rolled out), the user was put on a plan the gateways do not
// serve, and they gave the user default_plan's terms instead, another allowance than the one
// chosen. Nothing recorded (a fresh database) leaves the config's: there is no fleet to differ
// from; a plan this config lacks too is left to CreateUser, whose refusal names this config's.
func planIsTheFleets(ctx context.Context, st *holds.Store, plan string) error {
	if !slices.Contains(st.PlanNames(), plan) {
		return nil
	}
	fleet, found, err := st.FleetPlanTerms(ctx)
	if err != nil {
		return fmt.Errorf("user create: read the fleet's plans: %w", err)
	}
	if _, served := fleet.Terms.Plans[plan]; !found || served {
		return nil
	}
	names := slices.Sorted(maps.Keys(fleet.Terms.Plans))
	return fmt.Errorf("user create refused: plan %q is not one the fleet's gateways serve (%s; recorded by gateway %s), which would give the user "+
		"default_plan %q's terms: name one of those (-plan), or start a gateway with the config that adds it first, then pass that "+
		"config (-config FILE); nothing was done", plan, strings.Join(names, ", "), fleet.SetBy, fleet.Terms.DefaultPlan)
}

func keyCreate(ctx context.Context, args []string) error {
	var name string
	e, st, _, err := adminEnv(ctx, "key create", args, func(fs *flag.FlagSet) {
		fs.StringVar(&name, "user", "", "user name")
	})
	if err != nil {
		return err
	}
	defer e.Close()
	if err := need("user", name); err != nil {
		return err
	}
	u, err := st.UserByName(ctx, name) // its error names the user
	if err != nil {
		return err
	}
	key, err := st.CreateKey(ctx, u.ID)
	if err != nil {
		return err
	}
	fmt.Println(key)
	return nil
}

// demoSetup makes `make run` work on an empty database: a demo user (created once) and a
// fresh key printed as KEY=<key> for the script to pick up.
func demoSetup(ctx context.Context, args []string) error {
	e, err := setup(ctx, "demo-setup", args, false, nil)
	if err != nil {
		return err
	}
	defer e.Close()
	// On a handle of its own, as `gateway migrate`: the money handle's replies time out at
	// 30 s, and another runner's lock or a DDL on a large table may rightly take longer.
	if _, err := applyMigrations(ctx, e, tgsql.DefaultLockWait); err != nil {
		return fmt.Errorf("demo-setup: %w", err)
	}
	st := e.store()
	u, err := st.UserByName(ctx, "demo")
	if errors.Is(err, holds.ErrUnknownUser) {
		u, err = st.CreateUser(ctx, "demo", "")
	}
	if err != nil {
		return err
	}
	key, err := st.CreateKey(ctx, u.ID)
	if err != nil {
		return err
	}
	fmt.Printf("KEY=%s\n", key)
	return nil
}

// auditCmd is `gateway audit`: the books checked against themselves (holds.Audit). It exits
// non-zero when they disagree, so a cron job or a deploy check can alert on it.
func auditCmd(ctx context.Context, args []string) error {
	e, err := setup(ctx, "audit", args, false, nil)
	if err != nil {
		return err
	}
	defer e.Close()
	bad, err := holds.Audit(ctx, e.db)
	if err != nil {
		return err
	}
	for _, m := range bad {
		fmt.Println(m)
	}
	if len(bad) > 0 {
		return fmt.Errorf("audit: %d mismatches", len(bad))
	}
	fmt.Println("audit: the day ledger equals the settled charges, and prepaid credits their grants less their charges")
	return nil
}

// checkRedisKeepsKeys refuses a Redis that may evict the gateway's keys before their TTL
// (runstate.MemoryPolicy says what each key's early loss costs), or whose policy cannot be
// read, unless the operator allowed it: then it is logged and the gateway starts. Checked at
// start, where a misconfigured server is found before it loses anything; a policy changed on
// a running server is the operator's to watch (INFO stats' evicted_keys).
func checkRedisKeepsKeys(ctx context.Context, rdb redis.UniversalClient, allow bool, log *zap.Logger) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		// Each master holds its own slots' keys under its own policy: INFO through the
		// Cluster client reads one node, any.
		return cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			if err := checkRedisKeepsKeys(ctx, node, allow, log.With(zap.String("redis_node", node.Options().Addr))); err != nil {
				return fmt.Errorf("node %s: %w", node.Options().Addr, err)
			}
			return nil
		})
	}
	p, err := runstate.ReadMemoryPolicy(ctx, rdb)
	switch {
	case err != nil && allow:
		log.Warn("cannot read Redis's memory policy; starting because redis_allow_eviction is set", zap.Error(err))
	case err != nil:
		return fmt.Errorf("%w: the gateway checks that Redis never evicts its keys; grant its Redis user INFO, "+
			"or set redis_allow_eviction: true once you have made sure the server never evicts", err)
	case p.MayEvict() && allow:
		log.Warn("Redis may evict keys before their TTL; starting because redis_allow_eviction is set",
			zap.Int64("maxmemory", p.MaxMemory), zap.String("maxmemory_policy", p.Policy))
	case p.MayEvict():
		return fmt.Errorf("maxmemory is %d bytes with maxmemory-policy %s: Redis would evict the gateway's keys "+
			"when full (an Idempotency-Key's record, a run's tally or lease), and retries would be charged again; "+
			"set maxmemory-policy noeviction (writes are then refused when full, which the gateway handles), "+
			"or maxmemory 0, or redis_allow_eviction: true to accept the risk", p.MaxMemory, p.Policy)
	}
	return nil
}

// defaultRedisPoolSize is the gateway's Redis connection pool unless redis_url sets pool_size.
// go-redis's default (10 per CPU: 20 on 2 cores) made calls wait for a connection under load:
// with 256 concurrent calls (make bench, users-256) the duplicate check's one round trip took
// 17.9 ms at p50 with 20 connections and 3.8 ms with 128, and throughput rose by 15 %.
const defaultRedisPoolSize = 128

// newRedisClient opens redis_url: a Cluster client when cluster (redis_cluster: the URL's
// host and its addr= parameters are seed nodes), else a client of the one server. addr names
// it in errors.
func newRedisClient(url string, cluster bool) (rdb redis.UniversalClient, addr string, err error) {
	if !cluster {
		opt, err := redisOptions(url)
		if err != nil {
			return nil, "", err
		}
		return redis.NewClient(opt), opt.Addr, nil
	}
	opt, err := redisClusterOptions(url)
	if err != nil {
		return nil, "", err
	}
	return redis.NewClusterClient(opt), "cluster " + strings.Join(opt.Addrs, ","), nil
}

// redisClusterOptions parses redis_url as a Cluster's (go-redis's ParseClusterURL) and applies
// the gateway's defaults, as redisOptions does: pool_size is then per node.
func redisClusterOptions(url string) (*redis.ClusterOptions, error) {
	opt, err := redis.ParseClusterURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis_url: %w", err)
	}
	if opt.PoolSize, err = redisPoolSize(opt.PoolSize); err != nil {
		return nil, err
	}
	opt.ContextTimeoutEnabled = true
	return opt, nil
}

// maxRedisPoolSize bounds redis_url's pool_size: Redis's own default maxclients.
const maxRedisPoolSize = 10_000

// redisPoolSize is the pool redis_url's pool_size asks for (0, or none: the gateway's
// default). go-redis takes any integer: a negative one panicked the start (makechan: size out
// of range), and a huge one ran it out of memory (it sizes the pool's slices by it).
func redisPoolSize(n int) (int, error) {
	switch {
	case n == 0:
		return defaultRedisPoolSize, nil
	case n < 0 || n > maxRedisPoolSize:
		return 0, fmt.Errorf("redis_url: pool_size %d: want 1 to %d connections (per node on a Cluster), or none for %d",
			n, maxRedisPoolSize, defaultRedisPoolSize)
	}
	return n, nil
}

// redisOptions parses redis_url and applies the gateway's defaults.
func redisOptions(url string) (*redis.Options, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis_url: %w", err)
	}
	if opt.PoolSize, err = redisPoolSize(opt.PoolSize); err != nil {
		return nil, err
	}
	// The deadlines the gateway puts on its Redis calls (the tally's, the fingerprint's, a
	// lookup on the caller's path) are their bounds: by default go-redis waits out its own read
	// timeout (3 s) and retries, and a stalled Redis held a caller's answer 5–10 s.
	opt.ContextTimeoutEnabled = true
	return opt, nil
}

#!/usr/bin/env bash
# `make bench`: tollgate against a direct connection to the upstream and against a plain
# httputil.ReverseProxy, on loopback, in one run. See bench/README.md for how to read it.
#
#   ROUNDS=2        rounds of direct -> plain -> tollgate per scenario
#   SCALE=1         multiply every duration/count (0.2: a quick smoke run)
#   SCENARIOS=      comma-separated subset (latency-1conn,users-256,hot-64,hot-drain,streams-512,streams-burst,settle-lag)
#   PROFILE=1       run the gateway with -pprof and save CPU/alloc profiles
#   BENCH_KEEP=1    leave the temp dir (logs) in place
#   BENCH_INNODB_FLUSH=2  experiment only: SET GLOBAL innodb_flush_log_at_trx_commit (no fsync per
#                   commit; NOT durable, never a production setting) to see what fsync costs
#
# Everything it starts (MariaDB, Redis, fakellm, plainproxy, gateway) is private to a temp dir,
# on non-default ports, and torn down on every exit path.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"
[[ -d /usr/local/go/bin ]] && PATH="/usr/local/go/bin:$PATH"
export PATH

MYSQL_PORT=${BENCH_MYSQL_PORT:-23306}
REDIS_PORT=${BENCH_REDIS_PORT:-26379}
FAKE_ADDR=127.0.0.1:${BENCH_FAKE_PORT:-29090}
PLAIN_ADDR=127.0.0.1:${BENCH_PLAIN_PORT:-29191}
GW_ADDR=127.0.0.1:${BENCH_GATEWAY_PORT:-29080}
PPROF_ADDR=127.0.0.1:${BENCH_PPROF_PORT:-29060}
ROUNDS=${ROUNDS:-2}
SCALE=${SCALE:-1}
SCENARIOS=${SCENARIOS:-}
PROFILE=${PROFILE:-}

log() { printf 'bench: %s\n' "$*" >&2; }
die() { printf 'bench: ERROR: %s\n' "$*" >&2; exit 1; }
port_in_use() { (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null; }

DIR=$(mktemp -d /tmp/tgbench.XXXXXX)
PIDS=()

stop_pid() {
	local pid=$1 i
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
}

# shellcheck disable=SC2317 # invoked via trap
cleanup() {
	local rc=$? pid
	trap - EXIT INT TERM HUP
	for pid in "${PIDS[@]}"; do
		stop_pid "$pid"
	done
	QUIET=1 bash "$ROOT/scripts/services.sh" down "$DIR" ||
		log "warning: services in $DIR did not stop cleanly"
	if [[ -n ${BENCH_KEEP:-} ]]; then
		log "logs kept in $DIR"
	else
		rm -rf -- "$DIR"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

for a in "$FAKE_ADDR" "$PLAIN_ADDR" "$GW_ADDR"; do
	port_in_use "$a" && die "$a is in use (set BENCH_*_PORT)"
done

log "services in $DIR (MariaDB :$MYSQL_PORT, Redis :$REDIS_PORT)"
MYSQL_PORT=$MYSQL_PORT REDIS_PORT=$REDIS_PORT bash "$ROOT/scripts/services.sh" up "$DIR"
set -a
# shellcheck disable=SC1091
. "$DIR/env"
set +a

if [[ -n ${BENCH_INNODB_FLUSH:-} ]]; then
	log "EXPERIMENT: innodb_flush_log_at_trx_commit=$BENCH_INNODB_FLUSH (commits not durable)"
	"$(command -v mariadb || command -v mysql)" --no-defaults --protocol=socket --socket="$DIR/mysql.sock" -uroot \
		-e "SET GLOBAL innodb_flush_log_at_trx_commit=$BENCH_INNODB_FLUSH"
fi

log "building"
mkdir -p "$DIR/bin"
for c in gateway fakellm plainproxy loadgen; do
	go build -o "$DIR/bin/$c" "./cmd/$c"
done
GW_BIN=("$DIR/bin/gateway" serve)
if [[ -n $PROFILE ]]; then
	GW_BIN=("$DIR/bin/gateway" serve -pprof "$PPROF_ADDR")
fi

"$DIR/bin/gateway" migrate >&2
"$DIR/bin/loadgen" setup -dsn "$MYSQL_DSN" -users 1000 -hot-max-in-flight 128 -out "$DIR/keys.json" >&2

wait_port() {
	local addr=$1 pid=$2 name=$3 i
	for ((i = 0; i < 100; i++)); do
		port_in_use "$addr" && return 0
		kill -0 "$pid" 2>/dev/null || { tail -n 20 "$DIR/$name.log" >&2 || true; die "$name exited"; }
		sleep 0.1
	done
	die "$name did not listen on $addr"
}

"$DIR/bin/fakellm" -listen "$FAKE_ADDR" </dev/null >"$DIR/fakellm.log" 2>&1 &
FAKE_PID=$!
PIDS+=("$FAKE_PID")
"$DIR/bin/plainproxy" -listen "$PLAIN_ADDR" -upstream "http://$FAKE_ADDR" </dev/null >"$DIR/plain.log" 2>&1 &
PLAIN_PID=$!
PIDS+=("$PLAIN_PID")
UPSTREAM_URL="http://$FAKE_ADDR" LISTEN_ADDR="$GW_ADDR" "${GW_BIN[@]}" </dev/null >"$DIR/gateway.log" 2>&1 &
GW_PID=$!
PIDS+=("$GW_PID")
wait_port "$FAKE_ADDR" "$FAKE_PID" fakellm
wait_port "$PLAIN_ADDR" "$PLAIN_PID" plain
wait_port "$GW_ADDR" "$GW_PID" gateway

# The database's share of one call, measured on the same MariaDB before any load: it splits
# latency-1conn's added latency into the hold transaction and the rest of the gateway.
log "database steps (go test -bench BenchmarkDB ./holds/)"
timeout 300 go test -count=1 -run '^$' -bench BenchmarkDB -benchtime 2000x ./holds/ >"$DIR/dbsteps.txt" 2>&1 ||
	{ cat "$DIR/dbsteps.txt" >&2; die "database step benchmarks failed"; }

mkdir -p "$ROOT/bench/results"
OUT="$ROOT/bench/results/$(date -u +%Y%m%dT%H%M%SZ).json"
pprof_args=()
[[ -n $PROFILE ]] && pprof_args=(-pprof "http://$PPROF_ADDR")
MYSQL_PID=$(tr -dc '0-9' <"$DIR/mysql.pid")
REDIS_PID=$(tr -dc '0-9' <"$DIR/redis.pid")
# About 160 s of load per round at SCALE=1, plus settling and checks: the cap grows with both.
LOADGEN_TIMEOUT=$(awk -v r="$ROUNDS" -v s="$SCALE" 'BEGIN { t = 600 + r * 360 * (s < 1 ? 1 : s); printf "%d", t }')
log "running scenarios (rounds $ROUNDS, scale $SCALE); gateway pid $GW_PID"
rc=0
timeout "$LOADGEN_TIMEOUT" "$DIR/bin/loadgen" run -keys "$DIR/keys.json" \
	-direct "http://$FAKE_ADDR" -plain "http://$PLAIN_ADDR" -gateway "http://$GW_ADDR" -dsn "$MYSQL_DSN" \
	-pids "fakellm=$FAKE_PID,plain=$PLAIN_PID,gateway=$GW_PID,mysql=$MYSQL_PID,redis=$REDIS_PID" \
	-rounds "$ROUNDS" -scale "$SCALE" -scenarios "$SCENARIOS" -out "$OUT" -db-steps "$DIR/dbsteps.txt" "${pprof_args[@]}" || rc=$?

errs=$(grep -c '"level":"error"' "$DIR/gateway.log" || true)
log "gateway log: $errs error lines"
if ((errs > 0)); then
	grep -m 5 '"level":"error"' "$DIR/gateway.log" | cut -c1-400 >&2 || true
fi
((rc == 124)) && log "loadgen ran past ${LOADGEN_TIMEOUT}s and was stopped (no results written)"
((rc == 0)) || die "loadgen run failed (exit $rc)"

#!/usr/bin/env bash
# Full test run against throw-away MariaDB + Redis (called by `make test`).
#
#   FUZZ=1       also run each Fuzz* target for FUZZTIME (default 15s) first
#   GO_TEST_ARGS extra args for go test (e.g. "-run Foo")
#   RACE=0       run without the race detector (on by default; it needs gcc, installed if missing)
#   KEEP_SERVICES=1  leave the temp services running (prints their dir)
#
# The services are torn down on every exit path (success, failure, Ctrl-C,
# SIGTERM). go test runs last so its closing lines are the end of the log.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"
[[ -d /usr/local/go/bin ]] && PATH="/usr/local/go/bin:$PATH"
export PATH

log() { printf 'test: %s\n' "$*" >&2; }
die() { printf 'test: %s\n' "$*" >&2; exit 1; }

SVC_DIR=""
CHILD=""

cleanup() {
	local rc=$?
	trap - EXIT INT TERM HUP
	stop_child
	if [[ -n $SVC_DIR ]]; then
		if [[ -n ${KEEP_SERVICES:-} ]]; then
			log "KEEP_SERVICES set: services left running in $SVC_DIR"
		else
			QUIET=1 bash "$ROOT/scripts/services.sh" down "$SVC_DIR" --purge ||
				log "warning: teardown of $SVC_DIR failed"
		fi
	fi
	exit "$rc"
}

stop_child() {
	if [[ -n $CHILD ]] && kill -0 "$CHILD" 2>/dev/null; then
		# the child leads its own process group (setsid): take the whole tree
		kill -TERM -- "-$CHILD" 2>/dev/null || kill -TERM "$CHILD" 2>/dev/null || true
		local i
		for ((i = 0; i < 100; i++)); do
			kill -0 "$CHILD" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL -- "-$CHILD" 2>/dev/null || true
	fi
	CHILD=""
}

on_signal() {
	log "interrupted ($1); tearing down"
	stop_child
	exit "$2"
}

trap cleanup EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM
trap 'on_signal HUP 129' HUP

# run CMD... in its own process group, in the background, and wait for it:
# `wait` returns as soon as a trapped signal arrives, so teardown is prompt
# even when only this shell (not the whole process group) is signalled.
run() {
	local rc=0
	setsid "$@" </dev/null &
	CHILD=$!
	wait "$CHILD" || rc=$?
	CHILD=""
	return "$rc"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Two `make test` on one box (or a `make run` in progress) must not collide:
# unless the caller pinned a port, step off a busy default to a free one.
# port_bound: some TCP socket holds the local port, listening or not — a client connection's
# ephemeral port, or one in TIME-WAIT, makes a server's bind fail though nothing accepts on it.
port_bound() {
	local hex
	hex=$(printf '%04X' "$1")
	grep -qE "^ *[0-9]+: [0-9A-F]+:$hex " /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

pick_port() {
	local var=$1 def=$2 p i
	if [[ -n ${!var:-} ]]; then
		return 0
	fi
	p=$def
	for ((i = 0; i < 50; i++)); do
		if ! port_in_use "$p" && ! port_bound "$p"; then
			[[ $p == "$def" ]] || log "port $def busy; using $p for $var"
			export "$var=$p"
			return 0
		fi
		# Below Linux's ephemeral range (32768-60999), where no client connection lands.
		p=$((20000 + RANDOM % 12000))
	done
	log "no free port found for $var"
	return 1
}
# The race detector runs by default: the money path is concurrent by design, and a race the
# tests exercise should fail them. It needs cgo, and cgo a C compiler.
race_args=()
if [[ ${RACE:-1} != 0 ]]; then
	if ! command -v gcc >/dev/null 2>&1; then
		[[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1 ||
			die "the race detector needs gcc (or run with RACE=0): install gcc and libc6-dev"
		log "installing gcc and libc6-dev for the race detector (apt-get)"
		# apt-get.sh waits out another apt's locks, which apt-get alone does not for all of them.
		apt=(bash "$ROOT/scripts/apt-get.sh")
		"${apt[@]}" install gcc libc6-dev ||
			{ "${apt[@]}" update && "${apt[@]}" install gcc libc6-dev; } ||
			die "could not install gcc for the race detector"
	fi
	export CGO_ENABLED=1
	race_args=(-race)
fi

# The modules first, each fetch tried again: on a new machine every module comes from the module
# proxy, and one fetch failing for a moment failed go vet, and with it the run, though go test
# fetched the same module a moment later.
mod_tries=3
for ((i = 1; ; i++)); do
	run go mod download && break
	((i < mod_tries)) || die "go mod download failed $mod_tries times"
	log "go mod download failed (try $i of $mod_tries); trying again in $((5 * i)) s"
	sleep $((5 * i))
done

pick_port MYSQL_PORT 13306
pick_port REDIS_PORT 16379

SVC_DIR=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-test.XXXXXX")
bash "$ROOT/scripts/services.sh" up "$SVC_DIR"

set -a
# shellcheck disable=SC1091
. "$SVC_DIR/env"
set +a
export TOLLGATE_TEST_MYSQL_DSN TOLLGATE_TEST_REDIS_URL MYSQL_DSN REDIS_URL

# The tests replay testdata/usage, the repository's copy of the project's shared fixtures, so
# that a clone alone runs them. Where shared/ sits beside the clone, the two must agree.
if [[ -d $ROOT/../shared/fixtures/usage ]] && ! diff -r "$ROOT/../shared/fixtures/usage" "$ROOT/testdata/usage" >&2; then
	die "testdata/usage differs from ../shared/fixtures/usage: copy the shared fixtures into testdata/usage"
fi

log "go $(go env GOVERSION)${race_args:+ (race detector on)}; MySQL ${TOLLGATE_TEST_MYSQL_DSN}; Redis ${TOLLGATE_TEST_REDIS_URL}; fixtures ${TOLLGATE_FIXTURES:-testdata/usage}"

vet_rc=0
log "go vet ./..."
run go vet ./... || vet_rc=$?
((vet_rc == 0)) || log "go vet failed (rc=$vet_rc); running the tests anyway"

fuzz_rc=0
if [[ ${FUZZ:-} == 1 ]]; then
	fuzztime=${FUZZTIME:-15s}
	# every "func FuzzXxx(" in a _test.go file: one go test per target
	while IFS=: read -r file name; do
		pkg="./$(dirname "$file")"
		log "fuzz smoke: $name in $pkg for $fuzztime"
		run go test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" "$pkg" || fuzz_rc=$?
	done < <(grep -rEo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' . |
		sed -E 's#^\./##; s#:func #:#' | sort -u)
	((fuzz_rc == 0)) || log "fuzz smoke failed (rc=$fuzz_rc)"
fi

test_rc=0
# shellcheck disable=SC2086 # GO_TEST_ARGS is intentionally word-split
run go test -count=1 -timeout 30m "${race_args[@]}" ${GO_TEST_ARGS:-} ./... || test_rc=$?

if ((test_rc != 0)); then
	exit "$test_rc"
fi
if ((vet_rc != 0)); then
	log "FAIL: go vet"
	exit "$vet_rc"
fi
if ((fuzz_rc != 0)); then
	log "FAIL: fuzz smoke"
	exit "$fuzz_rc"
fi

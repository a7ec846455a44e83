#!/usr/bin/env bash
# Local demo (called by `make run`): MariaDB + Redis in .run/ (kept between
# runs; `make down` stops them), migrate, demo user/key, fakellm upstream on
# 127.0.0.1:9090, then the gateway on 127.0.0.1:8080 in the foreground, serving as an account
# with DML only (gateway_serve).
# Ctrl-C stops the gateway and fakellm; the databases keep running.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"
[[ -d /usr/local/go/bin ]] && PATH="/usr/local/go/bin:$PATH"
export PATH

RUN_DIR="$ROOT/.run"
FAKELLM_ADDR="${FAKELLM_ADDR:-127.0.0.1:9090}"
GATEWAY_ADDR="${GATEWAY_ADDR:-127.0.0.1:8080}"
# Go's listen form without a host (":18080") would serve every interface, print a curl to
# http://:18080 that curl refuses, and leave port_in_use nothing to probe: the demo stays on
# loopback.
[[ $FAKELLM_ADDR == :* ]] && FAKELLM_ADDR="127.0.0.1$FAKELLM_ADDR"
[[ $GATEWAY_ADDR == :* ]] && GATEWAY_ADDR="127.0.0.1$GATEWAY_ADDR"

log() { printf 'run: %s\n' "$*" >&2; }
die() { printf 'run: ERROR: %s\n' "$*" >&2; exit 1; }

port_in_use() { (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null; }

FAKE_PID=""
# shellcheck disable=SC2317 # invoked via trap
cleanup() {
	local rc=$?
	trap - EXIT INT TERM HUP
	if [[ -n $FAKE_PID ]] && kill -0 "$FAKE_PID" 2>/dev/null; then
		kill -TERM "$FAKE_PID" 2>/dev/null || true
		local i
		for ((i = 0; i < 50; i++)); do
			kill -0 "$FAKE_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$FAKE_PID" 2>/dev/null || true
	fi
	# Always once fakellm was started: on Ctrl-C it has the signal too and is gone by now,
	# and this reminder was skipped with it.
	[[ -n $FAKE_PID ]] && log "gateway and fakellm stopped; MariaDB and Redis still run in $RUN_DIR (make down stops them)"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# A CONFIG that names no file (a typo, or a path relative to another directory) is refused: the
# demo's config served in its place would price and plan otherwise than the file asked for, and
# only the banner's "(config ...)" would tell.
config=""
if [[ -n ${CONFIG:-} ]]; then
	[[ -f $CONFIG ]] || die "CONFIG=$CONFIG: no such file (a relative path is read from $ROOT)"
	config=$CONFIG
fi
for c in config.example.yaml config/config.example.yaml; do
	if [[ -z $config && -f $c ]]; then
		config=$c
	fi
done
[[ -n $config ]] || die "no config file (looked for config.example.yaml, config/config.example.yaml; set CONFIG=)"

# One make run per checkout at a time, held until its gateway and fakellm end (they inherit the
# lock; the databases must not: services.sh is started without it). The busy-port check below sees
# a first run only once it listens: a second started while the first still built or migrated
# printed its own key and banner too, and one of the two then stopped on the gateway's port.
mkdir -p "$RUN_DIR"
exec 9>"$RUN_DIR/run.lock"
flock -n 9 || die "a make run is already running in $ROOT (Ctrl-C it, or wait for it to stop)"

# Before anything else: a second `make run` beside a running one used to rebuild bin/ under
# it, mint a new demo key over .run/demo_key and only then stop on the busy port.
busy="is already in use: is a make run still running (Ctrl-C it)? Else set"
port_in_use "$FAKELLM_ADDR" && die "$FAKELLM_ADDR $busy FAKELLM_ADDR"
port_in_use "$GATEWAY_ADDR" && die "$GATEWAY_ADDR $busy GATEWAY_ADDR"

bash "$ROOT/scripts/services.sh" up "$RUN_DIR" 9>&-
set -a
# shellcheck disable=SC1091
. "$RUN_DIR/env"
set +a

"${MAKE:-make}" --no-print-directory build

if [[ ! -s $RUN_DIR/admin_token ]]; then
	(umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$RUN_DIR/admin_token")
fi
ADMIN_TOKEN=$(<"$RUN_DIR/admin_token")
export MYSQL_DSN REDIS_URL ADMIN_TOKEN
export UPSTREAM_URL="http://$FAKELLM_ADDR"
export LISTEN_ADDR="$GATEWAY_ADDR"

log "migrating"
bin/gateway migrate --config "$config"

# The gateway serves as an account with the production shape: DML on the demo's database and
# nothing else. .run/env's account (the one migrate, demo-setup and the operator's commands use)
# has ALL PRIVILEGES, SUPER among them, with which read_only does not bind it (README, Failovers
# and maintenance): serve warned "database weakens a guarantee" under every demo's banner.
serve_db=${MYSQL_DSN##*/}
serve_db=${serve_db%%\?*}
mysql_cli=$(command -v mariadb || command -v mysql) || die "no mariadb/mysql client"
if ! "$mysql_cli" --no-defaults --protocol=socket --socket="$TOLLGATE_MYSQL_SOCKET" -uroot --batch <<-SQL; then
	CREATE USER IF NOT EXISTS 'gateway_serve'@'127.0.0.1' IDENTIFIED BY 'gateway_serve';
	ALTER USER 'gateway_serve'@'127.0.0.1' IDENTIFIED BY 'gateway_serve';
	GRANT SELECT, INSERT, UPDATE, DELETE ON \`$serve_db\`.* TO 'gateway_serve'@'127.0.0.1';
SQL
	die "could not create the gateway's serving account gateway_serve"
fi
SERVE_DSN="gateway_serve:gateway_serve@${MYSQL_DSN#*@}"

setup_out=$(bin/gateway demo-setup --config "$config") || {
	printf '%s\n' "$setup_out" >&2
	die "gateway demo-setup failed"
}
KEY=$(printf '%s\n' "$setup_out" | sed -n 's/^KEY=//p' | tail -n 1)
[[ -n $KEY ]] || {
	printf '%s\n' "$setup_out" >&2
	die "demo-setup printed no KEY= line"
}
printf '%s\n' "$KEY" >"$RUN_DIR/demo_key"

# setsid: its own session, out of the terminal's reach. Ctrl-C is the gateway's: it drains its
# calls for up to shutdown_timeout, and cleanup stops fakellm only once the gateway is gone. Given
# the Ctrl-C too, fakellm closed its streams after its own 10 s, and the calls the gateway was
# draining ended upstream_broken instead of whole.
setsid bin/fakellm -listen "$FAKELLM_ADDR" </dev/null >"$RUN_DIR/fakellm.log" 2>&1 &
FAKE_PID=$!
for ((i = 0; i < 100; i++)); do
	port_in_use "$FAKELLM_ADDR" && break
	kill -0 "$FAKE_PID" 2>/dev/null || {
		tail -n 20 "$RUN_DIR/fakellm.log" >&2 || true
		die "fakellm exited"
	}
	sleep 0.1
done
port_in_use "$FAKELLM_ADDR" || die "fakellm did not listen on $FAKELLM_ADDR within 10s (log: $RUN_DIR/fakellm.log)"

cat >&2 <<EOF

== tollgate demo ==========================================================
 gateway  http://$GATEWAY_ADDR   (config $config)
 upstream fakellm on $FAKELLM_ADDR, log $RUN_DIR/fakellm.log
 admin token in $RUN_DIR/admin_token, demo key in $RUN_DIR/demo_key

 Stream a charged answer:
   curl -N http://$GATEWAY_ADDR/v1/chat/completions -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' -d '{"model":"fake-gpt","stream":true,"messages":[{"role":"user","content":"Hello"}]}'

 Remaining credits:
   curl http://$GATEWAY_ADDR/v1/credits -H "Authorization: Bearer $KEY"

 Ctrl-C stops gateway + fakellm; 'make down' stops MariaDB/Redis.
===========================================================================

EOF

# Not exec: the shell must outlive the gateway to stop fakellm. The gateway
# stays in the foreground process group, so Ctrl-C reaches it directly.
# Ctrl-C is the gateway's to handle from here: it drains and exits 0, and so does this script
# (make said "Error 130" after every clean stop). A no-op trap, not an ignored signal, which the
# gateway would inherit.
trap ':' INT
rc=0
MYSQL_DSN=$SERVE_DSN bin/gateway serve --config "$config" || rc=$?
exit "$rc"

#!/usr/bin/env bash
# Private MariaDB + Redis for tests and local runs.
#
#   scripts/services.sh up   DIR            start (idempotent), write DIR/env
#   scripts/services.sh down DIR [--purge]  stop both; --purge also removes DIR
#   scripts/services.sh status DIR          exit 0 when both answer
#
# Everything lives under DIR: data dir, sockets, pid files, logs. The servers
# listen on 127.0.0.1 only, on MYSQL_PORT (default 13306) and REDIS_PORT
# (default 16379): below Linux's ephemeral range (32768-60999), where a client
# connection's own port can hold a port for a moment and make the bind fail.
# The distro's own mariadb/redis services are never used; if the package
# install auto-started them they keep their default ports.
#
# DIR/env holds shell-sourceable KEY='value' lines (the DSN has parentheses,
# so the values are single-quoted; compose/dotenv parsers accept that too).
set -euo pipefail

# Debian keeps the daemons in /usr/sbin, which a non-login PATH may lack.
export PATH="${PATH}:/usr/sbin:/sbin"

MYSQL_START_TIMEOUT="${MYSQL_START_TIMEOUT:-90}"  # seconds
REDIS_START_TIMEOUT="${REDIS_START_TIMEOUT:-30}"
STOP_TIMEOUT="${STOP_TIMEOUT:-60}"
MARKER=".tollgate-services"

log() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: ERROR: %s\n' "$*" >&2; exit 1; }

usage() {
	printf 'usage: %s up|down|status DIR [--purge]\n' "${0##*/}" >&2
	exit 2
}

# ---------------------------------------------------------------- helpers

mysqld_bin() {
	if command -v mariadbd >/dev/null 2>&1; then
		command -v mariadbd
	elif command -v mysqld >/dev/null 2>&1; then
		command -v mysqld
	fi
}

first_cmd() {
	local c
	for c in "$@"; do
		if command -v "$c" >/dev/null 2>&1; then
			printf '%s\n' "$c"
			return 0
		fi
	done
	return 1
}

# pid_alive PIDFILE NAME-REGEX: prints the pid when the process in PIDFILE
# exists and its command name matches (guards against pid reuse).
pid_alive() {
	local file=$1 re=$2 pid comm state
	[[ -s $file ]] || return 1
	pid=$(tr -dc '0-9' <"$file")
	[[ -n $pid ]] || return 1
	kill -0 "$pid" 2>/dev/null || return 1
	# a zombie (killed, not yet reaped) is not alive
	state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null || true)
	[[ -n $state && ${state:0:1} != Z ]] || return 1
	comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
	[[ $comm =~ $re ]] || return 1
	printf '%s\n' "$pid"
}

port_in_use() {
	# bash's /dev/tcp: succeeds when something accepts on the port.
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

wait_pid_exit() {
	local pid=$1 timeout=$2 i
	for ((i = 0; i < timeout * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	return 1
}

tail_log() {
	local f=$1
	if [[ -s $f ]]; then
		printf -- '----- last lines of %s -----\n' "$f" >&2
		tail -n 40 "$f" >&2 || true
		printf -- '-----\n' >&2
	fi
}

ensure_packages() {
	local need=()
	[[ -n $(mysqld_bin) ]] || need+=(mariadb-server)
	command -v mariadb-install-db >/dev/null 2>&1 ||
		command -v mysql_install_db >/dev/null 2>&1 || need+=(mariadb-server)
	first_cmd mariadb mysql >/dev/null || need+=(mariadb-client)
	command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
	command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
	((${#need[@]} == 0)) && return 0

	# de-duplicate
	mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
	[[ $(id -u) -eq 0 ]] || die "missing ${need[*]} and not root; install them first"
	command -v apt-get >/dev/null 2>&1 || die "missing ${need[*]} and no apt-get"

	# apt-get.sh waits out another apt's locks, which apt-get alone does not for all of them.
	local apt=(bash "$(dirname "${BASH_SOURCE[0]}")/apt-get.sh") p
	for p in "${need[@]}"; do
		if ! apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
			log "package lists lack $p; running apt-get update"
			"${apt[@]}" update
			break
		fi
	done
	log "installing ${need[*]} (apt-get)"
	if ! "${apt[@]}" install "${need[@]}"; then
		# stale package lists (a rotated-out version 404s): refresh and retry once
		log "apt-get install failed; running apt-get update and retrying"
		"${apt[@]}" update
		"${apt[@]}" install "${need[@]}"
	fi
	[[ -n $(mysqld_bin) ]] || die "mariadbd still missing after install"
	command -v redis-server >/dev/null 2>&1 || die "redis-server still missing after install"
}

# --------------------------------------------------------------- mariadb

mysql_client() {
	local cli
	cli=$(first_cmd mariadb mysql) || die "no mariadb/mysql client"
	"$cli" --no-defaults --protocol=socket --socket="$DIR/mysql.sock" -uroot "$@"
}

mysql_ping() {
	local admin
	admin=$(first_cmd mariadb-admin mysqladmin) || die "no mariadb-admin/mysqladmin"
	timeout 10 "$admin" --no-defaults --protocol=socket --socket="$DIR/mysql.sock" \
		-uroot --connect-timeout=2 ping >/dev/null 2>&1
}

mysql_init() {
	local datadir=$DIR/mysql
	if [[ -f $DIR/.mysql-initialized && -d $datadir/mysql ]]; then
		return 0
	fi
	rm -rf "$datadir" "$DIR/.mysql-initialized"
	local installer
	installer=$(first_cmd mariadb-install-db mysql_install_db) || die "no mariadb-install-db"
	log "initialising MariaDB data dir $datadir"
	# --tmpdir reaches the bootstrap server: its temporary tables in the shared /tmp were seen to
	# vanish mid-install on a busy box ("Unknown table 'mysql.tmp_user_sys'"), failing make run.
	if ! "$installer" --no-defaults --datadir="$datadir" --user=root --tmpdir="$DIR/tmp" \
		--auth-root-authentication-method=normal --skip-test-db --skip-name-resolve --force \
		>"$DIR/mysql-install.log" 2>&1; then
		tail_log "$DIR/mysql-install.log"
		die "mariadb-install-db failed"
	fi
	: >"$DIR/.mysql-initialized"
}

mysql_start() {
	local pid port=$MYSQL_PORT bin i running
	running=$(cat "$DIR/mysql.port" 2>/dev/null || echo "$port")
	if pid=$(pid_alive "$DIR/mysql.pid" '^(mariadbd|mysqld)$'); then
		# alive: answering now, or still starting (give it the start budget)
		for ((i = 0; i < MYSQL_START_TIMEOUT * 5; i++)); do
			if mysql_ping; then
				if [[ $running != "$port" ]]; then
					log "warning: MariaDB in $DIR already runs on port $running (asked for $port); keeping $running"
				fi
				MYSQL_PORT=$running
				log "MariaDB already up (pid $pid, port $MYSQL_PORT)"
				return 0
			fi
			((i > 0)) || log "MariaDB pid $pid exists but does not answer yet; waiting"
			pid_alive "$DIR/mysql.pid" '^(mariadbd|mysqld)$' >/dev/null || break
			sleep 0.2
		done
		if pid_alive "$DIR/mysql.pid" '^(mariadbd|mysqld)$' >/dev/null; then
			tail_log "$DIR/mysql.err"
			die "MariaDB pid $pid in $DIR runs but does not answer; run '$0 down $DIR' first"
		fi
		log "MariaDB pid $pid went away; starting afresh"
	fi

	rm -f "$DIR/mysql.pid" "$DIR/mysql.sock" "$DIR/mysql.sock.lock"
	port_in_use "$port" && die "port $port is already in use by another process (set MYSQL_PORT)"
	mysql_init
	bin=$(mysqld_bin)
	log "starting MariaDB on 127.0.0.1:$port"
	# setsid: own session, so Ctrl-C in the calling terminal does not reach it.
	setsid "$bin" --no-defaults \
		--datadir="$DIR/mysql" \
		--socket="$DIR/mysql.sock" \
		--port="$port" \
		--bind-address=127.0.0.1 \
		--user=root \
		--pid-file="$DIR/mysql.pid" \
		--log-error="$DIR/mysql.err" \
		--tmpdir="$DIR/tmp" \
		--skip-name-resolve \
		--skip-log-bin \
		--innodb-buffer-pool-size=256M \
		--max-connections=1000 \
		--max-allowed-packet=64M \
		--character-set-server=utf8mb4 \
		--collation-server=utf8mb4_unicode_ci \
		--sql-mode=ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION \
		</dev/null >>"$DIR/mysql.out" 2>&1 &
	pid=$!
	printf '%s\n' "$port" >"$DIR/mysql.port"

	for ((i = 0; i < MYSQL_START_TIMEOUT * 5; i++)); do
		if mysql_ping; then
			MYSQL_PORT=$port
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			tail_log "$DIR/mysql.err"
			tail_log "$DIR/mysql.out"
			die "MariaDB exited during start-up"
		fi
		sleep 0.2
	done
	tail_log "$DIR/mysql.err"
	die "MariaDB did not answer within ${MYSQL_START_TIMEOUT}s"
}

mysql_provision() {
	# Idempotent. tests create tg_test_* databases, hence global privileges.
	# With --skip-name-resolve, TCP from 127.0.0.1 matches host '127.0.0.1'
	# and socket connections match 'localhost'.
	if ! mysql_client --batch <<-'SQL' 2>"$DIR/provision.err"; then
		CREATE DATABASE IF NOT EXISTS tollgate CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;
		DROP USER IF EXISTS ''@'localhost';
		DROP USER IF EXISTS 'root'@'127.0.0.1', 'root'@'::1';
		CREATE USER IF NOT EXISTS 'tollgate'@'127.0.0.1' IDENTIFIED BY 'tollgate';
		CREATE USER IF NOT EXISTS 'tollgate'@'localhost' IDENTIFIED BY 'tollgate';
		ALTER USER 'tollgate'@'127.0.0.1' IDENTIFIED BY 'tollgate';
		ALTER USER 'tollgate'@'localhost' IDENTIFIED BY 'tollgate';
		GRANT ALL PRIVILEGES ON *.* TO 'tollgate'@'127.0.0.1' WITH GRANT OPTION;
		GRANT ALL PRIVILEGES ON *.* TO 'tollgate'@'localhost' WITH GRANT OPTION;
		FLUSH PRIVILEGES;
	SQL
		tail_log "$DIR/provision.err"
		die "could not create database/user"
	fi
}

mysql_stop() {
	local pid admin
	if ! pid=$(pid_alive "$DIR/mysql.pid" '^(mariadbd|mysqld)$'); then
		rm -f "$DIR/mysql.pid"
		return 0
	fi
	admin=$(first_cmd mariadb-admin mysqladmin || true)
	if [[ -n $admin ]] && timeout 20 "$admin" --no-defaults --protocol=socket \
		--socket="$DIR/mysql.sock" -uroot --connect-timeout=2 shutdown >/dev/null 2>&1; then
		:
	else
		kill -TERM "$pid" 2>/dev/null || true
	fi
	if ! wait_pid_exit "$pid" "$STOP_TIMEOUT"; then
		log "MariaDB (pid $pid) did not stop within ${STOP_TIMEOUT}s; killing"
		kill -KILL "$pid" 2>/dev/null || true
		wait_pid_exit "$pid" 10 || die "could not kill MariaDB pid $pid"
	fi
	rm -f "$DIR/mysql.pid"
}

# ----------------------------------------------------------------- redis

redis_ping() {
	[[ $(timeout 5 redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null) == PONG ]]
}

redis_start() {
	local pid port=$REDIS_PORT running
	running=$(cat "$DIR/redis.port" 2>/dev/null || echo "$port")
	if pid=$(pid_alive "$DIR/redis.pid" '^redis-server') && redis_ping "$running"; then
		if [[ $running != "$port" ]]; then
			log "warning: Redis in $DIR already runs on port $running (asked for $port); keeping $running"
		fi
		REDIS_PORT=$running
		log "Redis already up (pid $pid, port $REDIS_PORT)"
		return 0
	fi
	if [[ -n ${pid:-} ]]; then
		log "Redis pid $pid does not answer; restarting it"
		kill -TERM "$pid" 2>/dev/null || true
		wait_pid_exit "$pid" 10 || kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$DIR/redis.pid"
	port_in_use "$port" && die "port $port is already in use by another process (set REDIS_PORT)"
	log "starting Redis on 127.0.0.1:$port"
	if ! setsid redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
		--dir "$DIR" --daemonize yes --pidfile "$DIR/redis.pid" \
		--logfile "$DIR/redis.log" </dev/null >>"$DIR/redis.out" 2>&1; then
		tail_log "$DIR/redis.out"
		tail_log "$DIR/redis.log"
		die "redis-server failed to start"
	fi
	printf '%s\n' "$port" >"$DIR/redis.port"
	local i
	for ((i = 0; i < REDIS_START_TIMEOUT * 5; i++)); do
		if redis_ping "$port"; then
			return 0
		fi
		sleep 0.2
	done
	tail_log "$DIR/redis.log"
	die "Redis did not answer within ${REDIS_START_TIMEOUT}s"
}

redis_stop() {
	local pid port
	if ! pid=$(pid_alive "$DIR/redis.pid" '^redis-server'); then
		rm -f "$DIR/redis.pid"
		return 0
	fi
	port=$(cat "$DIR/redis.port" 2>/dev/null || echo "$REDIS_PORT")
	timeout 10 redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 ||
		kill -TERM "$pid" 2>/dev/null || true
	if ! wait_pid_exit "$pid" "$STOP_TIMEOUT"; then
		log "Redis (pid $pid) did not stop within ${STOP_TIMEOUT}s; killing"
		kill -KILL "$pid" 2>/dev/null || true
		wait_pid_exit "$pid" 10 || die "could not kill Redis pid $pid"
	fi
	rm -f "$DIR/redis.pid"
}

# ------------------------------------------------------------------- env

write_env() {
	local tmp=$DIR/env.tmp
	cat >"$tmp" <<-EOF
		# written by scripts/services.sh; source with: set -a; . '$DIR/env'; set +a
		MYSQL_DSN='tollgate:tollgate@tcp(127.0.0.1:$MYSQL_PORT)/tollgate'
		REDIS_URL='redis://127.0.0.1:$REDIS_PORT/0'
		TOLLGATE_TEST_MYSQL_DSN='tollgate:tollgate@tcp(127.0.0.1:$MYSQL_PORT)/'
		TOLLGATE_TEST_REDIS_URL='redis://127.0.0.1:$REDIS_PORT/0'
		TOLLGATE_MYSQL_PORT='$MYSQL_PORT'
		TOLLGATE_REDIS_PORT='$REDIS_PORT'
		TOLLGATE_MYSQL_SOCKET='$DIR/mysql.sock'
	EOF
	mv -f "$tmp" "$DIR/env"
}

# ------------------------------------------------------------------ main

cmd_up() {
	mkdir -p "$DIR/tmp"
	[[ -e $DIR/$MARKER ]] || : >"$DIR/$MARKER"
	ensure_packages
	mysql_start
	mysql_provision
	redis_start
	write_env
	log "up: MariaDB 127.0.0.1:$MYSQL_PORT, Redis 127.0.0.1:$REDIS_PORT, env in $DIR/env"
}

cmd_down() {
	local purge=$1 rc=0
	if [[ ! -d $DIR ]]; then
		return 0
	fi
	mysql_stop || rc=1
	redis_stop || rc=1
	if [[ $purge == 1 ]]; then
		if ((rc != 0)); then
			log "not removing $DIR: a server did not stop"
		elif [[ -e $DIR/$MARKER ]]; then
			rm -rf -- "$DIR"
		else
			log "not removing $DIR: no $MARKER marker (not made by services.sh)"
		fi
	fi
	[[ -n ${QUIET:-} ]] || log "down: $DIR"
	return "$rc"
}

cmd_status() {
	local ok=0 mport rport
	mport=$(cat "$DIR/mysql.port" 2>/dev/null || echo "$MYSQL_PORT")
	rport=$(cat "$DIR/redis.port" 2>/dev/null || echo "$REDIS_PORT")
	if pid_alive "$DIR/mysql.pid" '^(mariadbd|mysqld)$' >/dev/null && mysql_ping; then
		log "MariaDB up on 127.0.0.1:$mport"
	else
		log "MariaDB down"
		ok=1
	fi
	if pid_alive "$DIR/redis.pid" '^redis-server' >/dev/null && redis_ping "$rport"; then
		log "Redis up on 127.0.0.1:$rport"
	else
		log "Redis down"
		ok=1
	fi
	return "$ok"
}

main() {
	(($# >= 2)) || usage
	local action=$1 dir=$2 purge=0
	shift 2
	while (($#)); do
		case $1 in
		--purge) purge=1 ;;
		*) usage ;;
		esac
		shift
	done
	[[ -n $dir && $dir != / ]] || die "refusing DIR '$dir'"
	MYSQL_PORT="${MYSQL_PORT:-13306}"
	REDIS_PORT="${REDIS_PORT:-16379}"
	[[ $MYSQL_PORT =~ ^[0-9]+$ && $REDIS_PORT =~ ^[0-9]+$ ]] || die "ports must be numeric"

	case $action in
	up)
		mkdir -p "$dir"
		DIR=$(cd "$dir" && pwd -P)
		# the socket path must fit in sun_path (108 bytes)
		((${#DIR} < 90)) || die "DIR path too long for a unix socket: $DIR"
		cmd_up
		;;
	down)
		[[ -d $dir ]] || exit 0
		DIR=$(cd "$dir" && pwd -P)
		cmd_down "$purge"
		;;
	status)
		[[ -d $dir ]] || { log "no such dir $dir"; exit 1; }
		DIR=$(cd "$dir" && pwd -P)
		cmd_status
		;;
	*) usage ;;
	esac
}

main "$@"

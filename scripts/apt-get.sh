#!/usr/bin/env bash
# apt-get that waits out another apt's locks (called by services.sh and test.sh).
#
#   scripts/apt-get.sh update
#   scripts/apt-get.sh install PKG...
#
# DPkg::Lock::Timeout makes apt-get wait for dpkg's own lock only: `apt-get update` takes the
# package lists' lock (/var/lib/apt/lists/lock), and a download the archives' lock, without
# waiting, so another apt running at that moment (a second `make test` installing, the
# machine's own apt-daily) failed the whole run at once with "Could not get lock". A refusal
# of a lock is tried again every 5 s, up to APT_LOCK_TIMEOUT seconds (default 900) in all;
# any other failure is apt-get's exit code at once. apt-get's output goes to stderr.
set -euo pipefail

APT_LOCK_TIMEOUT="${APT_LOCK_TIMEOUT:-900}"
export DEBIAN_FRONTEND=noninteractive
opts=(-y -q -o DPkg::Lock::Timeout="$APT_LOCK_TIMEOUT"
	-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold --no-install-recommends)

err=$(mktemp)
trap 'rm -f "$err"' EXIT
deadline=$((SECONDS + APT_LOCK_TIMEOUT))
while :; do
	rc=0
	apt-get "${opts[@]}" "$@" >&2 2>"$err" || rc=$?
	cat "$err" >&2
	((rc != 0)) || exit 0
	if ! grep -qE 'Could not get lock|Unable to (acquire|lock)' "$err" || ((SECONDS >= deadline)); then
		exit "$rc"
	fi
	printf 'apt-get: another apt holds a lock; trying again in 5 s\n' >&2
	sleep 5
done

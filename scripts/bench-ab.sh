#!/usr/bin/env bash
# `make bench-ab BASE=<rev>`: the code at BASE against the working tree, in alternating
# `make bench` runs, then a pair-by-pair comparison (`loadgen compare`). On this shared
# hardware a figure moves from run to run by more than most changes cost; back-to-back pairs,
# their order swapped every other pair (base first, then head first), are how a change to the
# hot path is judged. See bench/README.md.
#
#   BASE=           the revision to compare against (required), e.g. HEAD~1 or a commit id
#   PAIRS=2         pairs of runs
#   SCENARIOS=latency-1conn,settle-lag   passed to each run (ROUNDS=1 each)
#
# The base runs in a git worktree under a temp dir, removed at the end; both sides' result
# files stay under bench/results/ of the working tree, listed with the comparison.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"
[[ -d /usr/local/go/bin ]] && PATH="/usr/local/go/bin:$PATH"
export PATH

BASE=${BASE:-}
PAIRS=${PAIRS:-2}
SCENARIOS=${SCENARIOS:-latency-1conn,settle-lag}

log() { printf 'bench-ab: %s\n' "$*" >&2; }
die() { printf 'bench-ab: ERROR: %s\n' "$*" >&2; exit 1; }

[[ -n "$BASE" ]] || die "set BASE to the revision to compare against, e.g. make bench-ab BASE=HEAD~1"
[[ "$PAIRS" =~ ^[1-9][0-9]?$ ]] || die "PAIRS must be a whole number from 1 to 99"
rev=$(git rev-parse --verify --quiet "$BASE^{commit}") || die "no such revision: $BASE"

DIR=$(mktemp -d /tmp/tgbenchab.XXXXXX)
cleanup() {
	git -C "$ROOT" worktree remove --force "$DIR/main" >/dev/null 2>&1 || true
	rm -rf "$DIR"
}
trap cleanup EXIT INT TERM

# The fixtures the fake upstream replays live beside the repository (../shared).
git worktree add --quiet --detach "$DIR/main" "$rev"
[[ -d "$ROOT/../shared" ]] && ln -s "$ROOT/../shared" "$DIR/shared"

# run SIDE TREE: one `make bench` in TREE; prints the result file, copied under bench/results/.
run() {
	local side=$1 tree=$2 out
	out="$DIR/$side.$(date +%s).log"
	log "$side: SCENARIOS=$SCENARIOS ROUNDS=1 make bench in $tree"
	if ! (cd "$tree" && SCENARIOS="$SCENARIOS" ROUNDS=1 bash scripts/bench.sh) >"$out" 2>&1; then
		tail -20 "$out" >&2
		die "$side run failed (log above)"
	fi
	local res
	res=$(sed -n 's/^results: //p' "$out" | tail -1)
	[[ -f "$res" ]] || die "$side run wrote no result file"
	if [[ "$tree" != "$ROOT" ]]; then
		cp "$res" "$ROOT/bench/results/"
		res="$ROOT/bench/results/$(basename "$res")"
	fi
	echo "$res"
}

bases=() heads=()
for ((i = 1; i <= PAIRS; i++)); do
	if ((i % 2)); then
		bases+=("$(run base "$DIR/main")")
		heads+=("$(run head "$ROOT")")
	else
		heads+=("$(run head "$ROOT")")
		bases+=("$(run base "$DIR/main")")
	fi
done

join() { local IFS=,; echo "$*"; }
echo "base $rev: ${bases[*]#"$ROOT"/}"
echo "head (working tree): ${heads[*]#"$ROOT"/}"
go run ./cmd/loadgen compare -base "$(join "${bases[@]}")" -head "$(join "${heads[@]}")"

// Package runstate keeps what must outlive one call's goroutine and be seen by every process
// in Redis: a run's tally of what it used (HINCRBY, read by its settlement and by the
// reconciler), the leases that say a live process still serves a run, a named run's budget of
// reservations, and the names of every key tollgate writes. Package metering finds out what a
// call used; this one records it where a killed process cannot lose it.
package runstate

import "strconv"

// Keys names every Redis key tollgate uses. Each key of a run carries the run id in braces,
// Redis Cluster's hash tag, so all keys of one run live in one slot and multi-key work on a
// run stays legal in Cluster. Prefix is empty in production; tests set one per test.
type Keys struct{ Prefix string }

// Usage is the tally hash of a run.
func (k Keys) Usage(runID string) string { return k.Prefix + "billing:usage:{" + runID + "}" }

// RunBudget is what a named run's calls in flight have reserved of its cap (see RunBudget).
func (k Keys) RunBudget(runID string) string { return k.Prefix + "billing:runbudget:{" + runID + "}" }

// CallDone marks a call of a named run as tallied, so a repeated RunBudget.Release does not
// tally it twice. A key of its own, living tally_ttl from the call's end, rather than a field
// of the tally hash: the hash's life is pushed out by every call of the run, so one field per
// call grew it for as long as the run went on (calls that cost nothing do not use its cap).
func (k Keys) CallDone(runID, callID string) string {
	return k.Prefix + "billing:calldone:{" + runID + "}:" + callID
}

// Lost marks when a named run's Redis record was found to have lost calls (RunBudget.AwaitRebuild,
// or a call of the run: see RunBudget.ReleaseBeforeRecord).
func (k Keys) Lost(runID string) string { return k.Prefix + "billing:lost:{" + runID + "}" }

// Refused marks admissions of a run that were refused after their COMMIT was sent and not
// answered (a hash of admission tokens): evidence for the reconciler that the hold carrying
// one of those tokens, if it was committed, was never forwarded (Tally.MarkRefused).
func (k Keys) Refused(runID string) string { return k.Prefix + "billing:refused:{" + runID + "}" }

// Lease marks a run as served by a live process.
func (k Keys) Lease(runID string) string { return k.Prefix + "lease:{" + runID + "}" }

// LeaseReleased holds, per process, the last heartbeat whose write of the run's lease a
// release of it has outdated (see Leases.Release).
func (k Keys) LeaseReleased(runID string) string { return k.Prefix + "leaserel:{" + runID + "}" }

// Cancel is the pub/sub channel that asks whichever process serves a run to stop it.
func (k Keys) Cancel(runID string) string { return k.Prefix + "cancel:{" + runID + "}" }

// Cancelled marks a run a newer message of its session replaced, for as long as the run may
// live: the cancel published on Cancel reaches only processes subscribed at that moment, and a
// process whose subscription was down reads the mark when it subscribes again.
func (k Keys) Cancelled(runID string) string { return k.Prefix + "cancelled:{" + runID + "}" }

// Replay holds an idempotent request's stored response.
func (k Keys) Replay(runID string) string { return k.Prefix + "replay:{" + runID + "}" }

// ReplayBytes counts the bytes of a user's answers kept for Idempotency-Key replays, per time
// bucket of their storing: what bounds them per caller (dedup.max_replay_bytes_per_caller).
func (k Keys) ReplayBytes(userID uint64) string {
	return k.Prefix + "replaybytes:{" + strconv.FormatUint(userID, 10) + "}"
}

// SessionDone marks a session's run whose answer is final (its settlement may still be on
// its way).
func (k Keys) SessionDone(runID string) string { return k.Prefix + "sessdone:{" + runID + "}" }

// ResponseContext is how many tokens of context a user's Responses answer or conversation
// (its id) hands on to a request that continues it (previous_response_id, conversation).
func (k Keys) ResponseContext(userID uint64, id string) string {
	return k.Prefix + "respctx:{" + strconv.FormatUint(userID, 10) + "}:" + id
}

// ResponseOwner is the user a Responses answer (its provider id) was made for: the provider
// keeps every caller's answers under the operator's one account, and a continuation of another
// user's answer is refused while this record lasts. Its own slot: the id alone names it.
func (k Keys) ResponseOwner(id string) string {
	return k.Prefix + "respowner:{" + id + "}"
}

// ItemOwner is the user a Responses answer's output item (its provider id) was made for: a
// later request may name the item by its id, and the provider fetches it from what it keeps
// under the operator's one account; one named by another user is refused while this record
// lasts. Its own slot: the id alone names it.
func (k Keys) ItemOwner(id string) string {
	return k.Prefix + "itemowner:{" + id + "}"
}

// SpokenAnswer is how many audio tokens a user's spoken chat answer (its audio id) held, for a
// later request that sends it back to be heard again.
func (k Keys) SpokenAnswer(userID uint64, id string) string {
	return k.Prefix + "spoken:{" + strconv.FormatUint(userID, 10) + "}:" + id
}

// SpokenOwner is the user a spoken chat answer (its provider audio id) was made for: the
// provider keeps every caller's spoken answers under the operator's one account, and one sent
// back by another user is refused while this record lasts. Its own slot: the id alone names it.
func (k Keys) SpokenOwner(id string) string {
	return k.Prefix + "spokenowner:{" + id + "}"
}

// Dedup is the fingerprint window of one user's request body.
func (k Keys) Dedup(userID uint64, bodyHash string) string {
	return k.Prefix + "dedup:{" + strconv.FormatUint(userID, 10) + "}:" + bodyHash
}

// ReconcileLock elects the one process that scans for expired holds.
func (k Keys) ReconcileLock() string { return k.Prefix + "billing:reconcile:lock" }

package holds

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// MaxBatch bounds one batch transaction, settlements and admissions together: its statements
// grow with it, and so does the time its user locks are held.
const MaxBatch = 256

// WriteBatch settles sts and then admits reqs in one transaction, in the global lock order:
// the users' rows of both (in id order, so two batches never wait on each other in a cycle),
// the holds, then the day ledger. Each part decides its items in batch order, as separate
// transactions in that order would.
//
// Settlements go first so that an admission sees the credits they free. Sharing the
// transaction is what lets a caller's next call pay for its previous call's settlement: both
// lock the same user row, and apart they cost two commits in a row on the caller's path (the
// admission waits for the settlement's lock); together they cost one. A batch costs about ten
// statements and one commit whatever its size.
//
// The error is for the whole batch (nothing committed); refusals and unknown runs are per item.
func (s *Store) WriteBatch(ctx context.Context, sts []Settlement, reqs []AdmitRequest) ([]BatchResult, []AdmitResult, error) {
	n := len(sts) + len(reqs)
	if n == 0 || n > MaxBatch {
		panic(fmt.Sprintf("holds: batch of %d settlements and %d admissions", len(sts), len(reqs)))
	}
	for _, st := range sts {
		if st.CostMicro < 0 {
			panic("holds: negative cost")
		}
	}
	for _, req := range reqs {
		if req.State != StateQueued && req.State != StateRunning {
			panic(fmt.Sprintf("holds: admit in state %q", req.State))
		}
		if req.TTL <= 0 {
			panic("holds: admit without a TTL")
		}
	}
	what := batchName(sts, reqs)
	settleUsers, err := s.usersOf(ctx, sts)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	var settled []BatchResult
	var admitted []AdmitResult
	err = s.inTx(ctx, what, func(tx *sqlx.Tx) error {
		ids := make([]uint64, 0, n)
		ids = append(ids, settleUsers...)
		for _, r := range reqs {
			ids = append(ids, r.UserID)
		}
		users, now, err := lockUsers(ctx, tx, distinctNonZero(ids))
		if err != nil {
			return err
		}
		if settled, err = s.settleLocked(ctx, tx, sts, settleUsers, users, now); err != nil {
			return err
		}
		admitted, err = s.admitLocked(ctx, tx, reqs, users, now)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	return settled, admitted, nil
}

// batchName names a batch in errors and logs by its size and first run.
func batchName(sts []Settlement, reqs []AdmitRequest) string {
	first := ""
	if len(sts) > 0 {
		first = sts[0].RunID
	} else {
		first = reqs[0].RunID
	}
	return fmt.Sprintf("batch of %d settlements, %d admissions (first %s)", len(sts), len(reqs), first)
}

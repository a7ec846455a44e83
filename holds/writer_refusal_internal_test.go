package holds

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// TestItemRefusalIsOnlyABatchThatCommittedNothing: the Writer splits a batch whose error is
// an item refusal and runs its parts again, so no error that may follow a commit may count as
// one: a refusal on the retry of a batch whose earlier COMMIT went unanswered (its admissions'
// or settlements' writes perhaps committed) would otherwise be written twice. Nor may an
// outage, a conflict or a deadline, which are every item's and retried as they are.
func TestItemRefusalIsOnlyABatchThatCommittedNothing(t *testing.T) {
	dup := fmt.Errorf("write and commit: %w", &mysql.MySQLError{Number: errDupEntry, Message: "Duplicate entry"})
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"out of range", &mysql.MySQLError{Number: 1264}, true},
		{"duplicate key", dup, true},
		{"panic", fmt.Errorf("batch: %w: boom", errBatchPanicked), true},
		{"admission unanswered before", batchError("batch", dup, map[string]bool{"r": true}, false, true), false},
		{"settlement unanswered before", batchError("batch", dup, map[string]bool{}, true, false), false},
		{"settlement unanswered before, with admissions", batchError("batch", dup, map[string]bool{}, true, true), false},
		{"deadlock", &mysql.MySQLError{Number: errDeadlock}, false},
		{"killed", &serverEndedError{err: &mysql.MySQLError{Number: errConnectionKilled}}, false},
		{"read only", &mysql.MySQLError{Number: errOptionPreventsStatement}, false},
		{"galera node not ready", &mysql.MySQLError{Number: errWsrepNotReady}, false},
		{"disk full", &mysql.MySQLError{Number: errTableFull}, false},
		{"lost connection", mysql.ErrInvalidConn, false},
		{"deadline", context.DeadlineExceeded, false},
		{"none", nil, false},
	} {
		if got := isItemRefusal(tc.err); got != tc.want {
			t.Errorf("%s (%v): item refusal %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

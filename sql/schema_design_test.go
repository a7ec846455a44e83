package sql_test

import (
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/testenv"
)

// TestSchemaFollowsTheDesign: DESIGN §2 and §7 on the migrated schema — money is integer
// micro-USD (every *_micro column a signed BIGINT, signed for the debt prepaid may hold; no
// float, double or decimal column anywhere), every time is DATETIME(6) (no TIMESTAMP, which
// the server converts by its time zone), and the keys the money path stands on: a hold's
// primary key is its run id (a second admission of a run hits it), a day's ledger row is
// (user, day), a session's row (user, session), a grant's idempotency key is unique, a key
// is stored as its SHA-256 (BINARY(32)), and run_holds has the reconciler's index led by
// (state, expires_at) and the admission aggregate's led by (user_id, state). (§7 sketches
// the user's index as (user_id, state, expires_at); migration 020 ends it in settled_at
// instead, for the usage report: the aggregate reads only its (user_id, state) prefix.) Beyond
// the sketch, run_calls is keyed by (run_id, call_id): a named run's call whose record is sent
// again is counted once.
func TestSchemaFollowsTheDesign(t *testing.T) {
	db := testenv.MySQL(t)
	var cols []struct {
		Table, Column, Type, DataType string
	}
	if err := db.Select(&cols, `SELECT table_name AS `+"`table`"+`, column_name AS `+"`column`"+`, column_type AS type, data_type AS datatype
		FROM information_schema.columns WHERE table_schema = DATABASE() ORDER BY table_name, ordinal_position`); err != nil {
		t.Fatal(err)
	}
	if len(cols) < 20 {
		t.Fatalf("only %d columns: not the migrated schema", len(cols))
	}
	micro := 0
	types := map[string]string{}
	for _, c := range cols {
		name := c.Table + "." + c.Column
		types[name] = strings.ToLower(c.Type)
		switch dt := strings.ToLower(c.DataType); {
		case dt == "float" || dt == "double" || dt == "decimal":
			t.Errorf("%s is %s: no floats in money, and no column needs one", name, c.Type)
		case dt == "timestamp" || (dt == "datetime" && strings.ToLower(c.Type) != "datetime(6)"):
			t.Errorf("%s is %s, want DATETIME(6)", name, c.Type)
		}
		if strings.HasSuffix(c.Column, "_micro") {
			micro++
			if strings.ToLower(c.DataType) != "bigint" || strings.Contains(strings.ToLower(c.Type), "unsigned") {
				t.Errorf("%s is %s, want a signed BIGINT of micro-USD", name, c.Type)
			}
		}
	}
	if micro < 10 {
		t.Errorf("only %d *_micro columns", micro)
	}
	for name, want := range map[string]string{
		"api_keys.key_hash": "binary(32)",
		"run_holds.state":   "enum('queued','running','settled')",
	} {
		if types[name] != want {
			t.Errorf("%s is %q, want %q", name, types[name], want)
		}
	}

	var idx []struct {
		Table, Index string
		Unique       bool
		Columns      string
	}
	if err := db.Select(&idx, `SELECT table_name AS `+"`table`"+`, index_name AS `+"`index`"+`, non_unique = 0 AS `+"`unique`"+`,
		GROUP_CONCAT(column_name ORDER BY seq_in_index) AS columns
		FROM information_schema.statistics WHERE table_schema = DATABASE() GROUP BY table_name, index_name, non_unique`); err != nil {
		t.Fatal(err)
	}
	has := func(table, columns string, unique, primary, prefix bool) bool {
		for _, i := range idx {
			if i.Table != table || (primary && i.Index != "PRIMARY") || (unique && !i.Unique) {
				continue
			}
			if i.Columns == columns || (prefix && strings.HasPrefix(i.Columns, columns+",")) {
				return true
			}
		}
		return false
	}
	for _, k := range []struct {
		table, columns          string
		unique, primary, prefix bool
		why                     string
	}{
		{"run_holds", "run_id", true, true, false, "a second admission of a run hits the hold's primary key"},
		{"usage_days", "user_id,day", true, true, false, "one ledger row per user and UTC day"},
		{"sessions", "user_id,session_id", true, true, false, "a session is scoped to its user"},
		{"api_keys", "key_hash", true, true, false, "keys are looked up by their hash"},
		{"grants", "idempotency_key", true, false, false, "a grant retried is credited once"},
		{"run_holds", "state,expires_at", false, false, true, "the reconciler's scan of expired holds"},
		{"run_holds", "user_id,state", false, false, true, "the admission aggregate over a user's live holds"},
		{"run_calls", "run_id,call_id", true, true, false, "a named run's call recorded twice is counted once"},
	} {
		if !has(k.table, k.columns, k.unique, k.primary, k.prefix) {
			t.Errorf("%s has no index on (%s) (unique %v, primary %v, leading %v): %s", k.table, k.columns, k.unique, k.primary, k.prefix, k.why)
		}
	}
}

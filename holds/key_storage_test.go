package holds_test

import (
	"bytes"
	"crypto/sha256"
	"testing"
)

// TestKeysAreStoredAsTheirSHA256: DESIGN §3 step 1 stores a key as its SHA-256 and nothing
// else of it but the prefix key list shows: a copy of the database (a backup, a replica, a
// support dump) must not hand out working keys. Lookups use the same HashKey as creation, so
// no other test noticed when HashKey stored the key's own bytes.
func TestKeysAreStoredAsTheirSHA256(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("kim", "standard")
	key, err := f.store.CreateKey(f.ctx(), u.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256([]byte(key))
	rows, err := f.db.QueryxContext(f.ctx(), "SELECT * FROM api_keys WHERE user_id = ?", u.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		n++
		row := map[string]any{}
		if err := rows.MapScan(row); err != nil {
			t.Fatal(err)
		}
		if h, _ := row["key_hash"].([]byte); !bytes.Equal(h, want[:]) {
			t.Errorf("key_hash = %x, want the key's SHA-256 %x", h, want)
		}
		secret := []byte(key[len(key)-16:]) // past any prefix a listing may show
		for col, v := range row {
			if b, ok := v.([]byte); ok && bytes.Contains(b, secret) {
				t.Errorf("column %s holds the key's secret part: %q", col, b)
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d api_keys rows for the user, want 1", n)
	}
}

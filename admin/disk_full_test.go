package admin_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tollgate/tollgate/admin"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/testenv"
)

// fullDiskAdmin serves the admin handler over a store whose users, api_keys and grants live on a small
// file system of the test's own (it needs root), with the file that fills it once fill is
// called; the store's retry logs are kept.
type fullDiskAdmin struct {
	t      *testing.T
	db     *sqlx.DB
	store  *holds.Store
	url    string
	logs   *observer.ObservedLogs
	filler string
}

func newFullDiskAdmin(t *testing.T) *fullDiskAdmin {
	dir := testenv.SmallFileSystem(t, "1m")
	db := testenv.MySQL(t)
	testenv.TableOn(t, db, "users", dir)
	testenv.TableOn(t, db, "api_keys", dir)
	testenv.TableOn(t, db, "grants", dir)
	t.Cleanup(func() { testenv.CheckLedger(t, db) })
	core, logs := observer.New(zapcore.WarnLevel)
	st := holds.NewStore(db, plans(), "standard", zap.New(core))
	r := chi.NewRouter()
	r.Mount("/admin", admin.New(st, 1000, adminToken, zap.New(core)))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	filler := filepath.Join(dir, "filler")
	// Room is given back before the database's cleanup drops the tables, whatever the test
	// did: left full, InnoDB's purge failed for want of room, and MariaDB 10.11 stops on that.
	t.Cleanup(func() { _ = os.Remove(filler) })
	return &fullDiskAdmin{t: t, db: db, store: st, url: srv.URL, logs: logs, filler: filler}
}

// fill leaves the file system no room; free gives it back.
func (f *fullDiskAdmin) fill() { testenv.Fill(f.t, f.filler) }

func (f *fullDiskAdmin) free() {
	f.t.Helper()
	if err := os.Remove(f.filler); err != nil {
		f.t.Fatal(err)
	}
}

// diskAnswer is an admin answer: its status, Retry-After, error code and body.
type diskAnswer struct {
	status int
	retry  string
	code   string
	body   map[string]any
}

func (f *fullDiskAdmin) send(method, path, body string) diskAnswer {
	req, err := http.NewRequest(method, f.url+path, strings.NewReader(body))
	if err != nil {
		f.t.Error(err)
		return diskAnswer{}
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Error(err)
		return diskAnswer{}
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	a := diskAnswer{status: resp.StatusCode, retry: resp.Header.Get("Retry-After"), body: out}
	if e, ok := out["error"].(map[string]any); ok {
		a.code, _ = e["code"].(string)
	}
	return a
}

// refusals is how many tries of op the store logged refused for a full disk.
func (f *fullDiskAdmin) refusals(op string) int {
	return f.logs.FilterMessage("database disk full, retrying").FilterField(zap.String("op", op)).Len()
}

// maxTries bounds the writes a test sends into a full file system before one must be refused.
const maxTries = 2000

// untilRefused sends write(i) for i = 0, 1, ... while each is answered ok with no refusal of op
// logged: on the full file system, the first that must grow a table is refused. Once that
// refusal is logged, room is made (free), and it returns that write's index and answer.
func (f *fullDiskAdmin) untilRefused(op string, ok int, write func(i int) diskAnswer) (int, diskAnswer) {
	f.t.Helper()
	for i := range maxTries {
		before := f.refusals(op)
		out := make(chan diskAnswer, 1)
		go func() { out <- write(i) }()
		seen := false
		var a diskAnswer
	wait:
		for {
			select {
			case a = <-out:
				break wait
			case <-time.After(time.Millisecond):
				if !seen && f.refusals(op) > before {
					seen = true
					f.free()
				}
			}
		}
		if seen {
			return i, a
		}
		if a.status != ok {
			f.t.Fatalf("%s #%d on a full disk: %d %s %v; want it tried again until there is room", op, i, a.status, a.code, a.body)
		}
	}
	f.t.Fatalf("no %s of %d was refused for a full disk: the test proves nothing", op, maxTries)
	return 0, diskAnswer{}
}

// untilAnswered sends write(i) for i = 0, 1, ... while each is answered ok, and returns the
// index and answer of the first that is not, the disk's refusal. A write that outlasts the
// short deadline before the disk is full (a loaded box: a commit slower than 300 ms) is
// answered 503 with Retry-After: 1, and may have landed, as README says of any write past its
// deadline: that answer is not the one waited for, and the next write is sent.
func (f *fullDiskAdmin) untilAnswered(what string, ok int, write func(i int) diskAnswer) (int, diskAnswer) {
	f.t.Helper()
	for i := range maxTries {
		a := write(i)
		if a.status == http.StatusServiceUnavailable && a.retry == "1" {
			continue
		}
		if a.status != ok {
			return i, a
		}
	}
	f.t.Fatalf("no %s of %d was refused on a full disk: the test proves nothing", what, maxTries)
	return 0, diskAnswer{}
}

func (f *fullDiskAdmin) count(q string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.db.Get(&n, q, args...); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// TestAdminWriteRefusedByAFullDiskRiddenOutThen503: MariaDB refuses a write that must grow a
// table on a full disk at once, 1114 "The table … is full" (README Operating it, Full disks):
// a user's creation, a key's (new rows), and a key's revocation, whole or by prefix (the row
// grows by its revoked_at, and may split its page). The refused statement ran nothing, so each
// is tried again within the request's deadline, as a read_only refusal is: refused at once,
// each answered 500, which told the operator's script the request was broken, for a disk an
// operator frees in a minute. Here users and api_keys live on a small file system of the
// test's own (it needs root), filled up; writes are sent until one is refused, and room is
// made once its refusal is logged: it lands, once. A full disk that outlasts the request's
// deadline is answered 503 billing_unavailable with Retry-After: 30, nothing written.
func TestAdminWriteRefusedByAFullDiskRiddenOutThen503(t *testing.T) {
	userName := func(i int) string { return fmt.Sprintf("fd-user-%05d", i) }
	t.Run("create user", func(t *testing.T) {
		f := newFullDiskAdmin(t)
		f.fill()
		i, a := f.untilRefused("create user", http.StatusCreated, func(i int) diskAnswer {
			return f.send(http.MethodPost, "/admin/users", `{"name":"`+userName(i)+`"}`)
		})
		if a.status != http.StatusCreated {
			t.Errorf("create user refused by a full disk, then given room: %d %s; want 201", a.status, a.code)
		}
		if n := f.count("SELECT COUNT(*) FROM users WHERE name = ?", userName(i)); n != 1 {
			t.Errorf("users named %s: %d; want 1", userName(i), n)
		}
	})
	t.Run("create key", func(t *testing.T) {
		f := newFullDiskAdmin(t)
		f.owner()
		f.fill()
		_, a := f.untilRefused("create key", http.StatusCreated, func(int) diskAnswer {
			return f.send(http.MethodPost, "/admin/users/fd-keys/keys", "")
		})
		made, _ := a.body["key"].(string)
		if a.status != http.StatusCreated || made == "" || f.live(made) != 1 {
			t.Errorf("create key refused by a full disk, then given room: %d %s %v; want 201 and the key shown live", a.status, a.code, a.body)
		}
	})
	t.Run("revoke key", func(t *testing.T) {
		f := newFullDiskAdmin(t)
		f.owner()
		f.fill()
		key := f.refusedRevocation()
		_, a := f.untilRefused("revoke key", http.StatusOK, func(int) diskAnswer {
			return f.send(http.MethodPost, "/admin/keys/revoke", `{"key":"`+key+`"}`)
		})
		if a.status != http.StatusOK || f.live(key) != 0 {
			t.Errorf("revoke key refused by a full disk, then given room: %d %s, key live %d; want 200 and the key revoked",
				a.status, a.code, f.live(key))
		}
	})
	t.Run("revoke keys by prefix", func(t *testing.T) {
		f := newFullDiskAdmin(t)
		f.owner()
		f.fill()
		key := f.refusedRevocation()
		_, a := f.untilRefused("revoke keys by prefix", http.StatusOK, func(int) diskAnswer {
			return f.send(http.MethodPost, "/admin/users/fd-keys/keys/revoke", `{"prefix":"`+holds.ShownPrefix(key)+`"}`)
		})
		if a.status != http.StatusOK || a.body["keys_revoked"] != float64(1) || f.live(key) != 0 {
			t.Errorf("revoke keys by prefix refused by a full disk, then given room: %d %s %v, key live %d; want 200, one revoked",
				a.status, a.code, a.body, f.live(key))
		}
	})

	// A full disk that outlasts the request's deadline: 503 with Retry-After: 30, nothing written.
	defer admin.SetRequestTimeout(300 * time.Millisecond)()
	late := func(t *testing.T, what string, a diskAnswer) {
		t.Helper()
		if a.status != http.StatusServiceUnavailable || a.code != "billing_unavailable" || a.retry != "30" {
			t.Errorf("%s past the request's deadline on a full disk: %d %s (Retry-After %q); want 503 billing_unavailable, Retry-After: 30",
				what, a.status, a.code, a.retry)
		}
	}
	t.Run("past the deadline, creation", func(t *testing.T) {
		f := newFullDiskAdmin(t)
		f.owner()
		f.fill()
		i, a := f.untilAnswered("create user", http.StatusCreated, func(i int) diskAnswer {
			return f.send(http.MethodPost, "/admin/users", `{"name":"`+userName(i)+`"}`)
		})
		late(t, "create user", a)
		if n := f.count("SELECT COUNT(*) FROM users WHERE name = ?", userName(i)); n != 0 {
			t.Errorf("users made by the refused create: %d; want none", n)
		}
		before := 0
		_, a = f.untilAnswered("create key", http.StatusCreated, func(int) diskAnswer {
			before = f.count("SELECT COUNT(*) FROM api_keys")
			return f.send(http.MethodPost, "/admin/users/fd-keys/keys", "")
		})
		late(t, "create key", a)
		if n := f.count("SELECT COUNT(*) FROM api_keys"); n != before {
			t.Errorf("keys after the refused create: %d; want %d (none made)", n, before)
		}
	})
	t.Run("past the deadline, revocation", func(t *testing.T) {
		f := newFullDiskAdmin(t)
		f.owner()
		f.fill()
		key := f.refusedRevocation()
		late(t, "revoke key", f.send(http.MethodPost, "/admin/keys/revoke", `{"key":"`+key+`"}`))
		if f.live(key) != 1 {
			t.Errorf("the key of the refused revocation is no longer live")
		}
	})
}

// owner makes the user fd-keys, whose keys the tests make and revoke.
func (f *fullDiskAdmin) owner() {
	f.t.Helper()
	if _, err := f.store.CreateUser(context.Background(), "fd-keys", "standard"); err != nil {
		f.t.Fatal(err)
	}
}

// live is 1 when key is stored and not revoked, else 0.
func (f *fullDiskAdmin) live(key string) int {
	h := holds.HashKey(key)
	return f.count("SELECT COUNT(*) FROM api_keys WHERE key_hash = ? AND revoked_at IS NULL", h[:])
}

// refusedRevocation stores keys of fd-keys by statements of the test's own until the full file
// system refuses one, then revokes them one by one until it refuses a revocation (which grows
// its key's row by revoked_at), and returns that key: its page has less room than its
// revocation needs, and there is none to split it into, so the same revocation sent again is
// refused again while the disk stays full. On a new table the keys' single page fills first.
func (f *fullDiskAdmin) refusedRevocation() string {
	f.t.Helper()
	var keys []string
	for range maxTries {
		key := randomKey()
		h := holds.HashKey(key)
		_, err := f.db.Exec("INSERT INTO api_keys (key_hash, user_id, prefix) SELECT ?, id, ? FROM users WHERE name = 'fd-keys'",
			h[:], holds.ShownPrefix(key))
		if isFull(err) {
			break
		}
		if err != nil {
			f.t.Fatal(err)
		}
		keys = append(keys, key)
	}
	for _, key := range keys {
		h := holds.HashKey(key)
		_, err := f.db.Exec("UPDATE api_keys SET revoked_at = NOW(6) WHERE key_hash = ?", h[:])
		if isFull(err) {
			return key
		}
		if err != nil {
			f.t.Fatal(err)
		}
	}
	f.t.Fatalf("none of %d revocations refused on a full disk: the test proves nothing", len(keys))
	return ""
}

func isFull(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "1114") || strings.Contains(err.Error(), "1021"))
}

// randomKey is a key as the store makes them.
func randomKey() string {
	var raw [24]byte
	_, _ = rand.Read(raw[:])
	return holds.KeyPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
}

// TestAdminUserChangeAndGrantRefusedByAFullDiskRiddenOut: a user's disabling and a change of
// their plan or overrides grow the user's row (disabled_at, an override set where there was
// none), which may split its page, and a grant is a new row: on a full disk MariaDB refuses
// each at once, 1114. As a user's creation is, each is tried again within the request's
// deadline, and lands once there is room, where it answered 500 at once (a payment's webhook
// then retried by its provider on its own schedule).
func TestAdminUserChangeAndGrantRefusedByAFullDiskRiddenOut(t *testing.T) {
	t.Run("disable user", func(t *testing.T) {
		f := newFullDiskAdmin(t)
		f.fill()
		name := f.refusedDisable()
		_, a := f.untilRefused("disable user", http.StatusOK, func(int) diskAnswer {
			return f.send(http.MethodPost, "/admin/users/"+name+"/disable", "")
		})
		if a.status != http.StatusOK || a.body["changed"] != true ||
			f.count("SELECT COUNT(*) FROM users WHERE name = ? AND disabled_at IS NOT NULL", name) != 1 {
			t.Errorf("disable user refused by a full disk, then given room: %d %s %v; want 200, changed, the user disabled", a.status, a.code, a.body)
		}
	})
	t.Run("change user", func(t *testing.T) {
		f := newFullDiskAdmin(t)
		f.fill()
		name := f.refusedDisable() // its page has no room for an override either
		_, a := f.untilRefused("change user", http.StatusOK, func(int) diskAnswer {
			return f.send(http.MethodPatch, "/admin/users/"+name, `{"allowance":"5","max_in_flight":3}`)
		})
		if a.status != http.StatusOK || f.count("SELECT COUNT(*) FROM users WHERE name = ? AND allowance_micro = 5000 AND max_in_flight = 3", name) != 1 {
			t.Errorf("change user refused by a full disk, then given room: %d %s %v; want 200 and the overrides set", a.status, a.code, a.body)
		}
	})
	t.Run("grant", func(t *testing.T) {
		f := newFullDiskAdmin(t)
		f.owner()
		f.fill()
		payment := func(i int) string { return fmt.Sprintf("fd-pay-%05d", i) }
		i, a := f.untilRefused("grant", http.StatusCreated, func(i int) diskAnswer {
			return f.send(http.MethodPost, "/admin/users/fd-keys/grants", `{"amount":"1","idempotency_key":"`+payment(i)+`"}`)
		})
		if a.status != http.StatusCreated || f.count("SELECT COUNT(*) FROM grants WHERE idempotency_key = ?", payment(i)) != 1 {
			t.Errorf("grant refused by a full disk, then given room: %d %s %v; want 201 and one grant row", a.status, a.code, a.body)
		}
		if n := f.count("SELECT prepaid_micro FROM users WHERE name = 'fd-keys'"); n != (i+1)*1000 {
			t.Errorf("prepaid after %d grants of 1 credit: %d micro-USD; want %d (each once)", i+1, n, (i+1)*1000)
		}
	})
}

// refusedDisable makes users by statements of the test's own until the full file system
// refuses one, then disables them one by one until it refuses that (disabled_at set grows the
// row), and returns that user's name: its page has less room than the change needs, and there
// is none to split it into, so any change that grows its row is refused while the disk stays
// full. On a new table the users' single page fills first.
func (f *fullDiskAdmin) refusedDisable() string {
	f.t.Helper()
	var names []string
	for i := range maxTries {
		name := fmt.Sprintf("fd-full-%05d", i)
		_, err := f.db.Exec("INSERT INTO users (name, plan) VALUES (?, 'standard')", name)
		if isFull(err) {
			break
		}
		if err != nil {
			f.t.Fatal(err)
		}
		names = append(names, name)
	}
	for _, name := range names {
		_, err := f.db.Exec("UPDATE users SET disabled_at = NOW(6) WHERE name = ?", name)
		if isFull(err) {
			// Enabled again by the refusal: the statement ran nothing.
			return name
		}
		if err != nil {
			f.t.Fatal(err)
		}
	}
	f.t.Fatalf("none of %d users' disabling refused on a full disk: the test proves nothing", len(names))
	return ""
}

package proxy_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
	"github.com/tollgate/tollgate/proxy"
)

// TestRedisMisconfRefusesWritesAndChargesOnce: a Redis whose snapshot failed
// (stop-writes-on-bgsave-error, the default, with a full or lost disk) answers reads and
// refuses every write with MISCONF — DEL, EXPIRE and PING included, which a full Redis
// (noeviction, TestFullRedisRefusesWritesAndNothingIsChargedTwice) still takes. New calls are
// refused before they run (503), calls in flight at the onset, a plain stream and a named run's
// call, are each charged what they used, once, and once snapshots work again the gateway takes
// calls and the named run settles at what its call used. An Idempotency-Key call runs without
// its record and its retry is not run again, as on a full Redis.
func TestRedisMisconfRefusesWritesAndChargesOnce(t *testing.T) {
	h, m := newHarnessOnMisconfRedis(t, shortLeases)
	refusingRedisChargesOnce(t, h, m)
}

// TestRedisFullWhileCallsRunChargesOnce: TestRedisMisconfRefusesWritesAndChargesOnce on a Redis
// under noeviction put over its maxmemory (OOM) while calls run, then given room.
func TestRedisFullWhileCallsRunChargesOnce(t *testing.T) {
	h, f := newHarnessOnFillableRedis(t, shortLeases)
	refusingRedisChargesOnce(t, h, f)
}

// shortLeases lets a run whose call's lease Redis refused to delete settle soon after Redis
// takes writes again.
func shortLeases(c *config.Config) {
	c.Holds.LeaseTTL, c.Holds.HeartbeatInterval = 3*time.Second, time.Second
}

// writeRefuser makes a gateway's Redis refuse writes, and take them again.
type writeRefuser interface {
	fail(t *testing.T)
	recover(t *testing.T)
}

func refusingRedisChargesOnce(t *testing.T, h *harness, m writeRefuser) {
	u, key := h.user("standard")
	const body = `{"model":"fake-gpt","max_tokens":100,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Stream to the billing team, please."}]}`
	// The calls in flight at the onset last 3 s; the controls, the same answer, none.
	knobs := func(run string, interval string) map[string]string {
		hdr := map[string]string{fakellm.HeaderChunks: "60", fakellm.HeaderChunkInterval: interval}
		if run != "" {
			hdr["X-Run-Id"] = run
		}
		return hdr
	}
	// The control: the same calls with Redis writing.
	plain := sendOK(t, "control call", h.gw.URL, key, body, knobs("", "0s"))
	want := h.run(u.ID, plain.header.Get(proxy.RunIDHeader)).ChargedMicro
	sendOK(t, "control run's call", h.gw.URL, key, body, knobs("ctl", "0s"))
	if status, out := h.settleRun(key, "ctl"); status != 200 {
		t.Fatalf("control run's settle: %d %s", status, out)
	}
	wantRun := h.runByName(u.ID, "ctl").ChargedMicro
	if want == 0 || wantRun == 0 {
		t.Fatalf("control charges %d and %d", want, wantRun)
	}

	// Two streams in flight when Redis starts refusing writes.
	open := func(run string) (*http.Response, *bufio.Reader) {
		resp := h.post(key, "/v1/chat/completions", body, knobs(run, "50ms"))
		if resp.StatusCode != 200 {
			t.Fatalf("%q: %d %s", run, resp.StatusCode, readAll(t, resp.Body))
		}
		rd := bufio.NewReader(resp.Body)
		if _, err := rd.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		return resp, rd
	}
	plainResp, plainRd := open("")
	defer plainResp.Body.Close()
	runResp, runRd := open("agent-m")
	defer runResp.Body.Close()
	m.fail(t)

	refusedUnforwarded(t, h, key, "refusing writes", nil, 503, "dedup_unavailable")
	refusedUnforwarded(t, h, key, "refusing writes", map[string]string{"X-Run-Id": "agent-2"}, 503, "billing_unavailable")
	refusedUnforwarded(t, h, key, "refusing writes", map[string]string{"X-Run-Id": "agent-m"}, 503, "billing_unavailable")

	for _, rd := range []*bufio.Reader{plainRd, runRd} {
		rest, err := io.ReadAll(rd)
		if err != nil || !strings.Contains(string(rest), "[DONE]") {
			t.Fatalf("stream in flight at the onset: %v, ends %q", err, tail(rest))
		}
	}
	// Not h.settled(): the named run's tally is tried again until settle_timeout.
	plainID := plainResp.Header.Get(proxy.RunIDHeader)
	h.waitSettled(plainID, 10*time.Second, "its answer ended")
	got, err := h.store.Run(context.Background(), u.ID, plainID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != holds.StateSettled || got.ChargedMicro != want {
		t.Errorf("plain stream in flight at the onset: %s charged %d, want settled at %d", got.State, got.ChargedMicro, want)
	}
	// An Idempotency-Key call runs without its record (its hold row stands for it) and is not
	// run again on retry.
	idem := map[string]string{"Idempotency-Key": "misconf-1"}
	first := sendOK(t, "Idempotency-Key call with Redis refusing writes", h.gw.URL, key, chatBody, idem)
	idemID := first.header.Get(proxy.RunIDHeader)
	h.waitSettled(idemID, 10*time.Second, "its answer ended")
	refusedUnforwarded(t, h, key, "refusing writes", idem, 409, "idempotent_response_lost")

	resp, err := http.Get(h.gw.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	if out := readAll(t, resp.Body); resp.StatusCode != 503 || !strings.Contains(string(out), `"redis":"unavailable"`) {
		t.Errorf("/readyz with Redis refusing writes: %d %s", resp.StatusCode, out)
	}
	resp.Body.Close()

	// Redis takes writes again: calls are taken, and the run settles at what its one call used.
	m.recover(t)
	sendOK(t, "a call once Redis writes again", h.gw.URL, key, chatBody, nil)
	refusedUnforwarded(t, h, key, "refusing writes", idem, 409, "idempotent_response_lost")
	deadline := time.Now().Add(15 * time.Second)
	for {
		status, out := h.settleRun(key, "agent-m")
		if status == 200 {
			break
		}
		if status != 409 || errorCode(t, out) != "run_busy" || time.Now().After(deadline) {
			t.Fatalf("settle of the run whose call was in flight at the onset: %d %s", status, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := h.runByName(u.ID, "agent-m").ChargedMicro; got != wantRun {
		t.Errorf("run whose call was in flight at the onset charged %d, want %d", got, wantRun)
	}
	var charged int
	if err := h.db.Get(&charged, "SELECT COUNT(*) FROM run_holds WHERE user_id = ? AND charged_micro > 0", u.ID); err != nil {
		t.Fatal(err)
	}
	// The controls, the two streams, the Idempotency-Key call and the call once Redis wrote again.
	if charged != 6 {
		t.Errorf("%d runs charged, want 6", charged)
	}
}

// runByName is the settled hold of the user's named run.
func (h *harness) runByName(userID uint64, name string) holds.Run {
	h.t.Helper()
	var id string
	if err := h.db.Get(&id, "SELECT run_id FROM run_holds WHERE user_id = ? AND client_run_id = ?", userID, name); err != nil {
		h.t.Fatalf("run %s: %v", name, err)
	}
	return h.run(userID, id)
}

// misconf drives a private Redis into and out of MISCONF: a snapshot (BGSAVE) that cannot
// write its file, as on a full or lost disk, with stop-writes-on-bgsave-error (the default).
type misconf struct {
	rdb *redis.Client
	dir string
}

// newHarnessOnMisconfRedis is a harness whose gateway's Redis is a private one that saves
// snapshots; m makes its next snapshot fail, and work again.
func newHarnessOnMisconfRedis(t *testing.T, mutate func(*config.Config)) (*harness, *misconf) {
	t.Helper()
	h, rdb := newHarnessOnPrivateRedis(t, mutate, "--save", "3600 1", "--enable-protected-configs", "yes")
	return h, &misconf{rdb: rdb, dir: t.TempDir()}
}

// newHarnessOnPrivateRedis is a harness whose gateway's Redis is a private one started with
// args; rdb is a client of it for the test.
func newHarnessOnPrivateRedis(t *testing.T, mutate func(*config.Config), args ...string) (h *harness, rdb *redis.Client) {
	t.Helper()
	opt, err := redis.ParseURL(testenv.PrivateRedisURL(t, args...))
	if err != nil {
		t.Fatal(err)
	}
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, opt.Addr)
	}
	h = newHarnessOn(t, harnessSetup{redisDialer: dial, tallyDialer: dial, contextTimeouts: true}, mutate)
	rdb = redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return h, rdb
}

// fillable is a private Redis under noeviction that the test puts far over its maxmemory, and
// under it again. Far over: a Redis just at its limit takes writes again as soon as anything
// frees a few bytes (a client's buffer, a key deleted), which the calls in flight do.
type fillable struct{ rdb *redis.Client }

func newHarnessOnFillableRedis(t *testing.T, mutate func(*config.Config)) (*harness, *fillable) {
	t.Helper()
	h, rdb := newHarnessOnPrivateRedis(t, mutate, "--maxmemory-policy", "noeviction")
	return h, &fillable{rdb: rdb}
}

// fail writes 4 MB and sets maxmemory to 1 MB: every write that may add memory is refused
// with OOM.
func (f *fillable) fail(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	junk := strings.Repeat("x", 10_000)
	p := f.rdb.Pipeline()
	for range 400 {
		p.Set(ctx, "junk:"+testenv.RandomID(8), junk, 0)
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.rdb.ConfigSet(ctx, "maxmemory", "1mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.rdb.Set(ctx, "oom-probe", "1", time.Minute).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM ") {
		t.Fatalf("a write over maxmemory: %v, want OOM", err)
	}
}

// recover lifts the limit.
func (f *fillable) recover(t *testing.T) {
	t.Helper()
	if err := f.rdb.ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
}

// fail points the server's snapshots at a directory it then removes and saves: the save fails,
// and every write after it is refused until a save works.
func (m *misconf) fail(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	gone := filepath.Join(m.dir, "gone")
	if err := os.Mkdir(gone, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := m.rdb.ConfigSet(ctx, "dir", gone).Err(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	m.save(t, "err")
	if err := m.rdb.Set(ctx, "misconf-probe", "1", time.Minute).Err(); err == nil || !strings.HasPrefix(err.Error(), "MISCONF") {
		t.Fatalf("a write after the failed save: %v, want MISCONF", err)
	}
}

// recover points snapshots at a directory that exists and saves.
func (m *misconf) recover(t *testing.T) {
	t.Helper()
	if err := m.rdb.ConfigSet(context.Background(), "dir", m.dir).Err(); err != nil {
		t.Fatal(err)
	}
	m.save(t, "ok")
}

// save runs a BGSAVE to its end and checks its status.
func (m *misconf) save(t *testing.T, want string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	started := false
	for time.Now().Before(deadline) {
		if !started {
			started = m.rdb.BgSave(ctx).Err() == nil
		}
		info, err := m.rdb.Info(ctx, "persistence").Result()
		if err != nil {
			t.Fatal(err)
		}
		if started && strings.Contains(info, "rdb_bgsave_in_progress:0") {
			if !strings.Contains(info, "rdb_last_bgsave_status:"+want) {
				t.Fatalf("snapshot ended not %s:\n%s", want, info)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("snapshot did not end %s within 10 s", want)
}

package testenv

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// lossyRedisProbe is a client through a new lossy network, as the gateway's (go-redis's
// retries: MaxRetries 3), a plain client around it, and a key of this test's own.
func lossyRedisProbe(t *testing.T) (*redis.Client, *LossyRedis, *redis.Client, string) {
	t.Helper()
	plain, prefix := Redis(t)
	opt, lossy := LossyRedisOptions(t)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return rdb, lossy, plain, prefix + "lossy-probe"
}

// incrLua counts its runs in KEYS[1].
const incrLua = "return redis.call('INCR', KEYS[1])"

// TestLossyRedisLostReplyOfACommandIsResent: Redis runs a script whose reply is lost, and
// go-redis sends it again, as it does in production: the script runs twice and the client
// sees the second answer. A lost request does not run; its resend does, once.
func TestLossyRedisLostReplyOfACommandIsResent(t *testing.T) {
	for _, c := range []struct {
		name string
		loss RedisLoss
		want int64
	}{
		{"reply lost", RedisReplyLost, 2},
		{"request lost", RedisRequestLost, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb, lossy, plain, key := lossyRedisProbe(t)
			ctx := context.Background()
			lossy.Arm(key, c.loss, 1)
			got, err := rdb.Eval(ctx, incrLua, []string{key}).Int64()
			if lossy.Fired() != 1 {
				t.Fatalf("%d writes lost, want 1", lossy.Fired())
			}
			if err != nil || got != c.want {
				t.Fatalf("script with a %s, resent by go-redis: %d, %v; want %d", c.name, got, err, c.want)
			}
			if n, err := plain.Get(ctx, key).Int64(); err != nil || n != c.want {
				t.Fatalf("runs of the script: %d, %v; want %d", n, err, c.want)
			}
		})
	}
}

// TestLossyRedisLostReplyOfATransactionHasRunItAll: the reply of a MULTI/EXEC is lost only
// once Redis has run all of it, its EXEC included; go-redis does not resend a transaction, so
// the caller sees the loss. Its request lost, nothing of it runs.
func TestLossyRedisLostReplyOfATransactionHasRunItAll(t *testing.T) {
	for _, c := range []struct {
		name string
		loss RedisLoss
		want int64
	}{
		{"reply lost", RedisReplyLost, 2},
		{"request lost", RedisRequestLost, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb, lossy, plain, key := lossyRedisProbe(t)
			ctx := context.Background()
			lossy.Arm(key, c.loss, 1)
			_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Incr(ctx, key)
				p.Eval(ctx, incrLua, []string{key})
				p.Expire(ctx, key, time.Minute)
				return nil
			})
			if lossy.Fired() != 1 || err == nil {
				t.Fatalf("transaction with a %s: %d lost, %v; want one lost and an error", c.name, lossy.Fired(), err)
			}
			// Read the moment the caller saw the loss: it may look at once.
			n, err := plain.Get(ctx, key).Int64()
			if errors.Is(err, redis.Nil) {
				n, err = 0, nil
			}
			if err != nil || n != c.want {
				t.Fatalf("the transaction's key: %d, %v; want %d", n, err, c.want)
			}
		})
	}
}

// TestLossyRedisLosesEveryAttemptArmed: armed for go-redis's every attempt (MaxRetries+1), a
// command fails with every reply lost, each write having run; the next write is not lost.
func TestLossyRedisLosesEveryAttemptArmed(t *testing.T) {
	rdb, lossy, plain, key := lossyRedisProbe(t)
	ctx := context.Background()
	attempts := rdb.Options().MaxRetries + 1
	lossy.Arm(key, RedisReplyLost, attempts)
	if err := rdb.Eval(ctx, incrLua, []string{key}).Err(); err == nil {
		t.Fatal("a script whose every reply was lost answered")
	}
	if lossy.Fired() != attempts {
		t.Fatalf("%d writes lost, want %d", lossy.Fired(), attempts)
	}
	if n, err := plain.Get(ctx, key).Int64(); err != nil || n != int64(attempts) {
		t.Fatalf("runs of the script: %d, %v; want %d", n, err, attempts)
	}
	if got, err := rdb.Eval(ctx, incrLua, []string{key}).Int64(); err != nil || got != int64(attempts)+1 {
		t.Fatalf("the write after the losses: %d, %v; want %d", got, err, attempts+1)
	}
}

// TestLossyRedisFailsLoudlyWhenRedisNeverAnswers: a marked write Redis does not answer by the
// deadline fails the test, with a message that says so, rather than staging the loss of a
// reply to a command that has not run. That the wait ended at its deadline, not at Redis's
// answer 3 s later, is in the message: no reply had been read.
func TestLossyRedisFailsLoudlyWhenRedisNeverAnswers(t *testing.T) {
	rec := &errorRecorder{TB: t}
	plain, prefix := Redis(t)
	lossy := NewLossyRedis(rec)
	lossy.limit = 300 * time.Millisecond
	opt := *plain.Options()
	opt.Dialer, opt.MaxRetries = lossy.Dial, -1
	rdb := redis.NewClient(&opt)
	t.Cleanup(func() { rdb.Close() })
	key := prefix + "lossy-never"
	lossy.Arm(key, RedisReplyLost, 1)
	// Redis answers a BLPOP of an empty list only after its 3 s.
	err := rdb.BLPop(context.Background(), 3*time.Second, key).Err()
	if err == nil {
		t.Fatal("the marked command answered")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "0 of the 1 replies") {
		t.Fatalf("errors reported to the test: %q; want one saying no reply came", rec.errs)
	}
}

// lateRedisProbe is lossyRedisProbe with a short read timeout: a write held late costs the
// client that long, and go-redis then goes on as in production.
func lateRedisProbe(t *testing.T) (*redis.Client, *LossyRedis, *redis.Client, string) {
	t.Helper()
	plain, prefix := Redis(t)
	opt, lossy := LossyRedisOptions(t)
	opt.ReadTimeout = 300 * time.Millisecond
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return rdb, lossy, plain, prefix + "late-probe"
}

// runs reads the count incrLua keeps in key.
func runs(t *testing.T, plain *redis.Client, key string) int64 {
	t.Helper()
	n, err := plain.Get(context.Background(), key).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return n
}

// TestLossyRedisLateCommandRunsAfterItsResend: a script held late times the client out;
// go-redis sends it again on a new connection, which runs and answers. Redis has not seen the
// held write until Deliver, and runs it then, after its resend: twice in all.
func TestLossyRedisLateCommandRunsAfterItsResend(t *testing.T) {
	rdb, lossy, plain, key := lateRedisProbe(t)
	ctx := context.Background()
	lossy.Arm(key, RedisWriteLate, 1)
	got, err := rdb.Eval(ctx, incrLua, []string{key}).Int64()
	if err != nil || got != 1 || lossy.Fired() != 1 {
		t.Fatalf("script held late, resent by go-redis: %d, %v, %d held; want 1, one held", got, err, lossy.Fired())
	}
	w := lossy.AwaitLate()
	if n := runs(t, plain, key); n != 1 {
		t.Fatalf("runs before the late write is delivered: %d, want 1", n)
	}
	w.Deliver()
	if n := runs(t, plain, key); n != 2 {
		t.Fatalf("runs once the late write is delivered: %d, want 2", n)
	}
}

// TestLossyRedisLateTransactionFailsThenRunsWhole: go-redis does not resend a MULTI/EXEC held
// late: the caller sees a timeout, nothing of it has run, and it all runs once delivered.
func TestLossyRedisLateTransactionFailsThenRunsWhole(t *testing.T) {
	rdb, lossy, plain, key := lateRedisProbe(t)
	ctx := context.Background()
	lossy.Arm(key, RedisWriteLate, 1)
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Incr(ctx, key)
		p.Eval(ctx, incrLua, []string{key})
		return nil
	})
	if err == nil || lossy.Fired() != 1 {
		t.Fatalf("transaction held late: %v, %d held; want an error, one held", err, lossy.Fired())
	}
	w := lossy.AwaitLate()
	if n := runs(t, plain, key); n != 0 {
		t.Fatalf("runs before the late transaction is delivered: %d, want 0", n)
	}
	w.Deliver()
	if n := runs(t, plain, key); n != 2 {
		t.Fatalf("runs once the late transaction is delivered: %d, want 2", n)
	}
}

// TestLossyRedisLateEveryAttemptFailsThenRunsEach: held late at every attempt, a command
// fails; each attempt runs when delivered, in the order the test delivers them.
func TestLossyRedisLateEveryAttemptFailsThenRunsEach(t *testing.T) {
	rdb, lossy, plain, key := lateRedisProbe(t)
	ctx := context.Background()
	attempts := rdb.Options().MaxRetries + 1
	lossy.Arm(key, RedisWriteLate, attempts)
	if err := rdb.Eval(ctx, incrLua, []string{key}).Err(); err == nil {
		t.Fatal("a script held late at every attempt answered")
	}
	if lossy.Fired() != attempts {
		t.Fatalf("%d writes held late, want %d", lossy.Fired(), attempts)
	}
	held := make([]*LateWrite, attempts)
	for i := range held {
		held[i] = lossy.AwaitLate()
	}
	if n := runs(t, plain, key); n != 0 {
		t.Fatalf("runs before any late write is delivered: %d, want 0", n)
	}
	for i := len(held) - 1; i >= 0; i-- {
		held[i].Deliver()
		if n := runs(t, plain, key); n != int64(attempts-i) {
			t.Fatalf("runs after %d late writes delivered: %d", attempts-i, n)
		}
	}
	if got, err := rdb.Eval(ctx, incrLua, []string{key}).Int64(); err != nil || got != int64(attempts)+1 {
		t.Fatalf("the write after the late ones: %d, %v; want %d", got, err, attempts+1)
	}
}

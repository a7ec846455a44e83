package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/redis/go-redis/v9"
	"github.com/tollgate/tollgate/holds"
)

// lockedBuffer collects a logger's output.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) Sync() error { return nil }

// count is how many lines of out carry msg.
func (b *lockedBuffer) count(t *testing.T, msg string) int {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if m["msg"] == msg {
			n++
		}
	}
	return n
}

// TestLoggerSamplesFloodsButKeepsErrorsAndMoneyLines: a flood of one refusal (a client sending
// bad requests as fast as it can) is sampled, so it cannot fill the disk; an ERROR line is
// never dropped — a failed tally of a named run is the only record of that call's usage, a
// failed settlement and a charge at the hold are what an operator must see — nor is a line of
// the money logger (the reconciler's charges, grants, lost admissions' releases). The
// production sampler of zap kept the first 100 lines of a message each second and then every
// 100th, ERROR lines included.
func TestLoggerSamplesFloodsButKeepsErrorsAndMoneyLines(t *testing.T) {
	var out lockedBuffer
	log := newLogger(false, &out).With(zap.String("instance", "test"))
	const n = 1000
	for i := range n {
		log.Info("request refused", zap.Int("i", i))
		log.Error("settlement failed; the reconciler will settle this run", zap.Int("i", i))
		log.Named(holds.MoneyLog).Info("reconcile: run settled", zap.Int("i", i))
	}
	if got := out.count(t, "settlement failed; the reconciler will settle this run"); got != n {
		t.Errorf("%d of %d ERROR lines written", got, n)
	}
	if got := out.count(t, "reconcile: run settled"); got != n {
		t.Errorf("%d of %d money lines written", got, n)
	}
	if got := out.count(t, "request refused"); got >= n/2 {
		t.Errorf("%d of %d lines of one refusal written; a flood is not sampled", got, n)
	}
}

// TestLoggerDebugLevel: -debug writes DEBUG lines, which are otherwise left out.
func TestLoggerDebugLevel(t *testing.T) {
	for _, debug := range []bool{false, true} {
		var out lockedBuffer
		newLogger(debug, &out).Debug("settled")
		if got := out.count(t, "settled") == 1; got != debug {
			t.Errorf("debug %v: DEBUG line written %v", debug, got)
		}
	}
}

// TestLibraryLogsAreJSONLines: the Redis client logs on its own when its pool cannot dial, and
// the MySQL driver when a connection breaks; by default both print plain text on stderr,
// between the gateway's JSON lines. Routed, each is a line of the gateway's logger.
func TestLibraryLogsAreJSONLines(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	routeLibraryLogs(zap.New(core))
	t.Cleanup(func() { routeLibraryLogs(zap.NewNop()) })

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err == nil {
		t.Fatal("a ping to a closed port succeeded")
	}
	// A server that sends half a greeting and hangs up: the driver logs the short read.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte{0x40, 0, 0, 0, 10}) // a packet header promising 64 bytes, then one
			c.Close()
		}
	}()
	db, err := sql.Open("mysql", "u:p@tcp("+ln.Addr().String()+")/db?timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Ping(); err == nil {
		t.Fatal("a ping to a server that hangs up succeeded")
	}

	var redisLine, mysqlLine bool
	for _, e := range logs.All() {
		detail, _ := e.ContextMap()["detail"].(string)
		switch {
		case e.LoggerName == "redis" && e.Message == "redis client" && strings.Contains(detail, "failed to dial"):
			redisLine = true
		case e.LoggerName == "mysql" && e.Message == "mysql client" && detail != "":
			mysqlLine = true
		}
	}
	if !redisLine || !mysqlLine {
		t.Fatalf("library lines routed: redis %v, mysql %v; got %+v", redisLine, mysqlLine, logs.All())
	}
}

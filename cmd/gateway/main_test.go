package main

import (
	"context"
	"errors"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The gateway's Redis pool is sized for many concurrent calls unless redis_url says otherwise.
func TestRedisPoolSize(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want int
	}{
		{"redis://127.0.0.1:6379/0", defaultRedisPoolSize},
		{"redis://127.0.0.1:6379/0?pool_size=7", 7},
	} {
		opt, err := redisOptions(tc.url)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		if opt.PoolSize != tc.want {
			t.Errorf("%s: pool size %d, want %d", tc.url, opt.PoolSize, tc.want)
		}
	}
	if _, err := redisOptions("http://nope"); err == nil {
		t.Error("a URL that is not redis:// was accepted")
	}
}

// TestRedisCallEndsAtItsContextDeadline: the deadlines the gateway puts on its Redis calls
// (the tally's, the fingerprint's, a continuation lookup's) are what bound them against a
// Redis that stalls. go-redis by default waits its own read timeout instead (3 s, with
// retries on top): a stalled Redis held a caller's answer 5–10 s. Against a server that takes
// the command and never answers, with no read timeout of the client's own, a call must end
// when its context does; without the option it waited for good (the bound below is a
// watchdog, fifty times the deadline, not a measure of speed).
func TestRedisCallEndsAtItsContextDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	defer func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn) // read nothing back, answer nothing: a stalled Redis
			mu.Unlock()
		}
	}()
	opt, err := redisOptions("redis://" + ln.Addr().String() + "/0?read_timeout=-1&max_retries=-1")
	if err != nil {
		t.Fatal(err)
	}
	opt.DisableIdentity = true // no CLIENT SETINFO handshake: the first command is ours
	opt.Protocol = 2           // nor HELLO
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- rdb.Get(ctx, "k").Err() }()
	select {
	case err := <-done:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("a call to a stalled Redis ended with %v, want the timeout of its context's deadline", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a call to a stalled Redis outlived its context's 100 ms deadline by seconds")
	}
}

// TestCommandFamilyWithoutSubcommandNamesThem: `gateway user` (or `gateway key -user bob`,
// the subcommand forgotten) answered `unknown command "user"` / `"key -user"` for commands the
// README lists: it now names the subcommands the family has.
func TestCommandFamilyWithoutSubcommandNamesThem(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"user"}, "create, list, show, set, disable, enable"},
		{[]string{"user", "-name", "bob"}, "create, list, show, set, disable, enable"},
		{[]string{"key"}, "create, list, revoke"},
		{[]string{"key", "-user", "bob"}, "create, list, revoke"},
	} {
		err := run(tc.args)
		if err == nil || strings.Contains(err.Error(), "unknown command") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("gateway %s: %v, want it to name the subcommands %s", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}

// TestStrayArgumentIsRefused: every value of a command is a flag, and Go's flag package stops
// at the first word that is not one. `gateway user create alice` went on with no -name and
// said `create user "": name must be …`; `gateway key create alice` said `user "": unknown
// user`; and `gateway runs extra -limit 1` printed a page of 100, the -limit after the stray
// word dropped without a word. A stray argument now stops the command before it opens
// anything, naming it.
func TestStrayArgumentIsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"user", "create", "alice"},
		{"key", "create", "alice"},
		{"runs", "alice", "-limit", "1"},
		{"user", "create", "-name", "alice", "alice"},
		{"balance", "alice"},
		{"reconcile", "once"},
		// Refused before the config is read: the stray word is the mistake to name, not a
		// config file the command never needed to open.
		{"balance", "-config", "/nonexistent/tollgate.yaml", "alice"},
	} {
		err := run(args)
		if err == nil || !strings.Contains(err.Error(), `unexpected argument "alice"`) &&
			!strings.Contains(err.Error(), `unexpected argument "once"`) {
			t.Errorf("gateway %s: %v, want the stray argument refused by name", strings.Join(args, " "), err)
		}
	}
}

// TestMigrateLockWaitInWholeSeconds: the server counts lock_wait_timeout in whole seconds, so
// `-lock-wait 1500ms` ran with 1 s and said nothing. A wait it cannot honour is refused, before
// anything is opened (no database here).
func TestMigrateLockWaitInWholeSeconds(t *testing.T) {
	t.Setenv("MYSQL_DSN", "nobody@tcp(127.0.0.1:1)/none")
	for _, wait := range []string{"1500ms", "500ms", "0s"} {
		err := run([]string{"migrate", "-lock-wait", wait})
		if err == nil || !strings.Contains(err.Error(), "whole seconds") {
			t.Errorf("gateway migrate -lock-wait %s: %v, want it refused for not being whole seconds", wait, err)
		}
	}
}

// TestHelpNamesTheCommandsThatCheckTheFleet: `gateway help` is what an operator reads mid-upgrade
// to know which commands need the fleet's -config. It named user disable|enable among them, so
// an operator who had to stop a user at once went looking for the fleet's file first.
func TestHelpNamesTheCommandsThatCheckTheFleet(t *testing.T) {
	listed := func(after string) map[string]bool {
		t.Helper()
		flat := strings.Join(strings.Fields(usage), " ")
		i := strings.Index(flat, after)
		if i < 0 {
			t.Fatalf("help does not say %q:\n%s", after, usage)
		}
		rest := flat[i+len(after):]
		list := rest[:strings.Index(rest, ")")]
		got := map[string]bool{}
		for _, item := range strings.Split(list, ", ") {
			words := strings.SplitN(item, " ", 2)
			if len(words) == 1 {
				got[item] = true
				continue
			}
			for _, sub := range strings.Split(words[1], "/") {
				got[words[0]+" "+sub] = true
			}
		}
		return got
	}
	if got := listed("commands that convert credits ("); !reflect.DeepEqual(got, convertsCredits) {
		t.Errorf("help names %v as converting credits, the code checks %v", got, convertsCredits)
	}
	if got := listed("those that use the plans' terms ("); !reflect.DeepEqual(got, usesPlanTerms) {
		t.Errorf("help names %v as using plan terms, the code checks %v", got, usesPlanTerms)
	}
}

package runstate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// MemoryPolicy is what a Redis server does when its memory is full.
//
// Every key the gateway writes carries a TTL and must live to it: a lease tells the
// reconciler a run is still served, a tally is the evidence it settles a dead process's run
// from, an Idempotency-Key's record is what answers a retry instead of running (and charging)
// it again, a fingerprint what refuses a duplicate. A server that evicts keys to make room
// drops them early and silently — and volatile-* policies pick exactly the keys with a TTL —
// so a retry is charged twice or a live run is settled under its call. One that refuses
// writes when full (noeviction) makes the same loss an error each path already handles.
type MemoryPolicy struct {
	MaxMemory int64  // bytes; 0: no limit
	Policy    string // maxmemory-policy
}

// MayEvict says whether the server may delete keys before their TTL to make room.
func (p MemoryPolicy) MayEvict() bool { return p.MaxMemory > 0 && p.Policy != "noeviction" }

// ReadMemoryPolicy reads the server's memory limit and policy from INFO memory, which managed
// services that rename or refuse CONFIG still answer.
func ReadMemoryPolicy(ctx context.Context, rdb redis.UniversalClient) (MemoryPolicy, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return MemoryPolicy{}, fmt.Errorf("read redis memory policy: %w", err)
	}
	p, err := parseMemoryInfo(info)
	if err != nil {
		return MemoryPolicy{}, fmt.Errorf("read redis memory policy: %w", err)
	}
	return p, nil
}

// parseMemoryInfo reads the maxmemory and maxmemory_policy fields of an INFO reply.
func parseMemoryInfo(info string) (MemoryPolicy, error) {
	var p MemoryPolicy
	var haveMax, havePolicy bool
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, value, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		switch name {
		case "maxmemory":
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || n < 0 {
				return MemoryPolicy{}, fmt.Errorf("maxmemory %q is not a byte count", value)
			}
			p.MaxMemory, haveMax = n, true
		case "maxmemory_policy":
			p.Policy, havePolicy = value, true
		}
	}
	if err := sc.Err(); err != nil {
		return MemoryPolicy{}, err
	}
	if !haveMax || !havePolicy {
		return MemoryPolicy{}, errors.New("INFO memory names no maxmemory or maxmemory_policy")
	}
	return p, nil
}

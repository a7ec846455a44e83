package proxy

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/pricing"
)

// Some requests name an earlier answer whose tokens the provider bills again though the body
// does not hold them: a Responses continuation the context it carries (continuation.go), a
// chat message the spoken answer it sends back (spoken.go). The gateway records, when an
// answer ends, those figures under its ids, per user, and a later request naming them reads
// them into its prompt's estimate: the output bound before forwarding and the charge of a
// call settled without a usage report. A record is a hint, never a charge: a Redis that
// does not answer leaves the estimate from the body alone.

// recordTTL is how long an answer's figures are kept: a request naming an answer older than
// a day is estimated from its body alone.
const recordTTL = 24 * time.Hour

// recordLookupTimeout bounds the lookup on the caller's path; past it the estimate goes
// without (the usage report, when it comes, is what is charged).
const recordLookupTimeout = 250 * time.Millisecond

// tokenRecord is a figure to record under a key: tokens, or (firstOnly) the id of the user an
// answer was made for, which a later answer naming the same id does not overwrite.
type tokenRecord struct {
	key       string
	tokens    int64
	firstOnly bool
}

// readRecords reads in one round trip the tokens recorded under keys (0 for a key with none)
// and the user recorded as the owner under each of ownerKeys (0 for none; the owners' keys
// are in slots of their own, so not in the MGET). What Redis does not answer in time reads
// as none, and is logged: a record is a hint, and an owner unread lets the request through,
// as one never recorded does.
func (s *Server) readRecords(ctx context.Context, keys, ownerKeys []string, log *zap.Logger) (tokens []int64, owners []uint64) {
	tokens, owners = make([]int64, len(keys)), make([]uint64, len(ownerKeys))
	ctx, cancel := context.WithTimeout(ctx, recordLookupTimeout)
	defer cancel()
	var counts *redis.SliceCmd
	ownerCmds := make([]*redis.StringCmd, len(ownerKeys))
	_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		if len(keys) > 0 { // an MGET of no key is an error
			counts = p.MGet(ctx, keys...)
		}
		for i, k := range ownerKeys {
			ownerCmds[i] = p.Get(ctx, k)
		}
		return nil
	})
	if counts != nil {
		if vals, err := counts.Result(); err != nil {
			log.Info("records of earlier answers not read; estimated from the request alone", zap.Error(err))
		} else {
			tokens = parseTokens(vals)
		}
	}
	for i, o := range ownerCmds {
		id, err := o.Uint64()
		switch {
		case err == nil:
			owners[i] = id
		case !errors.Is(err, redis.Nil):
			log.Info("owner of an earlier answer not read; forwarded", zap.String("key", ownerKeys[i]), zap.Error(err))
		}
	}
	return tokens, owners
}

// parseTokens reads an MGET's values as token counts: 0 for a key with none or with anything
// but a positive count.
func parseTokens(vals []any) []int64 {
	tokens := make([]int64, len(vals))
	for i, v := range vals {
		if str, ok := v.(string); ok {
			if n, err := strconv.ParseInt(str, 10, 64); err == nil && n > 0 {
				tokens[i] = min(n, pricing.MaxTokens)
			}
		}
	}
	return tokens
}

// rememberTokens writes records in one pipeline. A failure is logged and costs only a later
// estimate its figure.
func (s *Server) rememberTokens(ctx context.Context, records []tokenRecord, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, r := range records {
			if r.firstOnly {
				p.SetNX(ctx, r.key, r.tokens, recordTTL)
				continue
			}
			p.Set(ctx, r.key, r.tokens, recordTTL)
		}
		return nil
	})
	if err != nil {
		log.Info("answer not recorded; a later request naming it is estimated without it", zap.Error(err))
	}
}

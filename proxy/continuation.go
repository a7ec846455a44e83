package proxy

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
)

// A Responses request that continues an earlier answer (previous_response_id) or a
// conversation carries their context on the provider's side: the provider bills it as input,
// though the request's body holds only the new turn. The gateway records, when a Responses
// answer ends, how much context it hands on (contextHandedOn) under its id and its
// conversation's, and a request continuing either counts that in its prompt's estimate: the output bound before forwarding, and the
// charge of a call settled without a usage report (a caller that leaves a stream before
// response.completed). Estimated from the body alone, such a call was charged the new turn
// and none of the thousands of tokens of context the provider billed.

// contextTTL is how long an answer's context size is kept for a continuation: a conversation
// picked up after a day is estimated from its new turn alone.
const contextTTL = 24 * time.Hour

// contextLookupTimeout bounds the lookup on the caller's path; past it the estimate goes
// without (the usage report, when it comes, is what is charged).
const contextLookupTimeout = 250 * time.Millisecond

// carriedContext is the context, in tokens, that the answers and conversations ids name hand
// on to a request of userID: the largest recorded (a continuation carries the whole chain,
// which each record already counts). 0 when none is recorded or Redis does not answer.
func (s *Server) carriedContext(ctx context.Context, userID uint64, ids []string, log *zap.Logger) int64 {
	if len(ids) == 0 {
		return 0
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = s.keys.ResponseContext(userID, id)
	}
	ctx, cancel := context.WithTimeout(ctx, contextLookupTimeout)
	defer cancel()
	vals, err := s.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		log.Info("context of a continued response not read; estimated from the request alone", zap.Error(err))
		return 0
	}
	var carried int64
	for _, v := range vals {
		str, ok := v.(string)
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(str, 10, 64); err == nil && n > 0 {
			carried = max(carried, min(n, pricing.MaxTokens))
		}
	}
	return carried
}

// contextHandedOn is what a call's answer hands on to a continuation: the ids to record it
// under (a Responses answer's own id, and its request's conversation) and its context in
// tokens — its prompt (cached and written included) and its output, as reported, less its
// request's instructions, tools and output schema, which a continuation does not carry but
// sends again (counted in its own estimate). An answer the provider started (it has an id)
// whose usage never came — the caller left its stream — records its estimate: a caller that
// leaves every stream before response.completed would otherwise have nothing recorded, and
// each call of its chain would be estimated from its new turn alone. A reported answer
// anywhere in a chain puts the provider's count back in place of the estimates.
// No ids for any other call, nor for one the provider answered with nothing.
func contextHandedOn(c *call, st holds.Settlement) (ids []string, tokens int64) {
	if c.req.route.format != metering.FormatResponses {
		return nil, 0
	}
	switch st.Source {
	case holds.SourceComplete, holds.SourceCancel, holds.SourceShutdown, holds.SourceStreamError, holds.SourceUpstreamTimeout:
	default:
		return nil, 0
	}
	res := c.meter.Result()
	if !res.Reported && res.ResponseID == "" {
		return nil, 0
	}
	for _, id := range []string{res.ResponseID, c.req.conversation} {
		if id != "" && len(id) <= maxContinuedID {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil, 0
	}
	u := st.Usage.Clamp()
	prompt := max(0, u.Input+u.CacheRead+u.CacheWrite-metering.EstimateNotHandedOn(c.req.body))
	return ids, min(prompt+u.Output, pricing.MaxTokens)
}

// rememberContext records tokens of context under each of ids, for userID's continuations.
// A failure is logged and costs only a later estimate its context.
func (s *Server) rememberContext(ctx context.Context, userID uint64, ids []string, tokens int64, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range ids {
			p.Set(ctx, s.keys.ResponseContext(userID, id), tokens, contextTTL)
		}
		return nil
	})
	if err != nil {
		log.Info("context of a response not recorded; a continuation is estimated without it", zap.Error(err))
	}
}

package proxy

import (
	"context"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
	"github.com/tollgate/tollgate/pricing"
)

// A Responses request that continues an earlier answer (previous_response_id) or a
// conversation carries their context on the provider's side: the provider bills it as input,
// though the request's body holds only the new turn. The gateway records, when a Responses
// answer ends, how much context it hands on (contextHandedOn) under its id and its
// conversation's, and a request continuing either counts that in its prompt's estimate
// (recorded.go). Estimated from the body alone, a caller that left such a stream before
// response.completed was charged the new turn and none of the thousands of tokens of context
// the provider billed.

// carriedContext is the context, in tokens, that the answers and conversations ids name hand
// on to a request of userID: the largest recorded (a continuation carries the whole chain,
// which each record already counts). 0 when none is recorded or Redis does not answer.
//
// foreign is whether previousResponse is an answer made for another user (ResponseOwner): the
// provider keeps every caller's answers under the operator's account, so it would continue
// that user's conversation — their prompts and answers — for this one. Known for the
// answers the gateway saw end within recordTTL; an id it has no record of is forwarded (one
// made before the gateway, or older), as it is when Redis does not answer in time.
func (s *Server) carriedContext(ctx context.Context, userID uint64, ids []string, previousResponse string, log *zap.Logger) (carried int64, foreign bool) {
	if len(ids) == 0 {
		return 0, false
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = s.keys.ResponseContext(userID, id)
	}
	var ownerKeys []string
	if previousResponse != "" {
		ownerKeys = []string{s.keys.ResponseOwner(previousResponse)}
	}
	tokens, owners := s.readRecords(ctx, keys, ownerKeys, log)
	for _, n := range tokens {
		carried = max(carried, n)
	}
	foreign = len(owners) == 1 && owners[0] != 0 && owners[0] != userID
	return carried, foreign
}

// answerOwner is the record of the user a Responses answer was made for, under the provider's
// id of it and of each of its output items, written once: the first to record an id is the
// caller it was made for (a later answer never carries the same id). None for an answer the
// provider did not name, nor for items it did not.
func (s *Server) answerOwner(c *call) []tokenRecord {
	if c.req.route.format != metering.FormatResponses {
		return nil
	}
	res := c.meter.Result()
	var records []tokenRecord
	if id := res.ResponseID; id != "" && len(id) <= maxContinuedID {
		records = append(records, tokenRecord{key: s.keys.ResponseOwner(id), tokens: int64(c.user.ID), firstOnly: true})
	}
	// Its output items too, which a later request may name by their ids (foreignItem).
	for _, id := range res.ItemIDs {
		records = append(records, tokenRecord{key: s.keys.ItemOwner(id), tokens: int64(c.user.ID), firstOnly: true})
	}
	return records
}

// foreignItem is the first id of an item a Responses request names (req.itemIDs: an
// item_reference, or an item sent back with its id) that is an output item of an answer made
// for another user (ItemOwner): the provider fetches a named item from what it keeps under the
// operator's one account, so that user's answer would be put in this caller's prompt. Known for
// the answers the gateway saw end within recordTTL; an id it has no record of is forwarded, as
// it is when Redis does not answer in time. "" when there is none.
func (s *Server) foreignItem(ctx context.Context, userID uint64, req *callRequest, log *zap.Logger) string {
	ownerKeys := make([]string, len(req.itemIDs))
	for i, id := range req.itemIDs {
		ownerKeys[i] = s.keys.ItemOwner(id)
	}
	_, owners := s.readRecords(ctx, nil, ownerKeys, log)
	for i, owner := range owners {
		if owner != 0 && owner != userID {
			return req.itemIDs[i]
		}
	}
	return ""
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
// None for any other call, nor for one the provider answered with nothing.
func (s *Server) contextHandedOn(c *call, st holds.Settlement) []tokenRecord {
	if c.req.route.format != metering.FormatResponses {
		return nil
	}
	switch st.Source {
	case holds.SourceComplete, holds.SourceCancel, holds.SourceShutdown, holds.SourceStreamError, holds.SourceUpstreamTimeout:
	default:
		return nil
	}
	res := c.meter.Result()
	if !res.Reported && res.ResponseID == "" {
		return nil
	}
	var records []tokenRecord
	u := st.Usage.Clamp()
	prompt := max(0, u.Input+u.CacheRead+u.CacheWrite-metering.EstimateNotHandedOn(c.req.body))
	tokens := min(prompt+u.Output, pricing.MaxTokens)
	for _, id := range []string{res.ResponseID, c.req.conversation} {
		if id != "" && len(id) <= maxContinuedID {
			records = append(records, tokenRecord{key: s.keys.ResponseContext(c.user.ID, id), tokens: tokens})
		}
	}
	return records
}

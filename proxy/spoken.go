package proxy

import (
	"context"

	"go.uber.org/zap"

	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/metering"
)

// A chat message may send an earlier spoken answer back by its id ({"audio": {"id": …}}):
// the model hears it again and the provider bills its audio tokens as audio input, a length
// the request does not hold. The gateway records, when a spoken answer ends, its audio tokens
// under its id (spokenAnswers), and a request sending it back counts them in its prompt's
// estimate in place of the flat metering.SentBackAnswerTokens (hearAgain; recorded.go):
// five minutes of speech are 6 000 tokens, not 1 600. The answer's own audio tokens are
// what the model hears again (the provider's count of that audio as input is not known
// before it reports it).

// maxSpokenIDsChecked bounds the distinct spoken answers a request may send back, each one's
// owner read on the caller's path (a GET each, pipelined): a voice conversation holds one an
// answer, and a body of 4 MiB could name 200 000. A body naming more is refused: forwarded
// with some unchecked, one of them could be another user's.
const maxSpokenIDsChecked = 1024

// maxItemIDsChecked bounds alike the distinct items a Responses request's input may name by
// their ids (foreignItem): an agent sending its whole conversation back names each item it sends
// with its id, a few an exchange.
const maxItemIDsChecked = 4096

// hearAgain puts the audio tokens recorded for the spoken answers req sends back in place of
// the SentBackAnswerTokens each counts in its estimates. An answer without a record (one the
// gateway did not see, one older than a day) keeps the flat figure.
//
// foreign is the first id sent back that is a spoken answer made for another user
// (SpokenOwner): the provider keeps every caller's answers under the operator's account, so
// the model would hear that user's answer for this one. Known for the answers the gateway saw
// end within recordTTL; an id it has no record of is forwarded, as it is when Redis does not
// answer in time. Every id sent back is checked (req.spokenIDs), not only the 64 whose length
// is looked up: past them, another user's answer was forwarded unchecked.
func (s *Server) hearAgain(ctx context.Context, userID uint64, req *callRequest, log *zap.Logger) (foreign string) {
	keys := make([]string, len(req.sentBack))
	for i, id := range req.sentBack {
		keys[i] = s.keys.SpokenAnswer(userID, id)
	}
	ownerKeys := make([]string, len(req.spokenIDs))
	for i, id := range req.spokenIDs {
		ownerKeys[i] = s.keys.SpokenOwner(id)
	}
	tokens, owners := s.readRecords(ctx, keys, ownerKeys, log)
	for i, owner := range owners {
		if owner != 0 && owner != userID {
			return req.spokenIDs[i]
		}
	}
	var delta int64
	for _, n := range tokens {
		if n > 0 {
			delta += n - metering.SentBackAnswerTokens
		}
	}
	// Each record is at most pricing.MaxTokens and there are at most 64: no overflow.
	req.inputEstimate = max(0, req.inputEstimate+delta)
	req.audioEstimate = max(0, req.audioEstimate+delta)
	return ""
}

// spokenAnswers is what a chat call's spoken answers hand on to a request that sends them
// back: each id with its share of the audio tokens settled (one answer a choice; the usage
// reports their sum), and the user it was made for, written once (the first to record an id
// is the caller it was made for). None for a call that spoke nothing.
func (s *Server) spokenAnswers(c *call, st holds.Settlement) []tokenRecord {
	if c.req.route.format != metering.FormatChat {
		return nil
	}
	ids := c.meter.Result().SpokenIDs
	if len(ids) == 0 {
		return nil
	}
	records := make([]tokenRecord, 0, 2*len(ids))
	for _, id := range ids {
		records = append(records, tokenRecord{key: s.keys.SpokenOwner(id), tokens: int64(c.user.ID), firstOnly: true})
	}
	if audio := st.Usage.Clamp().AudioOutput; audio > 0 {
		share := (audio + int64(len(ids)) - 1) / int64(len(ids))
		for _, id := range ids {
			records = append(records, tokenRecord{key: s.keys.SpokenAnswer(c.user.ID, id), tokens: share})
		}
	}
	return records
}

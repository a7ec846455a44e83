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

// hearAgain puts the audio tokens recorded for the spoken answers req sends back in place of
// the SentBackAnswerTokens each counts in its estimates. An answer without a record (another
// user's, one the gateway did not see, one older than a day) keeps the flat figure.
func (s *Server) hearAgain(ctx context.Context, userID uint64, req *callRequest, log *zap.Logger) {
	keys := make([]string, len(req.sentBack))
	for i, id := range req.sentBack {
		keys[i] = s.keys.SpokenAnswer(userID, id)
	}
	var delta int64
	for _, n := range s.recordedTokens(ctx, keys, log) {
		if n > 0 {
			delta += n - metering.SentBackAnswerTokens
		}
	}
	// Each record is at most pricing.MaxTokens and there are at most 64: no overflow.
	req.inputEstimate = max(0, req.inputEstimate+delta)
	req.audioEstimate = max(0, req.audioEstimate+delta)
}

// spokenAnswers is what a chat call's spoken answers hand on to a request that sends them
// back: each id with its share of the audio tokens settled (one answer a choice; the usage
// reports their sum). None for a call that spoke nothing.
func (s *Server) spokenAnswers(c *call, st holds.Settlement) []tokenRecord {
	if c.req.route.format != metering.FormatChat {
		return nil
	}
	ids := c.meter.Result().SpokenIDs
	audio := st.Usage.Clamp().AudioOutput
	if len(ids) == 0 || audio == 0 {
		return nil
	}
	share := (audio + int64(len(ids)) - 1) / int64(len(ids))
	records := make([]tokenRecord, len(ids))
	for i, id := range ids {
		records[i] = tokenRecord{key: s.keys.SpokenAnswer(c.user.ID, id), tokens: share}
	}
	return records
}

package metering

import (
	"strings"

	"github.com/tidwall/gjson"
)

// A Responses request may name an item of an earlier answer by its id rather than send it
// ({"type":"item_reference","id":…}, or the item itself with its id): the provider fetches the
// item from what it stores, under the operator's one account, every caller's answers in it.
// The gateway records whose answer each output item was (Result.ItemIDs), and checks the ids a
// request names (InputItemIDs) before it forwards it.

// maxItemIDs bounds the output items' ids a Meter keeps: an answer past it (hundreds of hosted
// tool calls) has its later items unrecorded, forwarded for whoever names them.
const maxItemIDs = 1024

// sawItemID keeps an output item's id (a copy: the event's memory is reused), once: a stream
// names each item when it is added and when it is done. Longer than maxModelName is no id.
func (m *Meter) sawItemID(v gjson.Result) {
	if v.Type != gjson.String || v.Str == "" || len(v.Str) > maxModelName || len(m.res.ItemIDs) >= maxItemIDs {
		return
	}
	// The last ones first: a stream's done names the item its added named just before.
	for i := len(m.res.ItemIDs) - 1; i >= 0; i-- {
		if m.res.ItemIDs[i] == v.Str {
			return
		}
	}
	m.res.ItemIDs = append(m.res.ItemIDs, strings.Clone(v.Str))
}

// InputItemIDs lists the distinct ids of the items a Responses body's input names or sends
// back with their ids, for the check of whose answers they are: the provider looks up any input
// item that carries an id (an item_reference, a message or reasoning item sent back), and one
// naming another user's item has it put in this caller's prompt. more is whether the input
// names more than limit distinct ids (the ids are then the first limit). An id longer than a
// model name is none, as it is to the Meter that records them; an id is under any key that is
// "id" with case folded (a relay decoding with Go's encoding/json reads "ID" as the id).
func InputItemIDs(body []byte, limit int) (ids []string, more bool) {
	d := distinctIDs{limit: limit}
	gjson.GetBytes(body, "input").ForEach(func(_, item gjson.Result) bool {
		item.ForEach(d.add)
		return !d.more
	})
	return d.ids, d.more
}

// distinctIDs gathers the distinct ids a request names for the check of whose answers they
// are (InputItemIDs, SpokenAnswerIDs), up to limit: more says one past it came, and the
// request is refused rather than checked in part.
type distinctIDs struct {
	limit int
	seen  map[string]struct{} // made at the first id: most requests name none
	ids   []string
	more  bool
}

// add takes id if its key k is "id" with case folded (a provider or relay decoding with Go's
// encoding/json reads "ID" as the id, the last of them) and it is one: a string, not empty,
// no longer than a model name (longer is none, as it is to the Meter that records ids). It
// reports whether to go on, a gjson.ForEach callback.
func (d *distinctIDs) add(k, id gjson.Result) bool {
	if !strings.EqualFold(k.Str, "id") || id.Type != gjson.String || id.Str == "" || len(id.Str) > maxModelName {
		return true
	}
	if _, ok := d.seen[id.Str]; ok {
		return true
	}
	if len(d.ids) == d.limit {
		d.more = true
		return false
	}
	if d.seen == nil {
		d.seen = make(map[string]struct{})
	}
	d.seen[id.Str] = struct{}{}
	d.ids = append(d.ids, id.Str)
	return true
}

package proxy

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

func TestReview8RepeatedKeyCost(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[]`)
	for i := 0; b.Len() < 4<<20-32; i++ {
		b.WriteString(`,"`)
		b.WriteString(strconv.FormatInt(int64(i), 36))
		b.WriteString(`":0`)
	}
	b.WriteString(`}`)
	root := gjson.Parse(b.String())
	start := time.Now()
	k := repeatedKey(root, readKeys...)
	folded := time.Since(start)
	t.Logf("folded: %q in %v", k, folded)
	start = time.Now()
	seen := map[string]struct{}{}
	root.ForEach(func(k, _ gjson.Result) bool { seen[k.Str] = struct{}{}; return true })
	exact := time.Since(start)
	t.Logf("exact (old): %d keys in %v", len(seen), exact)
	if folded > 2*exact {
		t.Fatalf("the case-folded check costs %v on a 4 MiB body, %.1fx the exact one (%v), before admission", folded, float64(folded)/float64(exact), exact)
	}
}

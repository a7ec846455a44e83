package proxy

import "testing"

// TestSettlementEndedSinceTheMarkIsSeen: an admission marks its user's settlements, goes to the
// database and is refused for want of a slot; meanwhile a call of its user (none settling at
// the mark) began and ended its settlement, freeing that slot. The admission is told to try
// again (after: a closed channel, "one of user's settlements ended since m"), not that none is
// settling: the entry made and dropped between the mark and after left no trace, and the
// refusal stood, a 429 for a slot already free. Nothing is left in the map once it is told.
func TestSettlementEndedSinceTheMarkIsSeen(t *testing.T) {
	var sc settlingUsers
	m := sc.mark(7)
	sc.begin(7)
	sc.end(7)
	next := sc.after(7, m)
	select {
	case <-next:
	default:
		t.Errorf("after a settlement of the user began and ended since the mark: %v, want a closed channel (try again)", next)
	}
	if n := len(sc.users); n != 0 {
		t.Errorf("%d users left in the map, want none: no settlement is under way", n)
	}
}

// TestNothingSettlingLeavesTheRefusal: an admission whose user has no settlement under way,
// before or after its try, is told so (nil: the refusal stands), and one whose user's
// settlement is still under way waits for its end; neither leaves an entry behind.
func TestNothingSettlingLeavesTheRefusal(t *testing.T) {
	var sc settlingUsers
	if next := sc.after(7, sc.mark(7)); next != nil {
		t.Errorf("nothing settling: %v, want nil", next)
	}
	sc.begin(7)
	next := sc.after(7, sc.mark(7))
	select {
	case <-next:
		t.Fatal("a settlement under way: the channel is closed before it ends")
	default:
	}
	sc.end(7)
	<-next
	if n := len(sc.users); n != 0 {
		t.Errorf("%d users left in the map, want none", n)
	}
}

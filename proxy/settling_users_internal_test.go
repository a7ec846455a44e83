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

// TestSettlementEndSeenByTheLaterOfTwoAdmissions: two admissions of a user mark its
// settlements (none under way); the first is told its refusal stands and hands its mark back;
// then a call of the user begins and ends its settlement before the second is told. The
// second, still marked, is told to try again: dropped when the first handed its mark back,
// the entry the second marked saw nothing of that end, and its refusal stood for a slot
// already free.
func TestSettlementEndSeenByTheLaterOfTwoAdmissions(t *testing.T) {
	var sc settlingUsers
	first, second := sc.mark(7), sc.mark(7)
	if next := sc.after(7, first); next != nil {
		t.Fatalf("the first admission, nothing settling: %v, want nil", next)
	}
	sc.begin(7)
	sc.end(7)
	select {
	case <-sc.after(7, second):
	default:
		t.Errorf("the second admission, a settlement begun and ended since its mark: want a closed channel (try again)")
	}
	if n := len(sc.users); n != 0 {
		t.Errorf("%d users left in the map, want none", n)
	}
}

// TestSettlementEndedBeforeTheMarkIsNoReasonToTryAgain: an admission that marks its user's
// settlements after one of them has ended, another still under way, waits for the next end,
// not at once: the end it saw at its mark freed nothing its refusal did not already count,
// and trying again at once would spend one of its tries for nothing.
func TestSettlementEndedBeforeTheMarkIsNoReasonToTryAgain(t *testing.T) {
	var sc settlingUsers
	sc.begin(7)
	sc.begin(7)
	sc.end(7)
	next := sc.after(7, sc.mark(7))
	if next == nil {
		t.Fatal("a settlement still under way: nil, want its end's channel")
	}
	select {
	case <-next:
		t.Fatal("nothing ended since the mark: the channel is closed already")
	default:
	}
	sc.end(7)
	<-next
	if n := len(sc.users); n != 0 {
		t.Errorf("%d users left in the map, want none", n)
	}
}

// TestEachSettlementEndWakesEveryAdmissionWaitingForIt: two admissions of a user refused while
// a settlement is under way both wait for its end, and both are woken by it; an admission
// refused after it, while another settlement is under way, waits for that one's end, not at
// once for the end already past.
func TestEachSettlementEndWakesEveryAdmissionWaitingForIt(t *testing.T) {
	var sc settlingUsers
	sc.begin(7)
	sc.begin(7)
	m1, m2 := sc.mark(7), sc.mark(7)
	n1, n2 := sc.after(7, m1), sc.after(7, m2)
	sc.end(7)
	for i, next := range []<-chan struct{}{n1, n2} {
		select {
		case <-next:
		default:
			t.Errorf("admission %d waiting for the settlement that ended: not woken", i+1)
		}
	}
	n3 := sc.after(7, sc.mark(7))
	select {
	case <-n3:
		t.Fatal("an admission marked after the end, another settlement under way: woken before it ends")
	default:
	}
	sc.end(7)
	<-n3
	if n := len(sc.users); n != 0 {
		t.Errorf("%d users left in the map, want none", n)
	}
}

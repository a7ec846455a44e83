package proxy

import "sync"

// settlingUsers counts, by user, this process's calls whose answer is over and whose settlement
// has not yet come back from the database. Such a call's hold still takes one of its user's
// max_in_flight slots, though its caller already has the answer: a caller that sends its next
// call the moment it has one (a script, an agent fanning out as many calls as its plan allows)
// had that call refused 429 too_many_in_flight whenever its admission reached the database
// before the previous call's settlement did; so was one of a caller at the end of its balance,
// 402 insufficient_credits, for the credits that hold still kept. An admission refused so waits
// for one of those settlements and tries again (admitWaitingForSettlements). A call whose
// finish panics between its begin and its settlement (a bug: its hold is then the
// reconciler's) stays counted, and its user's refusals each wait out their admission budget
// before their 429 or 402.
type settlingUsers struct {
	mu    sync.Mutex
	users map[uint64]*settlingUser
}

// settlingUser is one user's calls being settled, and the admissions that marked them
// (settlingUsers.mark) and are yet to be told what to wait for (after). Its entry is dropped
// when neither is left, so that the map holds only users with settlements or such admissions
// under way. Kept while an admission has it marked, a settlement that begins and ends between
// the mark and after is seen in ends: dropped with it, it left no trace, and the refusal stood
// for a slot already free.
type settlingUser struct {
	n     int
	marks int
	ends  uint64        // settlements ended since the entry was made
	next  chan struct{} // closed at the next end; made when after is first asked for it
}

// settlingMark is what an admission saw of its user's settlements before it went to the
// database: an end after it may have freed the slot the admission was refused for.
type settlingMark struct {
	entry *settlingUser
	ends  uint64
}

// entry is user's entry, made if it has none. sc.mu is held.
func (sc *settlingUsers) entry(user uint64) *settlingUser {
	if sc.users == nil {
		sc.users = make(map[uint64]*settlingUser)
	}
	e := sc.users[user]
	if e == nil {
		e = &settlingUser{}
		sc.users[user] = e
	}
	return e
}

// drop removes user's entry e once nothing is left of it. sc.mu is held.
func (sc *settlingUsers) drop(user uint64, e *settlingUser) {
	if e.n == 0 && e.marks == 0 {
		delete(sc.users, user)
	}
}

// begin counts one of user's calls as settling: its answer is over, its hold still live.
func (sc *settlingUsers) begin(user uint64) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.entry(user).n++
}

// end counts one of user's settlements, begun by begin, as over (committed or given up).
func (sc *settlingUsers) end(user uint64) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	e := sc.users[user]
	if e == nil || e.n <= 0 {
		panic("settlingUsers: end without begin") // a slot counted twice would never free
	}
	e.n--
	e.ends++
	if e.next != nil {
		close(e.next)
		e.next = nil
	}
	sc.drop(user, e)
}

// mark records user's settlements as an admission about to go to the database sees them. The
// admission must hand the mark back to after, whatever its outcome.
func (sc *settlingUsers) mark(user uint64) settlingMark {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	e := sc.entry(user)
	e.marks++
	return settlingMark{entry: e, ends: e.ends}
}

// after takes back the mark m of user's admission and returns what the admission, if refused
// for want of a slot, waits for before it tries again: a closed channel when one of user's
// settlements ended since m (the slot may be free now), the next end's channel when some are
// still under way, or nil when none is: the refusal stands.
func (sc *settlingUsers) after(user uint64, m settlingMark) <-chan struct{} {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	e := m.entry
	e.marks--
	defer sc.drop(user, e)
	switch {
	case e.ends != m.ends:
		return closedChan
	case e.n == 0:
		return nil
	}
	if e.next == nil {
		e.next = make(chan struct{})
	}
	return e.next
}

// closedChan is ready at once.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

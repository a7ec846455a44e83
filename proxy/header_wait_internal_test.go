package proxy

import (
	"context"
	"testing"
	"time"
)

// firedTimer is a header wait's timer that has fired (Stop reports false) but whose function
// has not run yet: time.AfterFunc runs it in a goroutine of its own, which may be scheduled
// after the headers came.
type firedTimer struct{ f func() }

func (t *firedTimer) Stop() bool { return false }

// TestHeaderWaitThatRanOutIsLateBeforeItsTimerCancels: headers that come as the wait's timer
// fires, before its function cancelled the request's context, must be reported late. Reported
// in time, the stream was relayed under a context cancelled a moment later: its 200 sent, it
// broke at once and was charged as a broken stream.
func TestHeaderWaitThatRanOutIsLateBeforeItsTimerCancels(t *testing.T) {
	var timer firedTimer
	ctx, stop := headerWaitOn(context.Background(), true, time.Second, func(_ time.Duration, f func()) interface{ Stop() bool } {
		timer.f = f
		return &timer
	})
	late := stop()
	timer.f() // the timer's goroutine runs now
	if !late && ctx.Err() != nil {
		t.Fatal("stop reported the headers in time, and the context they are read under was then cancelled")
	}
	if !late {
		t.Fatal("stop reported the headers in time after the wait's timer fired")
	}
}

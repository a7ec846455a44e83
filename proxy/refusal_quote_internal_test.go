package proxy

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestQuotedValueKeepsWhatFitsAndCutsAtARune: an error answer quotes a caller's value whole up
// to maxQuotedBytes, exactly that many included; past it, its start, cut at the start of a rune
// (never inside one, which would send invalid UTF-8) and marked "…".
func TestQuotedValueKeepsWhatFitsAndCutsAtARune(t *testing.T) {
	fits := strings.Repeat("a", maxQuotedBytes)
	if got := quotedValue(fits); got != fits {
		t.Errorf("a value of exactly %d bytes quoted as %d bytes %q…, want it whole", maxQuotedBytes, len(got), got[max(0, len(got)-4):])
	}
	if got, want := quotedValue(fits+"b"), fits+"…"; got != want {
		t.Errorf("a value of %d bytes quoted as %d bytes, want its first %d and …", maxQuotedBytes+1, len(got), maxQuotedBytes)
	}
	// A three-byte rune that begins one byte before the bound is cut whole.
	straddling := strings.Repeat("a", maxQuotedBytes-1) + "€" + "tail"
	got := quotedValue(straddling)
	if want := strings.Repeat("a", maxQuotedBytes-1) + "…"; got != want || !utf8.ValidString(got) {
		t.Errorf("a rune straddling the bound: quoted %d bytes (valid UTF-8 %v), want the %d bytes before it and …",
			len(got), utf8.ValidString(got), maxQuotedBytes-1)
	}
}

// TestRefusalLineIsBoundedAndLevelledByWhoseFailureItIs: a refusal's line quotes the message
// its caller was told at most maxLoggedBytes, with the status, code, reason and error behind
// it; a caller's mistake (4xx, and 499) is INFO, the gateway's failure (5xx) WARN.
func TestRefusalLineIsBoundedAndLevelledByWhoseFailureItIs(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	log := zap.New(core)
	long := strings.Repeat("m", 4*maxLoggedBytes)
	for _, tc := range []struct {
		e     *apiError
		level zapcore.Level
	}{
		{errBadRequest("invalid_body", long), zapcore.InfoLevel},
		{errClientClosed, zapcore.InfoLevel},
		{errBillingDown, zapcore.WarnLevel},
	} {
		logs.TakeAll()
		logRefusal(log, tc.e, "why", errors.New("behind"))
		lines := logs.TakeAll()
		if len(lines) != 1 {
			t.Fatalf("%s: %d lines, want 1", tc.e.Code, len(lines))
		}
		l, f := lines[0], lines[0].ContextMap()
		msg, _ := f["message"].(string)
		if l.Message != "request refused" || l.Level != tc.level || f["code"] != tc.e.Code || f["status"] != int64(tc.e.Status) ||
			f["reason"] != "why" || f["error"] != "behind" || msg != tc.e.Message[:min(len(tc.e.Message), maxLoggedBytes)] {
			t.Errorf("%s: line %q at %v with %d-byte message, fields %v, want 'request refused' at %v, message at most %d bytes",
				tc.e.Code, l.Message, l.Level, len(msg), f["code"], tc.level, maxLoggedBytes)
		}
	}
}

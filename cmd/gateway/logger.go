package main

import (
	"os"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tollgate/tollgate/holds"
)

// Sampling of lines below ERROR, per message: in each second the first sampleFirst lines of a
// message are written, then every sampleThereafter-th (zap's production figures). A client
// that sends thousands of bad requests a second then writes a few hundred lines a second, not
// one per request.
const (
	sampleFirst      = 100
	sampleThereafter = 100
)

// newLogger is the gateway's JSON logger on out, at INFO (DEBUG with debug). Lines below ERROR
// are sampled (sampleFirst); ERROR lines and the lines of the money logger (holds.MoneyLog)
// never are: a failed tally of a named run is the only record of that call's usage, and a
// failed settlement, a run charged at its hold or the reconciler's charges must all be seen.
func newLogger(debug bool, out zapcore.WriteSyncer) *zap.Logger {
	level := zapcore.InfoLevel
	if debug {
		level = zapcore.DebugLevel
	}
	whole := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), out, level)
	core := sampleBelowError{Core: whole,
		sampled: zapcore.NewSamplerWithOptions(whole, time.Second, sampleFirst, sampleThereafter)}
	return zap.New(core, zap.AddCaller(), zap.AddStacktrace(zapcore.ErrorLevel), zap.ErrorOutput(zapcore.Lock(os.Stderr)))
}

// sampleBelowError writes ERROR lines and money lines through Core, the rest through sampled.
type sampleBelowError struct {
	zapcore.Core
	sampled zapcore.Core
}

func (c sampleBelowError) With(fields []zapcore.Field) zapcore.Core {
	return sampleBelowError{Core: c.Core.With(fields), sampled: c.sampled.With(fields)}
}

func (c sampleBelowError) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Level >= zapcore.ErrorLevel || moneyLine(e.LoggerName) {
		return c.Core.Check(e, ce)
	}
	return c.sampled.Check(e, ce)
}

// moneyLine reports a line of the money logger (holds.MoneyLog), itself or named under it.
func moneyLine(name string) bool {
	return name == holds.MoneyLog || strings.HasSuffix(name, "."+holds.MoneyLog)
}

package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
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

// routeLibraryLogs sends what the Redis and MySQL clients log on their own (a pool that
// cannot dial, a connection the server closed) through log, as JSON lines like every other:
// by default they print plain text on stderr, which a log pipeline reading one JSON object per
// line drops or chokes on. Their words are kept whole in a field; they carry addresses, never
// passwords.
func routeLibraryLogs(log *zap.Logger) {
	redis.SetLogger(redisLog{log.Named("redis")})
	_ = mysql.SetLogger(mysqlLog{log.Named("mysql")}) // errs only on a nil logger
}

// redisLog is go-redis's logger on zap.
type redisLog struct{ log *zap.Logger }

func (l redisLog) Printf(_ context.Context, format string, v ...any) {
	l.log.Warn("redis client", zap.String("detail", fmt.Sprintf(format, v...)))
}

// mysqlLog is the MySQL driver's logger on zap.
type mysqlLog struct{ log *zap.Logger }

func (l mysqlLog) Print(v ...any) {
	l.log.Warn("mysql client", zap.String("detail", strings.TrimSpace(fmt.Sprint(v...))))
}

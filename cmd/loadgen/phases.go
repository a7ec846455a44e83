package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// phaseMetric is the gateway's histogram of the time a call waits before its answer starts
// (proxy.Metrics.CallPhase). Read before and after a tollgate run, it says which part of the
// gateway's added latency is the hold, which the checks after it, and which the upstream.
const phaseMetric = "tollgate_call_phase_seconds"

// settleMetric is the gateway's histogram of a call's end to its settlement committed
// (proxy.Metrics.SettleSeconds). readPhases returns it under settleKey, next to the phases.
const (
	settleMetric = "tollgate_settle_seconds"
	settleKey    = "settle_commit"
)

// PhaseDist summarises one phase over a run from the histogram's buckets: percentiles are
// interpolated inside the bucket they fall in (each bound about 26 % above the one before), so
// they are estimates, unlike Dist's.
type PhaseDist struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
}

// histogram is one phase's cumulative buckets (upper bound in seconds -> count), sum and count.
type histogram struct {
	buckets map[float64]float64
	sum     float64
	count   float64
}

// readPhases fetches the gateway's /metrics and returns its call-phase histograms by phase,
// and its settlement histogram under settleKey; nil if they cannot be read (the run goes on
// without them).
func readPhases(ctx context.Context, gatewayURL string) map[string]*histogram {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, gatewayURL+"/metrics", nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	h, err := parsePhases(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil
	}
	return h
}

// parsePhases reads the call-phase series, by phase, and the settlement histogram, under
// settleKey, out of Prometheus text exposition. A series without labels (the settlement's
// _sum and _count) has no braces: `name value`.
func parsePhases(r io.Reader) (map[string]*histogram, error) {
	out := map[string]*histogram{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var rest, key string
		if r, ok := strings.CutPrefix(line, phaseMetric+"_"); ok {
			rest = r
		} else if r, ok := strings.CutPrefix(line, settleMetric+"_"); ok {
			rest, key = r, settleKey
		} else {
			continue
		}
		kind, labels, value, ok := splitSample(rest)
		if !ok {
			return nil, fmt.Errorf("metrics line %q", line)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		lab := parseLabels(labels)
		if key == "" {
			key = lab["phase"]
		}
		h := out[key]
		if h == nil {
			h = &histogram{buckets: map[float64]float64{}}
			out[key] = h
		}
		switch kind {
		case "bucket":
			le, err := strconv.ParseFloat(lab["le"], 64) // "+Inf" parses as +Inf
			if err != nil {
				return nil, fmt.Errorf("metrics line %q: %w", line, err)
			}
			h.buckets[le] = v
		case "sum":
			h.sum = v
		case "count":
			h.count = v
		}
	}
	return out, sc.Err()
}

// splitSample splits `kind{labels} value` or `kind value`.
func splitSample(s string) (kind, labels, value string, ok bool) {
	if k, rest, found := strings.Cut(s, "{"); found {
		labels, value, ok = strings.Cut(rest, "} ")
		return k, labels, value, ok
	}
	kind, value, ok = strings.Cut(s, " ")
	return kind, "", value, ok
}

// parseLabels splits `a="x",b="y"` (the values here never hold quotes or commas).
func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok {
			out[k] = strings.Trim(v, `"`)
		}
	}
	return out
}

// phaseDelta summarises what the gateway observed between two readings, by phase.
func phaseDelta(before, after map[string]*histogram) map[string]PhaseDist {
	if before == nil || after == nil {
		return nil
	}
	out := map[string]PhaseDist{}
	for phase, a := range after {
		b := before[phase]
		if b == nil {
			b = &histogram{buckets: map[float64]float64{}}
		}
		n := a.count - b.count
		if n <= 0 {
			continue
		}
		bounds := make([]float64, 0, len(a.buckets))
		for le := range a.buckets {
			bounds = append(bounds, le)
		}
		slices.Sort(bounds)
		cum := make([]float64, len(bounds))
		for i, le := range bounds {
			cum[i] = a.buckets[le] - b.buckets[le]
		}
		out[phase] = PhaseDist{N: int(n), Mean: round3((a.sum - b.sum) / n * 1000),
			P50: round3(bucketQuantile(0.50, bounds, cum) * 1000), P99: round3(bucketQuantile(0.99, bounds, cum) * 1000)}
	}
	return out
}

// bucketQuantile estimates quantile q from cumulative bucket counts, interpolating linearly
// inside the bucket it falls in, as Prometheus's histogram_quantile does. A quantile in the
// +Inf bucket is reported as the largest finite bound.
func bucketQuantile(q float64, bounds, cum []float64) float64 {
	if len(bounds) == 0 || cum[len(cum)-1] == 0 {
		return 0
	}
	rank := q * cum[len(cum)-1]
	i, _ := slices.BinarySearchFunc(cum, rank, func(c, r float64) int {
		switch {
		case c < r:
			return -1
		case c > r:
			return 1
		}
		return 0
	})
	if math.IsInf(bounds[i], 1) {
		if i == 0 {
			return 0
		}
		return bounds[i-1]
	}
	lo, below := 0.0, 0.0
	if i > 0 {
		lo, below = bounds[i-1], cum[i-1]
	}
	inBucket := cum[i] - below
	if inBucket <= 0 {
		return bounds[i]
	}
	return lo + (bounds[i]-lo)*(rank-below)/inBucket
}

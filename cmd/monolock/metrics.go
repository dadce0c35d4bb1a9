package main

import (
	"crypto/x509"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/monolock-dev/monolock"
)

// durationBuckets are the upper bounds, in seconds, of the wait and hold
// histograms: from an immediate grant (well under a millisecond) to a
// nightly job's hour. Beyond the hour, only _sum and _count say anything.
var durationBuckets = [...]float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// histogram counts durations into durationBuckets. The zero value is ready.
// One goroutine observes (the server's event goroutine) and a scrape reads,
// so a mutex that is almost never contended keeps every scrape consistent:
// _count is always the +Inf bucket.
type histogram struct {
	mu     sync.Mutex
	counts [len(durationBuckets) + 1]uint64 // one per bound, then +Inf; not cumulative
	sum    float64                          // seconds: a Duration would overflow after 292 years of holds, summed over every lock
}

func (h *histogram) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(durationBuckets) && s > durationBuckets[i] {
		i++
	}
	h.mu.Lock()
	h.counts[i]++
	h.sum += s
	h.mu.Unlock()
}

// samples are the histogram's lines after its name: cumulative buckets
// ending in +Inf, then _sum and _count.
func (h *histogram) samples() []string {
	h.mu.Lock()
	counts, sum := h.counts, h.sum
	h.mu.Unlock()
	out := make([]string, 0, len(counts)+2)
	var cum uint64
	for i, n := range counts {
		cum += n
		le := "+Inf"
		if i < len(durationBuckets) {
			le = strconv.FormatFloat(durationBuckets[i], 'g', -1, 64)
		}
		out = append(out, `_bucket{le="`+le+`"} `+strconv.FormatUint(cum, 10))
	}
	return append(out, "_sum "+strconv.FormatFloat(sum, 'g', -1, 64), "_count "+strconv.FormatUint(cum, 10))
}

// event is the server's OnEvent: the histograms, then the audit log. It never waits: the server queues events while it runs.
func (o *ops) event(ev monolock.Event) {
	switch ev.Type {
	case monolock.EventGranted:
		o.waitHist.observe(ev.Wait)
	case monolock.EventReleased:
		o.holdHist.observe(ev.Held)
	}
	if o.audit != nil {
		o.audit.event(ev)
	}
}

// ages returns how long the oldest current holder has held its lock and
// how long the longest current waiter has waited: 0 when there is none.
// Stats finds both in its one pass over the table, copying no queue.
func ages(now time.Time, st monolock.Stats) (hold, wait time.Duration) {
	if !st.OldestHold.IsZero() {
		hold = max(0, now.Sub(st.OldestHold))
	}
	if !st.OldestWait.IsZero() {
		wait = max(0, now.Sub(st.OldestWait))
	}
	return hold, wait
}

// certificateExpiry is the NotAfter of the certificate the protocol port
// serves now (a reload may have changed it), or false without TLS.
func (o *ops) certificateExpiry() (time.Time, bool) {
	if o.sec == nil {
		return time.Time{}, false
	}
	cfg := o.sec.tls.Load()
	if cfg == nil || len(cfg.Certificates) == 0 || len(cfg.Certificates[0].Certificate) == 0 {
		return time.Time{}, false
	}
	leaf := cfg.Certificates[0].Leaf // set by LoadX509KeyPair
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cfg.Certificates[0].Certificate[0]); err != nil {
			return time.Time{}, false
		}
	}
	return leaf.NotAfter, true
}

// processStats are the standard process_* metrics. Each is false where the
// platform does not tell it (the descriptor count and the resident memory
// come from /proc).
type processStats struct {
	openFDs, maxFDs, rss uint64
	cpu                  float64 // user and system, seconds
	hasOpen, hasMax      bool
	hasRSS, hasCPU       bool
}

func readProcessStats() processStats {
	var p processStats
	// Linux 6.2 and later give the count as the directory's size, at once;
	// listing it instead takes about a microsecond a descriptor (10 ms with
	// 10,000 sessions), which older kernels pay. The listing counts the
	// descriptor that reads it, as other exporters' counts do.
	if fi, err := os.Stat("/proc/self/fd"); err == nil && fi.Size() > 0 {
		p.openFDs, p.hasOpen = uint64(fi.Size()), true
	} else if d, err := os.Open("/proc/self/fd"); err == nil {
		names, err := d.Readdirnames(-1) // unsorted, no stat
		d.Close()
		if err == nil {
			p.openFDs, p.hasOpen = uint64(len(names)), true
		}
	}
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		p.maxFDs, p.hasMax = uint64(lim.Cur), true // int64 on the BSDs
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		p.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
		p.hasCPU = true
	}
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			if pages, err := strconv.ParseUint(f[1], 10, 64); err == nil {
				p.rss, p.hasRSS = pages*uint64(os.Getpagesize()), true
			}
		}
	}
	return p
}

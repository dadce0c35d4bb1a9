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

// event is the server's OnEvent: the histograms, the table of holds, then
// the audit log. It never waits: the server queues events while it runs.
func (o *ops) event(ev monolock.Event) {
	switch ev.Type {
	case monolock.EventGranted:
		o.waitHist.observe(ev.Wait)
		o.holds.granted(ev.Lock, ev.Token, ev.Time)
	case monolock.EventReleased:
		o.holdHist.observe(ev.Held)
		o.holds.released(ev.Lock, ev.Token)
	}
	if o.audit != nil {
		o.audit.event(ev)
	}
}

// holdTable is which locks are held, and since when, as the events tell
// it: a scrape finds the oldest hold, and the locks whose queues to look
// at, without copying the server's whole table under its mutex (Locks
// holds it for milliseconds with 10,000 sessions, and every grant waits).
type holdTable struct {
	mu   sync.Mutex
	held map[string]heldSince
}

type heldSince struct {
	token uint64
	since time.Time
}

func (h *holdTable) granted(lock string, token uint64, at time.Time) {
	h.mu.Lock()
	if h.held == nil {
		h.held = map[string]heldSince{}
	}
	h.held[lock] = heldSince{token, at}
	h.mu.Unlock()
}

func (h *holdTable) released(lock string, token uint64) {
	h.mu.Lock()
	if h.held[lock].token == token {
		delete(h.held, lock)
	}
	h.mu.Unlock()
}

// snapshot returns the held locks' names and the earliest grant among them.
func (h *holdTable) snapshot() (names []string, oldest time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	names = make([]string, 0, len(h.held))
	for name, e := range h.held {
		names = append(names, name)
		if oldest.IsZero() || e.since.Before(oldest) {
			oldest = e.since
		}
	}
	return names, oldest
}

// ages returns how long the oldest current holder has held its lock and
// how long the longest current waiter has waited: 0 when there is none.
// The oldest hold comes from the table of holds. The longest waiter is the
// head of some held lock's queue; once found, it stays the longest for as
// long as it waits, since every waiter queued later is newer (to within
// the milliseconds the look took), so a scrape looks at its lock alone,
// and at every held lock's queue, one lock at a time, only when it has
// left. Once the server has dropped an event, the table of holds may be
// wrong, and the server's whole table is read instead. A lock granted in
// the last instant may be missed until its event is delivered.
func (o *ops) ages(now time.Time, st monolock.Stats) (hold, wait time.Duration) {
	if st.EventsDropped > 0 {
		for _, l := range o.srv.Locks() {
			if l.Holder != nil {
				hold = max(hold, now.Sub(l.Holder.Since))
			}
			if len(l.Waiters) > 0 {
				wait = max(wait, now.Sub(l.Waiters[0].Since))
			}
		}
		return hold, wait
	}
	names, oldest := o.holds.snapshot()
	if !oldest.IsZero() {
		hold = max(0, now.Sub(oldest))
	}
	o.longest.mu.Lock()
	defer o.longest.mu.Unlock()
	c := &o.longest
	if st.Waiters == 0 {
		c.lock = ""
		return hold, 0
	}
	if c.lock != "" {
		if l, ok := o.srv.Lock(c.lock); ok && len(l.Waiters) > 0 && l.Waiters[0].RemoteAddr == c.addr && l.Waiters[0].Since.Equal(c.since) {
			return hold, max(0, now.Sub(c.since))
		}
		c.lock = ""
	}
	for _, name := range names {
		if l, ok := o.srv.Lock(name); ok && len(l.Waiters) > 0 {
			if head := l.Waiters[0]; c.lock == "" || head.Since.Before(c.since) {
				c.lock, c.addr, c.since = name, head.RemoteAddr, head.Since
			}
		}
	}
	if c.lock == "" {
		return hold, 0
	}
	return hold, max(0, now.Sub(c.since))
}

// longestWaiter is the longest waiter the last look found.
type longestWaiter struct {
	mu         sync.Mutex
	lock, addr string // lock "": none known
	since      time.Time
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
		p.maxFDs, p.hasMax = lim.Cur, true
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

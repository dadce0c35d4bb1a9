package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/monolock-dev/monolock"
)

// The audit writer's bounds. While serving, the lock server only ever
// queues a line; one goroutine writes them, so a sink that stalls costs at
// most the queue.
const (
	auditQueueLines  = 10000           // lines waiting to be written, at most
	auditQueueBytes  = 8 << 20         // and their bytes, at most
	auditStallAfter  = 5 * time.Second // a write blocked this long is reported
	auditReportEvery = 10 * time.Second
	auditDrainBound  = 5 * time.Second // what shutdown gives the audit log, from the signal
)

// auditLog writes one JSON object a line for every event, to a file that
// SIGHUP reopens (for logrotate), or to stdout. Events are queued by event,
// which never blocks while serving: a full queue drops the line (at
// shutdown it waits for room, bounded: see beginClose). Lost lines, whether
// dropped or failed, are counted and reported at error level, at most one
// report of each kind every auditReportEvery.
type auditLog struct {
	path   string // "-" for stdout
	logger *slog.Logger
	queue  chan auditItem

	queued      atomic.Int64 // lines queued or being written
	queuedBytes atomic.Int64
	errors      atomic.Uint64 // lines whose write failed
	dropped     atomic.Uint64 // lines that found the queue full
	writeBegan  atomic.Int64  // UnixNano of the write in progress, 0 when none
	lastErr     atomic.Pointer[writeFailure]
	reopening   atomic.Bool               // a reopen is on its way to the writer
	closing     atomic.Pointer[closeTime] // set by beginClose
	room        chan struct{}             // the writer took a line: for an event waiting

	quit chan struct{} // closed by close: drain and stop
	done chan struct{} // closed by the writer when the queue is drained
}

// auditItem is a line, or a newly opened file to write the next lines to.
type auditItem struct {
	line []byte
	file *os.File
}

type writeFailure struct {
	err  error
	line string
}

func openAudit(path string, logger *slog.Logger) (*auditLog, error) {
	a := &auditLog{path: path, logger: logger, queue: make(chan auditItem, auditQueueLines),
		room: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	f := os.Stdout
	if path != "-" {
		var err error
		if f, err = openAuditFile(path, logger); err != nil {
			return nil, fmt.Errorf("-audit-log: %w", err)
		}
	}
	go a.write(f)
	go a.monitor()
	return a, nil
}

// auditFIFOWait is how long the start waits for the reader of an audit
// FIFO (a variable for the test of its end).
var auditFIFOWait = 10 * time.Second

// openAuditFile opens the audit log at start-up. A FIFO without a reader
// would block the open, and the start, with nothing said: instead the wait
// is logged at once, and bounded.
func openAuditFile(path string, logger *slog.Logger) (*os.File, error) {
	open := func() (*os.File, error) {
		// O_NONBLOCK: a FIFO without a reader fails at once (ENXIO).
		return os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NONBLOCK, 0o640)
	}
	f, err := open()
	if !errors.Is(err, syscall.ENXIO) {
		return f, err
	}
	logger.Warn("the audit log is a FIFO without a reader: waiting for one to open it before serving",
		"path", path, "bound", auditFIFOWait)
	for deadline := time.Now().Add(auditFIFOWait); time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		if f, err = open(); !errors.Is(err, syscall.ENXIO) {
			if err == nil {
				logger.Info("the audit FIFO has a reader", "path", path)
			}
			return f, err
		}
	}
	return nil, fmt.Errorf("%s is a FIFO and nothing opened it for reading within %v: start its reader first", path, auditFIFOWait)
}

// reopen starts opening the path again, for logrotate, and returns at once:
// the open, and the wait for a place in the queue, happen in a goroutine,
// so that a stalled sink never blocks the caller (the signal loop). Lines
// queued before the reopen go to the old file, lines queued after the new
// one is open go to it. It reports whether a reopen was started: false for
// stdout, and while the previous reopen is still on its way.
func (a *auditLog) reopen() bool {
	if a.path == "-" || !a.reopening.CompareAndSwap(false, true) {
		return false
	}
	// Said before the open begins, so that its failure is logged after.
	a.logger.Info("reopening the audit log", "path", a.path)
	go func() {
		// O_NONBLOCK: a FIFO without a reader fails at once (ENXIO) instead
		// of waiting for one.
		f, err := os.OpenFile(a.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NONBLOCK, 0o640)
		if err != nil {
			a.reopening.Store(false)
			a.logger.Error("audit log reopen failed; still writing to the old file", "path", a.path, "err", err)
			return
		}
		select {
		case a.queue <- auditItem{file: f}:
		case <-a.quit:
			f.Close()
		}
	}()
	return true
}

type auditLine struct {
	Time       string  `json:"time"`
	Event      string  `json:"event"`
	Lock       string  `json:"lock"`
	Identity   string  `json:"identity"`
	RemoteAddr string  `json:"remote_addr"`
	Token      *uint64 `json:"token,omitempty"`
	WaitMS     *int64  `json:"wait_ms,omitempty"`
	HeldMS     *int64  `json:"held_ms,omitempty"`
	Reason     string  `json:"reason,omitempty"`
}

// beginClose starts shutdown's time for the audit log, bound from now (by
// the monotonic clock), shared by two waits: event's, for room in a full
// queue instead of dropping the line (Shutdown releases every holder in one
// burst, an event each, which the server holds anyway, faster than any sink
// takes them), and close's, for the writer to drain the queue. A stalled
// sink costs the shutdown bound once.
func (a *auditLog) beginClose(bound time.Duration) {
	a.closing.CompareAndSwap(nil, &closeTime{time.Now().Add(bound), bound})
}

// closeTime is the end of shutdown's time for the audit log, and its length.
type closeTime struct {
	by    time.Time
	bound time.Duration
}

// event is the server's OnEvent: it queues ev as one line, and never waits
// but after beginClose.
func (a *auditLog) event(ev monolock.Event) {
	line := auditLine{Time: ev.Time.UTC().Format(time.RFC3339Nano), Event: ev.Type, Lock: ev.Lock,
		Identity: ev.Identity, RemoteAddr: ev.RemoteAddr}
	ms := func(d time.Duration) *int64 { v := d.Milliseconds(); return &v }
	switch ev.Type {
	case monolock.EventGranted:
		line.Token, line.WaitMS = &ev.Token, ms(ev.Wait)
	case monolock.EventReleased:
		line.Token, line.HeldMS, line.Reason = &ev.Token, ms(ev.Held), ev.Reason
	case monolock.EventForceRelease:
		line.Token = &ev.Token
	}
	b, _ := json.Marshal(line)
	b = append(b, '\n')
	var bound *time.Timer
	for !a.enqueue(b) {
		closing := a.closing.Load()
		if closing == nil {
			a.dropped.Add(1)
			return
		}
		if bound == nil {
			bound = time.NewTimer(time.Until(closing.by))
			defer bound.Stop()
		}
		select {
		case <-a.room:
		case <-bound.C:
			a.dropped.Add(1)
			return
		}
	}
}

// enqueue queues line if the queue has room for it, by lines and by bytes.
func (a *auditLog) enqueue(line []byte) bool {
	if a.queuedBytes.Add(int64(len(line))) > auditQueueBytes {
		a.queuedBytes.Add(-int64(len(line)))
		return false
	}
	a.queued.Add(1)
	select {
	case a.queue <- auditItem{line: line}:
		return true
	default:
		a.queued.Add(-1)
		a.queuedBytes.Add(-int64(len(line)))
		return false
	}
}

// write is the one goroutine that writes to the sink, f first.
func (a *auditLog) write(f *os.File) {
	defer close(a.done)
	handle := func(it auditItem) {
		if it.file != nil {
			if f != os.Stdout {
				f.Close()
			}
			f = it.file
			a.reopening.Store(false)
			a.logger.Info("audit log reopened", "path", a.path)
			return
		}
		a.writeBegan.Store(time.Now().UnixNano())
		n, err := f.Write(it.line)
		a.writeBegan.Store(0)
		if err != nil && n > 0 {
			unwrite(f, n)
		}
		if err != nil {
			a.lastErr.Store(&writeFailure{err, string(it.line[:len(it.line)-1])})
			a.errors.Add(1)
		}
		a.queuedBytes.Add(-int64(len(it.line)))
		a.queued.Add(-1)
		select {
		case a.room <- struct{}{}:
		default: // one is waiting to be taken: a waiting event tries again anyway
		}
	}
	for {
		select {
		case it := <-a.queue:
			handle(it)
		case <-a.quit:
			for {
				select {
				case it := <-a.queue:
					handle(it)
				default:
					return
				}
			}
		}
	}
}

// unwrite takes back the n bytes of a line whose write ended short (a full
// disk, a file size limit): a line is whole or absent, and the next one
// must not be glued to a fragment, which stops every JSON-lines reader.
// A file is cut back to where the line began; what cannot be cut (a pipe,
// a device) gets a newline, so that the fragment stays a line of its own.
// Either way the line is counted as lost by the caller.
func unwrite(f *os.File, n int) {
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && f.Truncate(fi.Size()-int64(n)) == nil {
		// Without O_APPEND (stdout redirected with >) the offset stays past
		// the cut, and the next line would follow a run of NUL bytes.
		f.Seek(fi.Size()-int64(n), io.SeekStart)
		return
	}
	f.Write([]byte{'\n'})
}

// monitor reports lost lines and stalls, in bounded volume.
func (a *auditLog) monitor() {
	var r auditReporter
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-a.quit:
			return
		case now := <-tick.C:
			a.report(&r, now)
		}
	}
}

type auditReporter struct {
	errors, dropped          uint64
	errorsAt, droppedAt      time.Time
	stalledAt, stallReported time.Time
}

func (a *auditLog) report(r *auditReporter, now time.Time) {
	if n := a.errors.Load(); n > r.errors && now.Sub(r.errorsAt) >= auditReportEvery {
		attrs := []any{"path", a.path, "lines", n - r.errors, "total", n}
		if f := a.lastErr.Load(); f != nil {
			attrs = append(attrs, "err", f.err, "last_lost_line", f.line)
		}
		a.logger.Error("AUDIT LOG WRITE FAILED: these events are missing from the audit log", attrs...)
		r.errors, r.errorsAt = n, now
	}
	if n := a.dropped.Load(); n > r.dropped && now.Sub(r.droppedAt) >= auditReportEvery {
		a.logger.Error("AUDIT LOG LINES DROPPED: the audit sink does not keep up and the queue is full; these events are missing from the audit log",
			"path", a.path, "lines", n-r.dropped, "total", n, "queued", a.queued.Load())
		r.dropped, r.droppedAt = n, now
	}
	if began := a.writeBegan.Load(); began != 0 && now.Sub(time.Unix(0, began)) >= auditStallAfter {
		if now.Sub(r.stallReported) >= auditReportEvery {
			a.logger.Error("AUDIT LOG STALLED: a write to the audit sink has not returned; lines queue, then are dropped",
				"path", a.path, "blocked_for", now.Sub(time.Unix(0, began)).Round(time.Second), "queued", a.queued.Load())
			r.stallReported = now
		}
	}
}

// close lets the writer drain the queue until the end of the time
// beginClose started (which it must follow), then reports every lost line
// one last time, and returns the number of lines lost since the start, of
// every kind: failed writes, lines dropped from a full queue, and lines
// still queued at the end (the sink stalled). Any of them makes the exit
// status 1: audit is all or nothing.
func (a *auditLog) close(eventsDropped uint64) (lost int64) {
	close(a.quit)
	closing := a.closing.Load()
	timer := time.NewTimer(time.Until(closing.by))
	defer timer.Stop()
	var atExit int64
	select {
	case <-a.done:
	case <-timer.C:
		atExit = a.queued.Load()
	}
	var r auditReporter
	r.errorsAt = time.Now().Add(-auditReportEvery) // report now, whatever was reported before
	r.droppedAt = r.errorsAt
	r.stallReported = time.Now() // the stall is reported as lost lines below
	a.report(&r, time.Now())
	if atExit > 0 {
		a.logger.Error("AUDIT LOG LINES LOST AT EXIT: the audit sink did not take them within the shutdown bound",
			"path", a.path, "lines", atExit, "bound", closing.bound)
	}
	failed, dropped := a.errors.Load(), a.dropped.Load()
	lost = atExit + int64(failed) + int64(dropped) + int64(eventsDropped)
	if lost > 0 {
		a.logger.Error("the audit log is missing lines: exit status 1", "path", a.path, "lost", lost,
			"write_failed", failed, "dropped", dropped, "lost_at_exit", atExit, "event_dropped", eventsDropped)
	}
	return lost
}

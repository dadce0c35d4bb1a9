// Command monolock-bench is a load generator for a monolock server, in the
// spirit of redis-benchmark. It speaks the raw protocol and measures:
//
//	cycle     N workers dial, acquire a lock of their own, read ACQUIRED, close
//	handover  N workers contend for one lock; the time from a holder's close
//	          to the next holder's ACQUIRED
//	hold      K sessions hold or wait and heartbeat every lease/4; heartbeat
//	          reply latency, and with -pid the server's memory and CPU
//	detect    a holder goes silent; the time until its waiter is granted
//	flood     -flooders connections each send one valid ACQUIRE (a lock
//	          each, or -locks shared), then -burst HEARTBEAT bytes (0x02) in
//	          one write every -every, reading and discarding the replies
//	          (-read=false: never reading them); meanwhile one well-behaved
//	          prober dials, ACQUIREs a lock of its own, reads ACQUIRED and
//	          closes, a probe every 10ms: its latency, and with -pid the
//	          server's CPU beside this process's own (the attacker's) and
//	          the machine's other processes'
//	null      serve, at -addr, the null server the others can be run against:
//	          the same socket work as monolock with no lock table
//
// With -client, cycle and handover are measured in turns with the raw
// protocol and with the Go client's Do, and the ratio of the rates printed.
//
// Usage:
//
//	monolock-bench [flags] cycle|handover|hold|detect|flood|null
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/monolock-dev/monolock"
)

type config struct {
	Addr     string        `json:"addr"`
	Workers  int           `json:"workers"`
	Duration time.Duration `json:"duration"`
	Sessions int           `json:"sessions"`
	Locks    int           `json:"locks"`
	Lease    time.Duration `json:"lease"`
	Sources  int           `json:"sources"`
	Client   bool          `json:"client"` // through the Go client's Do instead of the raw protocol
	First    int           `json:"first"`  // index of this process's first session (workers)

	// flood
	Flooders int           `json:"flooders"`
	Burst    int           `json:"burst"`
	Every    time.Duration `json:"every"`
	Read     bool          `json:"read"`
}

func main() {
	var c config
	fs := flag.NewFlagSet("monolock-bench", flag.ExitOnError)
	fs.StringVar(&c.Addr, "addr", "127.0.0.1:7070", "server `address`")
	fs.IntVar(&c.Workers, "n", 8, "workers (cycle, handover)")
	fs.DurationVar(&c.Duration, "d", 10*time.Second, "how long to measure")
	fs.IntVar(&c.Sessions, "sessions", 1000, "sessions to open (hold)")
	fs.IntVar(&c.Locks, "locks", 0, "locks the sessions share (hold, flood; 0: one each, all holders)")
	fs.DurationVar(&c.Lease, "lease", 5*time.Second, "lease of every session")
	fs.IntVar(&c.Sources, "sources", 1, "loopback source addresses to spread connections over: 127.0.0.1, 127.0.0.2, ...")
	fs.BoolVar(&c.Client, "client", false, "cycle, handover: measure the raw protocol and the Go client's Do in turn, and their ratio")
	fs.IntVar(&c.Flooders, "flooders", 200, "flooding connections (flood)")
	fs.IntVar(&c.Burst, "burst", 2048, "HEARTBEAT bytes each flooder writes at once (flood)")
	fs.DurationVar(&c.Every, "every", 100*time.Millisecond, "how often each flooder writes its burst (flood)")
	fs.BoolVar(&c.Read, "read", true, "flood: flooders read and discard their replies (false: they never read)")
	procs := fs.Int("procs", 1, "worker processes to split the connections over (cycle, hold)")
	pid := fs.Int("pid", 0, "the server's process id, to report its memory and CPU (hold), or its CPU beside this process's and the machine's (flood)")
	worker := fs.Bool("worker", false, "run as a worker process of another monolock-bench (internal)")
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "Usage: monolock-bench [flags] cycle|handover|hold|detect|flood|null")
		fs.PrintDefaults()
	}
	fs.Parse(os.Args[1:])
	if fs.NArg() != 1 {
		fs.Usage()
		os.Exit(2)
	}
	scenario := fs.Arg(0)
	limit := raiseFileLimit()

	if *worker {
		var r result
		switch scenario {
		case "cycle":
			r = cycle(c)
		case "hold":
			r = hold(c, func() {
				fmt.Println("ready")
				os.Stdin.Read(make([]byte, 1)) // the parent starts every worker at once
			})
		}
		json.NewEncoder(os.Stdout).Encode(r)
		return
	}

	if scenario == "null" {
		serveNull(c.Addr)
		return
	}
	fmt.Printf("monolock-bench %s: server %s, descriptor limit %d, %d process(es), %d source address(es)\n",
		scenario, c.Addr, limit, *procs, c.Sources)
	switch scenario {
	case "cycle":
		sideBySide(c, "acquire-release cycles (dial, ACQUIRE, ACQUIRED, close)", func(c config) result {
			return split(c, *procs, scenario, c.Workers, nil)
		})
	case "handover":
		sideBySide(c, "handovers (holder's close to the next holder's ACQUIRED)", handover)
	case "hold":
		var idle, loaded procStat
		if *pid != 0 {
			idle = readProc(*pid)
		}
		// Between the ramp-up and the heartbeat window: the server's memory
		// with every session open, and its CPU counter at the start.
		ready := func() {
			if *pid != 0 {
				time.Sleep(time.Second)
				loaded = readProc(*pid)
			}
		}
		r := split(c, *procs, scenario, c.Sessions, ready)
		fmt.Printf("sessions open: %d (%d failed) in %v\n", r.Opened, r.Failed, r.RampUp.Round(time.Millisecond))
		if *pid != 0 {
			done := readProc(*pid)
			fmt.Printf("server RSS: %.1f MiB idle, %.1f MiB with the sessions: %.2f KiB per session\n",
				float64(idle.rss)/(1<<20), float64(loaded.rss)/(1<<20),
				float64(loaded.rss-idle.rss)/float64(max(r.Opened, 1))/1024)
			fmt.Printf("server CPU while heartbeating: %.1f%% of one core\n",
				100*(done.ticks-loaded.ticks)/clockTicks/c.Duration.Seconds())
		}
		r.print("heartbeat replies (send to reply)", c.Duration)
	case "detect":
		detect(c).print("detections (silent holder's last send to the waiter's ACQUIRED)", 0)
	case "flood":
		if c.Flooders < 0 || c.Flooders > 0 && (c.Burst < 1 || c.Every <= 0) {
			fmt.Fprintln(os.Stderr, "flood: -flooders must not be negative, -burst must be positive, -every must be positive")
			os.Exit(2)
		}
		flood(c, *pid)
	default:
		fs.Usage()
		os.Exit(2)
	}
}

// sideBySide runs measure once, or with -client in turns of 250ms, raw,
// Do, raw, Do..., so that a change in the machine's load weighs on both
// alike; it prints each and the ratio of the rates.
func sideBySide(c config, what string, measure func(config) result) {
	if !c.Client {
		measure(c).print(what, c.Duration)
		return
	}
	var raw, do result
	half := c
	half.Duration = 250 * time.Millisecond
	for range max(1, c.Duration/(2*half.Duration)) {
		half.Client = false
		raw.merge(measure(half))
		half.Client = true
		do.merge(measure(half))
	}
	raw.print("raw protocol: "+what, c.Duration)
	do.print("Go client Do: "+what, c.Duration)
	fmt.Printf("ratio Do/raw: %.3f\n", float64(len(do.Samples))/float64(max(len(raw.Samples), 1)))
}

func (r *result) merge(o result) {
	r.Samples = append(r.Samples, o.Samples...)
	r.Errors += o.Errors
	r.Opened += o.Opened
	r.Failed += o.Failed
	r.RampUp = max(r.RampUp, o.RampUp)
}

// result is what a scenario measured; workers send it as JSON.
type result struct {
	Samples []time.Duration `json:"samples"`
	Errors  int             `json:"errors"`
	Opened  int             `json:"opened"`
	Failed  int             `json:"failed"`
	RampUp  time.Duration   `json:"ramp_up"`
}

func (r result) print(what string, d time.Duration) {
	s := slices.Clone(r.Samples)
	slices.Sort(s)
	if len(s) == 0 {
		fmt.Printf("%s: none measured (%d errors)\n", what, r.Errors)
		return
	}
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1)] }
	fmt.Printf("%s: %d", what, len(s))
	if d > 0 {
		fmt.Printf(" in %v (%.0f/s)", d, float64(len(s))/d.Seconds())
	}
	fmt.Printf(", %d errors\n  latency p50 %s  p90 %s  p99 %s  max %s\n", r.Errors, ms(q(0.5)), ms(q(0.9)), ms(q(0.99)), ms(s[len(s)-1]))
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 3, 64) + "ms" }

// split runs the scenario in procs worker processes, each with its share
// of n, and merges what they measured. For hold, ready runs once every
// worker has opened its sessions, before any heartbeat is measured.
func split(c config, procs int, scenario string, n int, ready func()) result {
	if ready == nil {
		ready = func() {}
	}
	if procs <= 1 {
		if scenario == "cycle" {
			return cycle(c)
		}
		return hold(c, ready)
	}
	var merged result
	var mu sync.Mutex
	var wg, opened sync.WaitGroup
	start := make(chan struct{})
	opened.Add(procs)
	go func() {
		opened.Wait()
		ready()
		close(start)
	}()
	for p := range procs {
		share := n / procs
		if p < n%procs {
			share++
		}
		wc := c
		wc.Workers, wc.Sessions = share, share
		wc.First = p * (n/procs + 1)
		wg.Go(func() {
			args := []string{"-worker", "-addr", wc.Addr, "-n", strconv.Itoa(wc.Workers), "-d", wc.Duration.String(),
				"-sessions", strconv.Itoa(wc.Sessions), "-locks", strconv.Itoa(wc.Locks), "-lease", wc.Lease.String(),
				"-sources", strconv.Itoa(wc.Sources), "-client=" + strconv.FormatBool(wc.Client), scenario}
			cmd := exec.Command(os.Args[0], args...)
			cmd.Env = append(os.Environ(), "MONOLOCK_BENCH_FIRST="+strconv.Itoa(wc.First))
			cmd.Stderr = os.Stderr
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			var r result
			err := cmd.Start()
			if err == nil {
				out := bufio.NewReader(stdout)
				if scenario == "hold" {
					out.ReadString('\n') // "ready"
					opened.Done()
					<-start
				}
				stdin.Write([]byte{1})
				err = json.NewDecoder(out).Decode(&r)
				cmd.Wait()
			} else if scenario == "hold" {
				opened.Done()
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				fmt.Fprintf(os.Stderr, "worker %d: %v\n", p, err)
				merged.Errors++
				return
			}
			merged.merge(r)
		})
	}
	wg.Wait()
	return merged
}

var sourceIndex atomic.Int64

// dial connects from one of the -sources loopback addresses in turn.
func dial(c config) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	if c.Sources > 1 {
		i := sourceIndex.Add(1) % int64(c.Sources)
		d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i))}
	}
	return d.Dial("tcp", c.Addr)
}

// dialer is dial for the Go client.
type dialer struct{ c config }

func (d dialer) DialContext(context.Context, string, string) (net.Conn, error) { return dial(d.c) }

func acquireFrame(name string, lease time.Duration) []byte {
	b, _ := monolock.Frame{Type: monolock.TypeAcquire, LeaseMS: uint32(lease / time.Millisecond), Name: name}.AppendBinary(nil)
	return b
}

// readGrant reads frames until ACQUIRED.
func readGrant(r io.Reader) error {
	for {
		f, err := monolock.ReadFrame(r)
		if err != nil {
			return err
		}
		switch f.Type {
		case monolock.TypeAcquired:
			return nil
		case monolock.TypeError:
			return &monolock.ServerError{Code: f.Code, Reason: f.Reason}
		}
	}
}

func cycle(c config) result {
	var r result
	var mu sync.Mutex
	end := time.Now().Add(c.Duration)
	prefix := "cycle-" + os.Getenv("MONOLOCK_BENCH_FIRST") + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" // names of this turn alone
	client := monolock.New(monolock.Config{Address: c.Addr, Dialer: dialer{c}})
	var wg sync.WaitGroup
	for w := range c.Workers {
		wg.Go(func() {
			var samples []time.Duration
			errs := 0
			for i := 0; time.Now().Before(end); i++ {
				start := time.Now()
				if c.Client {
					var took time.Duration
					err := client.Do(context.Background(), prefix+strconv.Itoa(w)+"-"+strconv.Itoa(i), c.Lease,
						func(context.Context, uint64) error { took = time.Since(start); return nil })
					if err != nil {
						errs++
					} else {
						samples = append(samples, took)
					}
					continue
				}
				conn, err := dial(c)
				if err != nil {
					errs++
					continue
				}
				conn.Write(acquireFrame(prefix+strconv.Itoa(w)+"-"+strconv.Itoa(i), c.Lease))
				if err := readGrant(conn); err != nil {
					errs++
				} else {
					samples = append(samples, time.Since(start))
				}
				conn.Close()
			}
			mu.Lock()
			r.Samples = append(r.Samples, samples...)
			r.Errors += errs
			mu.Unlock()
		})
	}
	wg.Wait()
	return r
}

func handover(c config) result {
	type grant struct{ granted, released time.Time }
	var mu sync.Mutex
	var grants []grant
	errs := 0
	end := time.Now().Add(c.Duration)
	client := monolock.New(monolock.Config{Address: c.Addr, Dialer: dialer{c}})
	var wg sync.WaitGroup
	for range c.Workers {
		wg.Go(func() {
			for time.Now().Before(end) {
				if c.Client {
					var g grant
					err := client.Do(context.Background(), "handover", c.Lease, func(context.Context, uint64) error {
						g.granted = time.Now()
						g.released = time.Now()
						return nil
					})
					mu.Lock()
					if err != nil {
						errs++
					} else {
						grants = append(grants, g)
					}
					mu.Unlock()
					continue
				}
				conn, err := dial(c)
				if err != nil {
					mu.Lock()
					errs++
					mu.Unlock()
					continue
				}
				conn.Write(acquireFrame("handover", c.Lease))
				err = readGrant(bufio.NewReaderSize(conn, 64))
				g := grant{granted: time.Now()}
				g.released = time.Now()
				conn.Close()
				mu.Lock()
				if err != nil {
					errs++
				} else {
					grants = append(grants, g)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.SortFunc(grants, func(a, b grant) int { return a.granted.Compare(b.granted) })
	r := result{Errors: errs}
	for i := 1; i < len(grants); i++ {
		// Only handovers to a waiter already queued: a gap means nobody waited.
		if d := grants[i].granted.Sub(grants[i-1].released); d >= 0 && d < 100*time.Millisecond {
			r.Samples = append(r.Samples, d)
		}
	}
	return r
}

// hold opens the sessions, each heartbeating every lease/4 from the moment
// it is open, calls ready once all are, and then measures the replies for
// the duration.
func hold(c config, ready func()) result {
	var r result
	first, _ := strconv.Atoi(os.Getenv("MONOLOCK_BENCH_FIRST"))
	interval := c.Lease / 4
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		measure  = make(chan struct{}) // closed when the window opens
		stop     atomic.Bool
		windowAt time.Time
	)
	start := time.Now()
	for i := range c.Sessions {
		name := "hold-" + strconv.Itoa(first+i)
		if c.Locks > 0 {
			name = "hold-" + strconv.Itoa((first+i)%c.Locks)
		}
		conn, err := dial(c)
		if err != nil {
			if r.Failed++; r.Failed == 1 {
				fmt.Fprintf(os.Stderr, "dial: %v\n", err)
			}
			continue
		}
		conn.Write(acquireFrame(name, c.Lease))
		br := bufio.NewReaderSize(conn, 64)
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := monolock.ReadFrame(br); err != nil {
			r.Failed++
			conn.Close()
			continue
		}
		r.Opened++
		wg.Go(func() {
			defer conn.Close()
			var samples []time.Duration
			errs := 0
			hb := []byte{monolock.TypeHeartbeat}
			for next := time.Now().Add(interval); !stop.Load(); next = next.Add(interval) {
				time.Sleep(time.Until(next))
				sent := time.Now()
				conn.SetDeadline(sent.Add(c.Lease))
				_, err := conn.Write(hb)
				if err == nil {
					// A waiter may read its promotion first: replies are
					// what answer the heartbeat, and WAITING or ACQUIRED
					// both do.
					_, err = monolock.ReadFrame(br)
				}
				if err != nil {
					errs++
					break
				}
				select {
				case <-measure:
					if !sent.Before(windowAt) && sent.Before(windowAt.Add(c.Duration)) {
						samples = append(samples, time.Since(sent))
					}
				default:
				}
			}
			mu.Lock()
			r.Samples = append(r.Samples, samples...)
			r.Errors += errs
			mu.Unlock()
		})
	}
	r.RampUp = time.Since(start)
	ready()
	windowAt = time.Now()
	close(measure)
	time.Sleep(c.Duration)
	stop.Store(true)
	wg.Wait()
	return r
}

func detect(c config) result {
	var r result
	for i := range 5 {
		name := "detect-" + strconv.Itoa(i) + "-" + strconv.FormatInt(time.Now().UnixNano(), 10)
		holder, err := dial(c)
		if err != nil {
			r.Errors++
			continue
		}
		sent := time.Now()
		holder.Write(acquireFrame(name, c.Lease))
		if err := readGrant(holder); err != nil {
			r.Errors++
			holder.Close()
			continue
		}
		waiter, err := dial(c)
		if err != nil {
			r.Errors++
			holder.Close()
			continue
		}
		waiter.Write(acquireFrame(name, time.Hour))
		if err := readGrant(waiter); err != nil {
			r.Errors++
		} else {
			r.Samples = append(r.Samples, time.Since(sent))
		}
		holder.Close()
		waiter.Close()
	}
	fmt.Printf("lease %v: the server can drop a silent holder no sooner than its lease after its last frame\n", c.Lease)
	return r
}

// flood's prober starts a probe every probeEvery (at once after one that
// took longer); its window opens floodWarmup after the bursts begin.
const (
	probeEvery  = 10 * time.Millisecond
	floodWarmup = time.Second
)

// flood opens c.Flooders sessions, each with one valid ACQUIRE (a lock of
// its own, or with -locks, one of that many), then has each write c.Burst
// HEARTBEAT bytes at once every c.Every, spread evenly over the interval. A
// write the server does not take blocks its flooder, and a burst that is late
// does not make up for the ones it missed. A flooder whose connection ends
// dials again. After floodWarmup, one prober measures dial to ACQUIRED on a
// lock of its own for c.Duration; with pid, the server's CPU, this
// process's and the machine's other processes' over the same window are
// printed.
func flood(c config, pid int) {
	var (
		stop                   atomic.Bool
		bursts, sent, received atomic.Int64
		reconnects, dialErrors atomic.Int64
		mu                     sync.Mutex
		conns                  = map[net.Conn]struct{}{} // every flooder's connection, closed at the end
		wg                     sync.WaitGroup
	)
	stamp := strconv.FormatInt(time.Now().UnixNano(), 36) // names of this run alone
	errStopped := errors.New("stopped")
	// open dials, ACQUIREs and reads the first reply, WAITING or ACQUIRED;
	// with -read, a goroutine then reads and discards everything else.
	open := func(i int) (net.Conn, error) {
		name := "flood-" + stamp + "-" + strconv.Itoa(i)
		if c.Locks > 0 {
			name = "flood-" + stamp + "-lock-" + strconv.Itoa(i%c.Locks)
		}
		conn, err := dial(c)
		if err != nil {
			return nil, err
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = conn.Write(acquireFrame(name, c.Lease))
		var f monolock.Frame
		if err == nil {
			f, err = monolock.ReadFrame(conn)
		}
		if err == nil && f.Type == monolock.TypeError {
			err = &monolock.ServerError{Code: f.Code, Reason: f.Reason}
		}
		if err != nil {
			conn.Close()
			return nil, err
		}
		conn.SetDeadline(time.Time{})
		mu.Lock()
		defer mu.Unlock()
		if stop.Load() {
			conn.Close()
			return nil, errStopped
		}
		conns[conn] = struct{}{}
		if c.Read {
			wg.Go(func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := conn.Read(buf)
					received.Add(int64(n))
					if err != nil {
						return
					}
				}
			})
		}
		return conn, nil
	}

	rampStart := time.Now()
	var opened []net.Conn
	failed := 0
	for i := range c.Flooders {
		conn, err := open(i)
		if err != nil {
			if failed++; failed == 1 {
				fmt.Fprintf(os.Stderr, "flooder %d: %v\n", i, err)
			}
			continue
		}
		opened = append(opened, conn)
	}
	readMode := "reading and discarding their replies"
	if !c.Read {
		readMode = "never reading their replies"
	}
	locks := "a lock each, all holders"
	if c.Locks > 0 {
		locks = fmt.Sprintf("%d lock(s) shared", c.Locks)
	}
	fmt.Printf("flooders open: %d (%d failed) in %v, %s; each writes %d HEARTBEAT bytes every %v, %s\n",
		len(opened), failed, time.Since(rampStart).Round(time.Millisecond), locks, c.Burst, c.Every, readMode)

	burst := bytes.Repeat([]byte{monolock.TypeHeartbeat}, c.Burst)
	begin := time.Now()
	for i, conn := range opened {
		wg.Go(func() {
			next := begin.Add(c.Every * time.Duration(i) / time.Duration(len(opened)))
			for {
				time.Sleep(time.Until(next))
				if stop.Load() {
					return
				}
				if _, err := conn.Write(burst); err != nil {
					mu.Lock()
					delete(conns, conn)
					mu.Unlock()
					conn.Close()
					for {
						if stop.Load() {
							return
						}
						if conn, err = open(i); err == nil {
							break
						}
						dialErrors.Add(1)
						time.Sleep(100 * time.Millisecond)
					}
					reconnects.Add(1)
					next = time.Now()
					continue
				}
				bursts.Add(1)
				sent.Add(int64(len(burst)))
				next = next.Add(c.Every)
				if now := time.Now(); next.Before(now) {
					next = now // late: the missed bursts are not made up
				}
			}
		})
	}

	time.Sleep(floodWarmup)
	var server0, self0 procStat
	var machine0 float64
	if pid != 0 {
		server0, self0, machine0 = readProc(pid), readProc(os.Getpid()), machineTicks()
	}
	bursts0, sent0, received0 := bursts.Load(), sent.Load(), received.Load()
	reconnects0, dialErrors0 := reconnects.Load(), dialErrors.Load()
	windowAt := time.Now()
	var r result
	prefix := "flood-probe-" + stamp + "-"
	for i := 0; ; i++ {
		start := time.Now()
		if !start.Before(windowAt.Add(c.Duration)) {
			break
		}
		if err := probe(c, prefix+strconv.Itoa(i), start); err != nil {
			if r.Errors++; r.Errors == 1 {
				fmt.Fprintf(os.Stderr, "probe %d: %v\n", i, err)
			}
		} else {
			r.Samples = append(r.Samples, time.Since(start))
		}
		time.Sleep(time.Until(start.Add(probeEvery)))
	}
	window := time.Since(windowAt)
	var server1, self1 procStat
	var machine1 float64
	if pid != 0 {
		server1, self1, machine1 = readProc(pid), readProc(os.Getpid()), machineTicks()
	}
	nb, ns, nr := bursts.Load()-bursts0, sent.Load()-sent0, received.Load()-received0
	nc, nd := reconnects.Load()-reconnects0, dialErrors.Load()-dialErrors0

	stop.Store(true)
	mu.Lock()
	for conn := range conns {
		conn.Close()
	}
	mu.Unlock()
	wg.Wait()

	fmt.Printf("window %v: %d bursts written (about %.0f scheduled), %.1f MB of HEARTBEATs sent (%.0f/s), %.1f MB of replies read, %d reconnects (%d failed dials)\n",
		window.Round(time.Millisecond), nb, float64(len(opened))*window.Seconds()/c.Every.Seconds(),
		float64(ns)/1e6, float64(ns)/window.Seconds(), float64(nr)/1e6, nc, nd)
	if pid != 0 {
		pct := func(ticks float64) float64 { return 100 * ticks / clockTicks / window.Seconds() }
		server, self := server1.ticks-server0.ticks, self1.ticks-self0.ticks
		fmt.Printf("CPU over the window, in %% of one core: server %.1f%%, monolock-bench (the flooders and the prober) %.1f%%, the machine's other processes %.1f%%\n",
			pct(server), pct(self), pct(machine1-machine0-server-self))
	}
	r.print("prober acquires (dial to ACQUIRED, a lock of its own)", window.Round(time.Millisecond))
}

// probe dials, ACQUIREs name, reads ACQUIRED and closes, within 30s of start.
func probe(c config, name string, start time.Time) error {
	conn, err := dial(c)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(start.Add(30 * time.Second))
	if _, err := conn.Write(acquireFrame(name, c.Lease)); err != nil {
		return err
	}
	return readGrant(conn)
}

// raiseFileLimit raises the soft descriptor limit to the hard one.
func raiseFileLimit() uint64 {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return 0
	}
	l.Cur = l.Max
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l)
	return uint64(l.Cur) // int64 on the BSDs
}

const clockTicks = 100 // USER_HZ on Linux

// machineTicks is the CPU the whole machine spent, in ticks: user, nice,
// system, irq, softirq and steal from /proc/stat.
func machineTicks() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	total := 0.0
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		if i < len(f) {
			v, _ := strconv.ParseFloat(f[i], 64)
			total += v
		}
	}
	return total
}

type procStat struct {
	rss   int64   // bytes
	ticks float64 // user + system CPU
}

func readProc(pid int) procStat {
	var st procStat
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "VmRSS:") {
				kb, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
				st.rss = kb * 1024
			}
		}
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		utime, _ := strconv.ParseFloat(f[11], 64)
		stime, _ := strconv.ParseFloat(f[12], 64)
		st.ticks = utime + stime
	}
	return st
}

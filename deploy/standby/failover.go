//go:build ignore

// The client of failover.sh: a DoRetry loop that takes one lock again and
// again through HAProxy, checks that every fencing token is above the last
// one seen, SIGKILLs the primary after -kill-after, and reports the time
// from the kill to the next grant, which only the standby can give.
//
//	go run deploy/standby/failover.go -addr FRONT -kill PID -standby-ops HOST:PORT
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/monolock-dev/monolock"
)

func main() {
	addr := flag.String("addr", "", "HAProxy's front `address`")
	pid := flag.Int("kill", 0, "the primary's `pid`, to SIGKILL")
	killAfter := flag.Duration("kill-after", 3*time.Second, "SIGKILL the primary this long after the start")
	run := flag.Duration("d", 12*time.Second, "run this long")
	lease := flag.Duration("lease", 2*time.Second, "the lease of each claim")
	hold := flag.Duration("hold", 20*time.Millisecond, "how long each grant holds the lock")
	detection := flag.Duration("detection", 3*time.Second, "HAProxy's detection time: fall × inter")
	standbyOps := flag.String("standby-ops", "", "the standby's ops `address`, to read its grant count")
	flag.Parse()

	start := time.Now()
	at := func() string { return fmt.Sprintf("%7.3fs", time.Since(start).Seconds()) }
	var mu sync.Mutex
	var killed time.Time
	time.AfterFunc(*killAfter, func() {
		mu.Lock()
		defer mu.Unlock()
		if err := syscall.Kill(*pid, syscall.SIGKILL); err != nil {
			fmt.Println("failover: kill:", err)
			os.Exit(1)
		}
		killed = time.Now()
		fmt.Println(at(), "primary SIGKILLed")
	})
	c := monolock.New(monolock.Config{Address: *addr, OnRetry: func(attempt int, err error, wait time.Duration) {
		fmt.Printf("%s retry %d: %v; next in %v\n", at(), attempt, err, wait.Round(time.Millisecond))
	}})
	ctx, cancel := context.WithTimeout(context.Background(), *run)
	defer cancel()
	var last uint64
	var before, after, backwards int
	var gap time.Duration
	for ctx.Err() == nil {
		err := c.DoRetry(ctx, "failover", *lease, func(held context.Context, token uint64) error {
			mu.Lock()
			k := killed
			mu.Unlock()
			switch {
			case k.IsZero():
				before++
			case after == 0:
				gap = time.Since(k)
				fmt.Printf("%s first grant after the kill, token %d (last before it %d)\n", at(), token, last)
				fallthrough
			default:
				after++
			}
			if token <= last {
				backwards++
				fmt.Printf("%s token %d after %d: BACKWARDS\n", at(), token, last)
			}
			last = token
			select {
			case <-time.After(*hold):
			case <-held.Done():
			}
			return nil
		})
		if err != nil && ctx.Err() == nil {
			fmt.Printf("%s lost: %v\n", at(), err)
		}
	}

	goal := *lease + *detection + time.Second
	fmt.Printf("failover: %d grants before the kill, %d after it; tokens that went backwards: %d\n", before, after, backwards)
	if *standbyOps != "" {
		fmt.Printf("failover: the standby's monolock_acquires_total: %s\n", acquires(*standbyOps))
	}
	switch {
	case after == 0:
		fmt.Println("failover: FAIL: no grant after the kill")
	case backwards > 0:
		fmt.Println("failover: FAIL: tokens went backwards")
	case gap > goal:
		fmt.Printf("failover: FAIL: kill to first grant %v, goal %v (lease %v + detection %v + 1s)\n",
			gap.Round(time.Millisecond), goal, *lease, *detection)
	default:
		fmt.Printf("failover: ok: kill to first grant %v, goal %v (lease %v + detection %v + 1s)\n",
			gap.Round(time.Millisecond), goal, *lease, *detection)
		return
	}
	os.Exit(1)
}

// acquires reads monolock_acquires_total from the ops endpoint at addr.
func acquires(addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	for s := bufio.NewScanner(resp.Body); s.Scan(); {
		if v, ok := strings.CutPrefix(s.Text(), "monolock_acquires_total "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return strconv.FormatFloat(n, 'f', -1, 64)
		}
	}
	return "not found"
}

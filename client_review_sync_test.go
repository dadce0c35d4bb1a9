package monolock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// Tiny and huge leases: the first heartbeat at exactly lease/4 after the
// ACQUIRE's send, and the loss at exactly 0.8 of the lease when nothing
// answers it.
func TestClientReviewSyncLeaseExtremes(t *testing.T) {
	for _, lease := range []time.Duration{time.Millisecond, 3 * time.Millisecond, 5 * time.Millisecond, 401 * time.Millisecond, MaxLease} {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			hb := make(chan time.Duration, 10)
			c := pipeClient(func(s *script) {
				if _, ok := s.read(); !ok {
					return
				}
				s.write(Frame{Type: TypeAcquired, Token: 1})
				for {
					if _, ok := s.read(); !ok {
						return
					}
					hb <- time.Since(start)
				}
			})
			l, err := c.Acquire(context.Background(), "x", lease)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release()
			<-l.Done()
			lost := time.Since(start)
			var sends []time.Duration
			for len(hb) > 0 {
				sends = append(sends, <-hb)
			}
			if lost != lease/5*4 || len(sends) != 1 || sends[0] != lease/4 || !errors.Is(l.Err(), ErrHeartbeatTimeout) {
				t.Errorf("lease %v: lost at %v (%v), heartbeats at %v; want loss at %v, one heartbeat at %v",
					lease, lost, l.Err(), sends, lease/5*4, lease/4)
			}
		})
	}
}

// Graceful stop, then a loss while fn is still stopping: the loss is
// joined; no loss: nothing joined and heartbeats went on.
func TestClientReviewSyncGracefulStopThenLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = time.Second
		var hbs atomic.Int32
		c := pipeClient(func(s *script) {
			if _, ok := s.read(); !ok {
				return
			}
			s.write(Frame{Type: TypeAcquired, Token: 1})
			for {
				if _, ok := s.read(); !ok {
					return
				}
				hbs.Add(1)
				if !s.write(Frame{Type: TypeAcquired, Token: 1}) {
					return
				}
			}
		})
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		err := c.Do(ctx, "x", lease, func(fctx context.Context, _ uint64) error {
			<-fctx.Done()
			time.Sleep(3 * time.Second) // stopping slowly, heartbeats go on
			return nil
		})
		if err != nil || hbs.Load() < 10 {
			t.Errorf("Do = %v after %d heartbeats", err, hbs.Load())
		}
	})
}

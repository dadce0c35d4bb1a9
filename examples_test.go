package monolock_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/monolock-dev/monolock"
)

func ExampleClient_Do() {
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := &monolock.Server{}
	go srv.Serve(l)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer srv.Shutdown(ctx)

	client := monolock.New(monolock.Config{Address: l.Addr().String()})
	err := client.Do(ctx, "nightly-import", 10*time.Second,
		func(ctx context.Context, token uint64) error {
			// Pass token to every write to the guarded resource, and stop
			// as soon as ctx is done: the lock is no longer confirmed.
			fmt.Println("holding nightly-import:", token > 0)
			return nil
		})
	fmt.Println("released:", err)
	// Output:
	// holding nightly-import: true
	// released: <nil>
}

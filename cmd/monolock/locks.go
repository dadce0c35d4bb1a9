package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
)

const locksUsage = `Usage: monolock locks [flags]

Prints who holds what, from a server's admin API (its -admin-listen): each
lock with a holder or waiters, its holder, how long it has been held, its
fencing token and the number of waiters.

Flags (a flag beats its environment variable, which beats the default):
`

func locksMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("monolock locks", flag.ContinueOnError)
	admin := fs.String("admin", "127.0.0.1:7071", "`address` of the server's admin API")
	match := fs.String("match", "", "only the locks whose name matches this `glob` (* and ?)")
	if code, ok := parse(fs, args, map[string]string{"admin": "MONOLOCK_ADMIN_ADDRESS"}, locksUsage, stdout, stderr); !ok {
		return code
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "monolock locks: "+format+"\n", a...)
		return 1
	}
	u := url.URL{Scheme: "http", Host: *admin, Path: "/api/locks"}
	if *match != "" {
		u.RawQuery = url.Values{"match": {*match}}.Encode()
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(u.String())
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fail("nothing listens on %s: monolock locks reads the server's admin API, which is off unless the server runs with -admin-listen (MONOLOCK_ADMIN_LISTEN_ADDRESS); give its address with -admin (%v)", *admin, err)
	}
	if err != nil {
		return fail("%v", err)
	}
	defer resp.Body.Close()
	var body struct {
		Locks []lockJSON `json:"locks"`
		Error string     `json:"error"`
	}
	// The status and the reason are text of whatever answers at -admin.
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fail("%s answered %s, not the admin API's JSON: %v", *admin, printable(resp.Status), err)
	}
	if resp.StatusCode != http.StatusOK {
		return fail("%s: %s", printable(resp.Status), printable(body.Error))
	}
	if body.Locks == nil { // the API's list is never null: another JSON service
		return fail("%s answered %s with no list of locks: not the admin API", *admin, printable(resp.Status))
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tHOLDER\tHELD FOR\tTOKEN\tWAITERS")
	now := time.Now()
	for _, l := range body.Locks {
		holder, held, token := "-", "-", "-"
		if h := l.Holder; h != nil {
			holder = h.RemoteAddr
			if h.Identity != "" {
				holder = h.Identity + " (" + h.RemoteAddr + ")"
			}
			held = roundDuration(now.Sub(h.Since)).String()
			token = strconv.FormatUint(h.Token, 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", printable(l.Name), printable(holder), held, token, len(l.Waiters))
	}
	tw.Flush()
	return 0
}

func roundDuration(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}

// printable quotes a name that would upset a table: names are raw bytes.
func printable(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || r == '\t' }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The environment monolock run gives COMMAND, field by field, and when
// runs nest: the inner run finds the server in the outer's
// MONOLOCK_ADDRESS (which is also run's -addr variable), and its COMMAND
// sees the inner lock and token, each the one the server granted (as its
// audit log says).
func TestRunEnvironmentAlsoWhenNested(t *testing.T) {
	dir := t.TempDir()
	audit := filepath.Join(dir, "audit.log")
	s := start(t, nil, "-audit-log", audit)
	out := filepath.Join(dir, "env")
	show := `echo "$1 lock=$MONOLOCK_LOCK token=$MONOLOCK_TOKEN address=$MONOLOCK_ADDRESS" >> "$0"`
	inner := fmt.Sprintf(`%s; %q run inner/lock -- sh -c '%s' "$0" inner`, show, binary, show)
	code, stderr := runSync(t, "-addr", s.addr, "outer lock", "--", "sh", "-c", inner, out, "outer")
	if code != 0 {
		t.Fatalf("exit %d; stderr %s", code, stderr)
	}
	waitForAuditLines(t, audit, 4)
	f, err := os.Open(audit)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	granted := map[string]uint64{}
	for _, r := range readAudit(t, f) {
		if r.Event == "granted" {
			granted[r.Lock] = r.Token
		}
	}
	data, _ := os.ReadFile(out)
	want := fmt.Sprintf("outer lock=outer lock token=%d address=%s\ninner lock=inner/lock token=%d address=%s\n",
		granted["outer lock"], s.addr, granted["inner/lock"], s.addr)
	if string(data) != want || granted["outer lock"] == 0 || granted["inner/lock"] <= granted["outer lock"] {
		t.Fatalf("COMMAND's environment:\n%s\nwant (from the audit log's grants):\n%s", data, want)
	}
	if strings.Contains(stderr, "waiting") {
		t.Fatalf("stderr %q", stderr)
	}
}

package main

import (
	"os/exec"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// goVersionM reads the build information of the binary the way an
// operator would, with go version -m: the main module's version, the
// vcs.revision (or "unknown") and the Go version.
func goVersionM(t *testing.T) (version, revision, goVersion string) {
	t.Helper()
	out, err := exec.Command("go", "version", "-m", binary).Output()
	if err != nil {
		t.Fatalf("go version -m: %v", err)
	}
	revision = "unknown"
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && strings.HasSuffix(f[0], ":"):
			goVersion = f[1]
		case len(f) >= 3 && f[0] == "mod":
			version = f[2]
		case len(f) >= 2 && f[0] == "build" && strings.HasPrefix(f[1], "vcs.revision="):
			revision = strings.TrimPrefix(f[1], "vcs.revision=")
		}
	}
	if version == "" || goVersion == "" {
		t.Fatalf("go version -m says nothing of the module or Go version:\n%s", out)
	}
	return version, revision, goVersion
}

func TestVersionFlagAndSubcommandPrintTheBuildInformation(t *testing.T) {
	version, revision, goVersion := goVersionM(t)
	want := regexp.MustCompile(`^monolock ` + regexp.QuoteMeta(version) + `, revision ` + regexp.QuoteMeta(revision) +
		`( \(modified\))?, ` + regexp.QuoteMeta(goVersion) + ` ` + runtime.GOOS + `/` + runtime.GOARCH + "\n$")
	for _, args := range [][]string{{"-version"}, {"version"}, {"-log-level", "debug", "-version"}} {
		cmd := exec.Command(binary, args...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("monolock %v: %v; stderr: %s", args, err, stderr.String())
		}
		if !want.Match(out) {
			t.Errorf("monolock %v printed %q, want a line matching %s", args, out, want)
		}
		if stderr.Len() > 0 {
			t.Errorf("monolock %v wrote to stderr: %s", args, stderr.String())
		}
	}
	out, err := exec.Command(binary, "version", "extra").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Errorf("monolock version extra: %v (%s), want exit status 2", err, out)
	}
}

func TestBuildInfoMetric(t *testing.T) {
	version, revision, goVersion := goVersionM(t)
	s := start(t, nil, "-ops-listen", "127.0.0.1:0")
	values, body := metrics(t, s)
	checkExposition(t, body)
	sample := `monolock_build_info{version="` + version + `",revision="` + revision + `",goversion="` + goVersion + `"}`
	if v, ok := values[sample]; !ok || v != 1 {
		t.Fatalf("want the sample %s 1 in /metrics, got:\n%s", sample, body)
	}
	if !strings.Contains(body, "# TYPE monolock_build_info gauge\n") {
		t.Errorf("monolock_build_info is not announced as a gauge:\n%s", body)
	}
}

// A container build has no .git to stamp from; the Dockerfile passes the
// version and revision with -ldflags -X instead.
func TestVersionStampedByTheLinker(t *testing.T) {
	bin := t.TempDir() + "/monolock"
	build := exec.Command("go", "build", "-o", bin,
		"-ldflags", "-X main.stampVersion=v1.2.3 -X main.stampRevision=0123abcd", ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "-version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "monolock v1.2.3, revision 0123abcd, "; !strings.HasPrefix(string(out), want) {
		t.Errorf("monolock -version printed %q, want it to begin with %q", out, want)
	}
}

// What the go command stamps (debug.BuildInfo) becomes -version's line:
// the module version, the VCS revision, " (modified)" after it when the
// checkout had uncommitted changes, and the Go version; the metric's (and
// /api/info's) revision never has the mark. Here without a build: on a
// machine whose GOFLAGS has -buildvcs=false, or in a copy of the tree
// without .git, the binary of TestMain has no revision to show.
func TestBuildInfoFromTheGoCommandsStamps(t *testing.T) {
	platform := " " + runtime.GOOS + "/" + runtime.GOARCH
	stamped := func(modified string) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.4.0"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0123abcd"},
			{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: modified}}}
	}
	for _, tc := range []struct {
		what, line, labels string
		info               *debug.BuildInfo
	}{
		{"a clean checkout", "monolock v1.4.0, revision 0123abcd, go1.26.8" + platform,
			`{version="v1.4.0",revision="0123abcd",goversion="go1.26.8"}`, stamped("false")},
		{"uncommitted changes", "monolock v1.4.0, revision 0123abcd (modified), go1.26.8" + platform,
			`{version="v1.4.0",revision="0123abcd",goversion="go1.26.8"}`, stamped("true")},
		{"no build information", "monolock (devel), revision unknown, " + runtime.Version() + platform,
			`{version="(devel)",revision="unknown",goversion="` + runtime.Version() + `"}`, nil},
	} {
		b := buildInfoFrom(tc.info, tc.info != nil)
		if got := b.String(); got != tc.line {
			t.Errorf("%s: -version prints %q, want %q", tc.what, got, tc.line)
		}
		if got := b.metricLabels(); got != tc.labels {
			t.Errorf("%s: monolock_build_info%s, want %s", tc.what, got, tc.labels)
		}
	}
}

package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// buildInfo is what the binary knows of its own build. The go command
// stamps it: the module version (a tag, or a pseudo-version with +dirty for
// uncommitted changes) and, when built inside a checkout, the commit.
type buildInfo struct {
	version   string // "(devel)" when the go command could not tell
	revision  string // "unknown" outside a checkout (go install ...@version)
	modified  bool   // built from a checkout with uncommitted changes
	goVersion string
}

// Where the go command cannot stamp a build (a container build without
// .git), the build may: go build -ldflags "-X main.stampVersion=v1.2.3
// -X main.stampRevision=$(git rev-parse HEAD)". Empty means not given.
var stampVersion, stampRevision string

func readBuildInfo() buildInfo {
	return buildInfoFrom(debug.ReadBuildInfo())
}

// buildInfoFrom takes the stamps as an argument: a test binary has none
// (go test stamps no VCS), so a test gives them.
func buildInfoFrom(info *debug.BuildInfo, ok bool) buildInfo {
	b := buildInfo{version: "(devel)", revision: "unknown", goVersion: runtime.Version()}
	if ok {
		if info.Main.Version != "" {
			b.version = info.Main.Version
		}
		if info.GoVersion != "" {
			b.goVersion = info.GoVersion
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.revision = s.Value
			case "vcs.modified":
				b.modified = s.Value == "true"
			}
		}
	}
	if stampVersion != "" {
		b.version = stampVersion
	}
	if stampRevision != "" {
		b.revision, b.modified = stampRevision, false
	}
	return b
}

// String is the line of monolock -version, in the shape of go version.
func (b buildInfo) String() string {
	revision := b.revision
	if b.modified {
		revision += " (modified)"
	}
	return fmt.Sprintf("monolock %s, revision %s, %s %s/%s", b.version, revision, b.goVersion, runtime.GOOS, runtime.GOARCH)
}

// metricLabels are the labels of monolock_build_info.
func (b buildInfo) metricLabels() string {
	return fmt.Sprintf(`{version="%s",revision="%s",goversion="%s"}`,
		escapeLabel(b.version), escapeLabel(b.revision), escapeLabel(b.goVersion))
}

const versionUsage = `Usage: monolock version    (or monolock -version)

Prints the module version, the VCS revision and the Go version the binary
was built with.
`

func versionMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
			fmt.Fprint(stdout, versionUsage)
			return 0
		}
		fmt.Fprintf(stderr, "monolock version: unexpected argument %q (see monolock version -h)\n", args[0])
		return 2
	}
	fmt.Fprintln(stdout, readBuildInfo())
	return 0
}

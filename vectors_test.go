package monolock

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// vector is one case of testdata/vectors/frames.txt.
type vector struct {
	name, dir string
	chunks    [][]byte
	frames    []string
	err, end  string
}

func (v vector) bytes() []byte { return bytes.Join(v.chunks, nil) }

func loadVectors(t testing.TB) []vector {
	t.Helper()
	f, err := os.Open("testdata/vectors/frames.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []vector
	var v *vector
	lines := bufio.NewScanner(f)
	lines.Buffer(nil, 1<<20)
	for n := 1; lines.Scan(); n++ {
		line := lines.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(line, ": ")
		if !ok {
			t.Fatalf("frames.txt:%d: %q", n, line)
		}
		if key == "case" {
			out = append(out, vector{name: value})
			v = &out[len(out)-1]
			continue
		}
		switch key {
		case "dir":
			v.dir = value
		case "hex":
			for _, chunk := range strings.Split(value, "|") {
				b, err := hex.DecodeString(strings.ReplaceAll(chunk, " ", ""))
				if err != nil {
					t.Fatalf("frames.txt:%d: %v", n, err)
				}
				v.chunks = append(v.chunks, b)
			}
		case "frame":
			v.frames = append(v.frames, value)
		case "error":
			v.err = value
		case "end":
			v.end = value
		default:
			t.Fatalf("frames.txt:%d: unknown key %q", n, key)
		}
	}
	return out
}

// chunked returns the chunks one per Read, as separate writes arrive.
type chunked struct{ chunks [][]byte }

func (c *chunked) Read(p []byte) (int, error) {
	for len(c.chunks) > 0 && len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	c.chunks[0] = c.chunks[0][n:]
	return n, nil
}

func describe(f Frame) string {
	orDash := func(s string) string {
		if s == "" {
			return "-"
		}
		return hex.EncodeToString([]byte(s))
	}
	switch f.Type {
	case TypeAcquire:
		return fmt.Sprintf("ACQUIRE %d %s", f.LeaseMS, orDash(f.Name))
	case TypeHeartbeat:
		return "HEARTBEAT"
	case TypeWaiting:
		return "WAITING"
	case TypeAcquired:
		return "ACQUIRED " + strconv.FormatUint(f.Token, 10)
	}
	return fmt.Sprintf("ERROR 0x%02x %s", uint8(f.Code), orDash(f.Reason))
}

// decodeVector reads v as its reader must: a server on a fresh connection
// for dir client, a client for dir server. It returns the frames, and the
// error code, "violation", or how the stream ended.
func decodeVector(v vector) (frames []string, outcome string) {
	r := bufio.NewReader(&chunked{chunks: slices.Clone(v.chunks)})
	acquired := false
	for {
		typ, err := r.Peek(1)
		if err != nil {
			return frames, "end: eof"
		}
		if v.dir == "client" {
			switch {
			case typ[0] != TypeAcquire && typ[0] != TypeHeartbeat:
				return frames, "error: 0x13"
			case typ[0] == TypeHeartbeat && !acquired:
				return frames, "error: 0x11"
			case typ[0] == TypeAcquire && acquired:
				return frames, "error: 0x12"
			}
		} else if typ[0] != TypeWaiting && typ[0] != TypeAcquired && typ[0] != TypeError {
			return frames, "error: violation"
		}
		f, err := ReadFrame(r)
		if code, ok := codeOf(err); ok {
			return frames, fmt.Sprintf("error: 0x%02x", uint8(code))
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return frames, "end: truncated"
		}
		if err != nil {
			return frames, "unexpected " + err.Error()
		}
		acquired = acquired || f.Type == TypeAcquire
		frames = append(frames, describe(f))
	}
}

// TestVectors runs every vector through the codec and, for those a server
// must refuse, through the real server.
func TestVectors(t *testing.T) {
	vectors := loadVectors(t)
	if len(vectors) < 50 {
		t.Fatalf("only %d vectors", len(vectors))
	}
	addr := startServer(t, &Server{IOTimeout: 2 * time.Second})
	for i, v := range vectors {
		t.Run(v.name, func(t *testing.T) {
			frames, outcome := decodeVector(v)
			want := "end: " + v.end
			if v.err != "" {
				want = "error: " + v.err
			}
			if strings.Join(frames, "\n") != strings.Join(v.frames, "\n") || outcome != want {
				t.Fatalf("decoded to %q then %q, the vector says %q then %q", frames, outcome, v.frames, want)
			}
			// Whole frames re-encode to their bytes.
			if v.err == "" && v.end == "eof" {
				r := bytes.NewReader(v.bytes())
				var again []byte
				for r.Len() > 0 {
					f, _ := ReadFrame(r)
					again, _ = f.AppendBinary(again)
				}
				if !bytes.Equal(again, v.bytes()) {
					t.Fatalf("re-encoded to %x", again)
				}
			}
			if v.dir != "client" || v.err == "" {
				return
			}
			// The server answers the same code, after the frames before it.
			// Every case gets lock names of its own.
			c := dialRaw(t, addr)
			stream := bytes.ReplaceAll(v.bytes(), []byte("job"), []byte(fmt.Sprintf("j%02d", i)))
			c.sendBytes(stream)
			for {
				f, err := c.read(wait)
				if err != nil {
					t.Fatalf("server closed without ERROR %s: %v", v.err, err)
				}
				if f.Type == TypeError {
					if got := fmt.Sprintf("0x%02x", uint8(f.Code)); got != v.err {
						t.Fatalf("server answered ERROR %s, the vector says %s", got, v.err)
					}
					return
				}
			}
		})
	}
}

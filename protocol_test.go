package monolock

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// The bytes of each frame, written out by hand from the protocol page.
var frameBytes = []struct {
	hex   string
	frame Frame
}{
	{"01 01 00002710 0003 616263", Frame{Type: TypeAcquire, LeaseMS: 10000, Name: "abc"}},
	{"01 01 ffffffff 0001 78", Frame{Type: TypeAcquire, LeaseMS: 0xffffffff, Name: "x"}},
	{"01 01 00000001 0004 6e2f0078", Frame{Type: TypeAcquire, LeaseMS: 1, Name: "n/\x00x"}},
	{"02", Frame{Type: TypeHeartbeat}},
	{"11", Frame{Type: TypeWaiting}},
	{"12 0102030405060708", Frame{Type: TypeAcquired, Token: 0x0102030405060708}},
	{"13 01 14 736572766572207368757474696e6720646f776e", Frame{Type: TypeError, Code: CodeShuttingDown, Reason: "server shutting down"}},
	{"13 1f 00", Frame{Type: TypeError, Code: 0x1f}},
}

func unhex(t testing.TB, s string) []byte {
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFrameBytes(t *testing.T) {
	for _, tc := range frameBytes {
		want := unhex(t, tc.hex)
		got, err := tc.frame.AppendBinary(nil)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("encode %+v = %x, %v; want %x", tc.frame, got, err, want)
		}
		// Whole, one byte at a time, and twice in one stream.
		for _, r := range []io.Reader{bytes.NewReader(want), iotest.OneByteReader(bytes.NewReader(want))} {
			f, err := ReadFrame(r)
			if err != nil || f != tc.frame {
				t.Errorf("decode %x = %+v, %v; want %+v", want, f, err, tc.frame)
			}
			if _, err := ReadFrame(r); err != io.EOF {
				t.Errorf("after %x: %v, want io.EOF", want, err)
			}
		}
		r := bytes.NewReader(append(append([]byte(nil), want...), want...))
		for range 2 {
			if f, err := ReadFrame(r); err != nil || f != tc.frame {
				t.Errorf("coalesced %x = %+v, %v", want, f, err)
			}
		}
		// Cut anywhere inside: unexpected EOF.
		for n := 1; n < len(want); n++ {
			if _, err := ReadFrame(bytes.NewReader(want[:n])); err != io.ErrUnexpectedEOF {
				t.Errorf("decode %x cut to %d bytes: %v, want io.ErrUnexpectedEOF", want, n, err)
			}
		}
	}
}

func TestReadFrameRefusals(t *testing.T) {
	for _, tc := range []struct {
		hex  string
		want error
	}{
		{"00", ErrUnknownType},
		{"03", ErrUnknownType},
		{"ff", ErrUnknownType},
		{"01 02", ErrUnsupportedVersion}, // nothing more is read
		{"01 00 00000000 0000", ErrUnsupportedVersion},
		{"01 01 00000000 0001 61", ErrInvalidLease},
		{"01 01 00000000 0000", ErrInvalidLease},
		{"01 01 00000001 0000", ErrEmptyName},
		{"01 01 00000001 0100", ErrNameTooLong}, // 256: the name is never read
		{"01 01 00000001 ffff", ErrNameTooLong},
		{"01 01 00000001 0001 ff", ErrInvalidUTF8},
		{"01 01 00000001 0002 c328", ErrInvalidUTF8},
	} {
		_, err := ReadFrame(bytes.NewReader(unhex(t, tc.hex)))
		if !errors.Is(err, tc.want) {
			t.Errorf("decode %s: %v, want %v", tc.hex, err, tc.want)
		}
	}
}

func TestReadFrameAllocatesNoMoreThanTheLimit(t *testing.T) {
	header := unhex(t, "01 01 00000001 ffff")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		ReadFrame(bytes.NewReader(header))
	}
	runtime.ReadMemStats(&after)
	// Reading the 65535-byte name would allocate 64 KiB; refusing it, a few bytes.
	if per := (after.TotalAlloc - before.TotalAlloc) / 100; per > 1024 {
		t.Fatalf("ReadFrame allocated %d bytes for a refused 65535-byte name", per)
	}
}

func TestCodes(t *testing.T) {
	codes := []Code{0x01, 0x02, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18}
	seen := map[error]bool{}
	for _, c := range codes {
		sentinel := c.Err()
		if sentinel == nil || seen[sentinel] {
			t.Fatalf("code 0x%02x has no sentinel of its own", uint8(c))
		}
		seen[sentinel] = true
		var err error = &ServerError{Code: c, Reason: c.String() + ": detail"}
		if !errors.Is(err, sentinel) {
			t.Errorf("0x%02x does not unwrap to %v", uint8(c), sentinel)
		}
		var se *ServerError
		if !errors.As(err, &se) || se.Code != c {
			t.Errorf("errors.As failed for 0x%02x", uint8(c))
		}
		if se.Temporary() != (c < 0x10) {
			t.Errorf("0x%02x Temporary() = %v", uint8(c), se.Temporary())
		}
		for _, other := range codes {
			if other != c && errors.Is(err, other.Err()) {
				t.Errorf("0x%02x also matches %v", uint8(c), other.Err())
			}
		}
	}
	known := 0
	for c := range 256 {
		if Code(c).Err() != nil {
			known++
		}
	}
	if len(seen) != known {
		t.Fatalf("%d codes tested, %d known", len(seen), known)
	}
	for _, c := range []Code{0x00, 0x05, 0x0f, 0x19, 0x1f, 0xff} { // unknown: classified by range
		var err error = &ServerError{Code: c}
		var se *ServerError
		if !errors.As(err, &se) || se.Code != c || se.Temporary() != (c < 0x10) {
			t.Errorf("unknown code 0x%02x: As %v, Temporary %v", uint8(c), se, se.Temporary())
		}
		if errors.Unwrap(err) != nil {
			t.Errorf("unknown code 0x%02x unwraps to %v", uint8(c), errors.Unwrap(err))
		}
		if !strings.Contains(err.Error(), "unknown error code") {
			t.Errorf("unknown code 0x%02x reads %q", uint8(c), err)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error
	}{
		{"", ErrEmptyName},
		{strings.Repeat("é", 128), ErrNameTooLong}, // 256 bytes, 128 characters
		{"\xff", ErrInvalidUTF8},
	} {
		err := ValidateName(tc.name)
		if !errors.Is(err, tc.want) || !errors.Is(err, ErrInvalidInput) {
			t.Errorf("ValidateName(%q) = %v, want %v and ErrInvalidInput", tc.name, err, tc.want)
		}
	}
	for _, name := range []string{"a", strings.Repeat("é", 127) + "x", "nightly/import", "\x00"} {
		if err := ValidateName(name); err != nil {
			t.Errorf("ValidateName(%q) = %v", name, err)
		}
	}
	for _, lease := range []time.Duration{0, -time.Second, time.Microsecond, MaxLease + time.Millisecond, 1500 * time.Microsecond} {
		if err := ValidateLease(lease); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("ValidateLease(%v) = %v", lease, err)
		}
	}
	if err := ValidateLease(0); !errors.Is(err, ErrInvalidLease) {
		t.Errorf("ValidateLease(0) = %v, want ErrInvalidLease", err)
	}
	for _, lease := range []time.Duration{time.Millisecond, MaxLease, 10 * time.Second} {
		if err := ValidateLease(lease); err != nil {
			t.Errorf("ValidateLease(%v) = %v", lease, err)
		}
	}
}

func TestAppendBinaryRefusesWhatCannotBeEncoded(t *testing.T) {
	for _, f := range []Frame{
		{Type: 0x7f},
		{Type: TypeAcquire, LeaseMS: 1, Name: strings.Repeat("a", 1<<16)},
		{Type: TypeError, Reason: strings.Repeat("a", 256)},
	} {
		if b, err := f.AppendBinary([]byte{9}); err == nil || !bytes.Equal(b, []byte{9}) {
			t.Errorf("AppendBinary(%.20v) = %x, %v", f, b, err)
		}
	}
}

// FuzzReadFrame: any bytes decode without a panic, and a decoded frame
// re-encodes to exactly the bytes it was read from.
func FuzzReadFrame(f *testing.F) {
	for _, tc := range frameBytes {
		f.Add(unhex(f, tc.hex))
	}
	f.Add(unhex(f, "01 01 00000001 ffff"))
	f.Add(unhex(f, "01 02"))
	f.Add([]byte{})
	for _, v := range loadVectors(f) {
		f.Add(v.bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		frame, err := ReadFrame(r)
		if err != nil {
			return
		}
		consumed := data[:len(data)-r.Len()]
		again, err := frame.AppendBinary(nil)
		if err != nil || !bytes.Equal(again, consumed) {
			t.Fatalf("%x decoded to %+v, which encodes to %x, %v", consumed, frame, again, err)
		}
	})
}

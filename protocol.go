package monolock

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
	"unicode/utf8"
)

// Wire constants, in the order of the protocol page.
const (
	Version = 1 // the protocol version this package speaks

	TypeAcquire   byte = 0x01 // c→s: version u8, lease_ms u32, name_len u16, name
	TypeHeartbeat byte = 0x02 // c→s
	TypeWaiting   byte = 0x11 // s→c
	TypeAcquired  byte = 0x12 // s→c: token u64
	TypeError     byte = 0x13 // s→c: code u8, reason_len u8, reason

	MaxNameLen   = 255 // bytes of UTF-8; a protocol limit, not a setting
	MaxReasonLen = 255

	MaxLease = math.MaxUint32 * time.Millisecond // what lease_ms carries: about 49.7 days
)

// A Code is an ERROR frame's code: the contract; the reason is for people.
type Code uint8

// Error codes. Below 0x10 the client did nothing wrong and may reconnect;
// from 0x10 up the same bytes fail again.
const (
	CodeShuttingDown       Code = 0x01
	CodeClosedByAdmin      Code = 0x02
	CodeUnsupportedVersion Code = 0x10
	CodeAcquireFirst       Code = 0x11
	CodeDuplicateAcquire   Code = 0x12
	CodeUnknownType        Code = 0x13
	CodeEmptyName          Code = 0x14
	CodeNameTooLong        Code = 0x15
	CodeInvalidUTF8        Code = 0x16
	CodeInvalidLease       Code = 0x17
	CodeNotAuthorized      Code = 0x18
)

// The sentinel of each code, whose text is its canonical reason. Both a
// *ServerError and local validation errors unwrap to one.
var (
	ErrShuttingDown       = sentinel(CodeShuttingDown, "server shutting down")
	ErrClosedByAdmin      = sentinel(CodeClosedByAdmin, "closed by administrator")
	ErrUnsupportedVersion = sentinel(CodeUnsupportedVersion, "unsupported protocol version")
	ErrAcquireFirst       = sentinel(CodeAcquireFirst, "first message must be ACQUIRE")
	ErrDuplicateAcquire   = sentinel(CodeDuplicateAcquire, "duplicate ACQUIRE")
	ErrUnknownType        = sentinel(CodeUnknownType, "unknown message type")
	ErrEmptyName          = sentinel(CodeEmptyName, "empty lock name")
	ErrNameTooLong        = sentinel(CodeNameTooLong, "lock name too long")
	ErrInvalidUTF8        = sentinel(CodeInvalidUTF8, "lock name is not valid UTF-8")
	ErrInvalidLease       = sentinel(CodeInvalidLease, "lease must be positive")
	ErrNotAuthorized      = sentinel(CodeNotAuthorized, "not authorized for lock")
)

// codeError is a code's sentinel; codeErrs finds it by code.
type codeError struct {
	code Code
	text string
}

func (e *codeError) Error() string { return e.text }

var codeErrs [256]error

func sentinel(c Code, text string) error {
	codeErrs[c] = &codeError{c, text}
	return codeErrs[c]
}

// ErrInvalidInput marks an argument refused before anything was sent,
// joined with the sentinel of the code the server would have sent.
var ErrInvalidInput = errors.New("monolock: invalid input")

// Err returns the code's sentinel, or nil for an unknown code.
func (c Code) Err() error { return codeErrs[c] }

// Temporary reports whether the code, known or not, is below 0x10.
func (c Code) Temporary() bool { return c < 0x10 }

// String returns the canonical reason of the code.
func (c Code) String() string {
	if err := c.Err(); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("unknown error code 0x%02x", uint8(c))
}

// codeOf returns the code whose sentinel err wraps.
func codeOf(err error) (Code, bool) {
	var ce *codeError
	if err != nil && errors.As(err, &ce) { // As reflects even on nil
		return ce.code, true
	}
	return 0, false
}

// ServerError is an ERROR frame received from the server.
type ServerError struct {
	Code   Code
	Reason string // the server's text; never branch on it
}

func (e *ServerError) Error() string {
	return fmt.Sprintf("monolock: server error 0x%02x: %s", uint8(e.Code), cmp.Or(e.Reason, e.Code.String()))
}

// Temporary reports whether the code is below 0x10.
func (e *ServerError) Temporary() bool { return e.Code.Temporary() }

// Unwrap returns the code's sentinel, or nil for an unknown code.
func (e *ServerError) Unwrap() error { return e.Code.Err() }

// Frame is one protocol message, either way; Type says which fields count.
type Frame struct {
	Type    byte
	LeaseMS uint32 // ACQUIRE
	Name    string // ACQUIRE
	Token   uint64 // ACQUIRED
	Code    Code   // ERROR
	Reason  string // ERROR
}

// AppendBinary appends f's wire bytes. It encodes even an ACQUIRE a server
// must refuse (empty name, lease 0, 300-byte name), for testing servers;
// it fails only on a field too long for its length or an unknown type.
func (f Frame) AppendBinary(b []byte) ([]byte, error) {
	switch f.Type {
	case TypeAcquire:
		if len(f.Name) > math.MaxUint16 {
			return b, fmt.Errorf("monolock: name of %d bytes does not fit name_len", len(f.Name))
		}
		b = append(b, TypeAcquire, Version)
		b = binary.BigEndian.AppendUint32(b, f.LeaseMS)
		b = binary.BigEndian.AppendUint16(b, uint16(len(f.Name)))
		return append(b, f.Name...), nil
	case TypeHeartbeat, TypeWaiting:
		return append(b, f.Type), nil
	case TypeAcquired:
		return binary.BigEndian.AppendUint64(append(b, TypeAcquired), f.Token), nil
	case TypeError:
		if len(f.Reason) > MaxReasonLen {
			return b, fmt.Errorf("monolock: reason of %d bytes does not fit reason_len", len(f.Reason))
		}
		b = append(b, TypeError, byte(f.Code), byte(len(f.Reason)))
		return append(b, f.Reason...), nil
	}
	return b, fmt.Errorf("monolock: cannot encode frame type 0x%02x", f.Type)
}

// ReadFrame reads one frame of either direction, however split: io.EOF
// only when r ends before a frame, io.ErrUnexpectedEOF inside one. It checks
// an ACQUIRE as a server does, in the specification's order (version, lease,
// name: empty, too long, UTF-8), the error wrapping the code's sentinel, and
// never allocates beyond the protocol limits, whatever a length field says.
func ReadFrame(r io.Reader) (Frame, error) {
	var typ [1]byte
	if _, err := io.ReadFull(r, typ[:]); err != nil {
		return Frame{}, err
	}
	switch typ[0] {
	case TypeAcquire:
		return readAcquire(r)
	case TypeHeartbeat, TypeWaiting:
		return Frame{Type: typ[0]}, nil
	case TypeAcquired:
		var b [8]byte
		err := readFull(r, b[:])
		return Frame{Type: TypeAcquired, Token: binary.BigEndian.Uint64(b[:])}, err
	case TypeError:
		var b [2]byte
		if err := readFull(r, b[:]); err != nil {
			return Frame{}, err
		}
		reason := make([]byte, b[1])
		err := readFull(r, reason)
		return Frame{Type: TypeError, Code: Code(b[0]), Reason: string(reason)}, err
	}
	return Frame{}, unknownType(typ[0])
}

func unknownType(typ byte) error { return fmt.Errorf("%w: 0x%02x", ErrUnknownType, typ) }

// readAcquire reads an ACQUIRE after its type byte.
func readAcquire(r io.Reader) (Frame, error) {
	var b [6]byte
	if err := readFull(r, b[:1]); err != nil {
		return Frame{}, err
	}
	if b[0] != Version {
		// Stop here: another version may lay out the rest differently, and
		// waiting for bytes that never come would only delay the answer.
		return Frame{}, fmt.Errorf("%w: %d", ErrUnsupportedVersion, b[0])
	}
	if err := readFull(r, b[:]); err != nil {
		return Frame{}, err
	}
	f := Frame{Type: TypeAcquire, LeaseMS: binary.BigEndian.Uint32(b[:4])}
	n := int(binary.BigEndian.Uint16(b[4:]))
	if n <= MaxNameLen {
		name := make([]byte, n)
		if err := readFull(r, name); err != nil {
			return Frame{}, err
		}
		f.Name = string(name)
	}
	if f.LeaseMS == 0 {
		return Frame{}, ErrInvalidLease
	}
	return f, checkName(n, f.Name)
}

// readFull is io.ReadFull inside a frame, where any EOF is unexpected.
func readFull(r io.Reader, b []byte) error {
	_, err := io.ReadFull(r, b)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// checkName checks an n-byte name from the wire, unread (empty) if too long.
func checkName(n int, name string) error {
	switch {
	case n == 0:
		return ErrEmptyName
	case n > MaxNameLen:
		return fmt.Errorf("%w: %d bytes, limit %d", ErrNameTooLong, n, MaxNameLen)
	case !utf8.ValidString(name):
		return ErrInvalidUTF8
	}
	return nil
}

// ValidateName returns nil for a name a server accepts: 1 to 255 bytes of
// UTF-8; else an error wrapping ErrInvalidInput and the code's sentinel.
func ValidateName(name string) error {
	if err := checkName(len(name), name); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	return nil
}

// ValidateLease returns nil for a whole number of milliseconds from 1ms to
// MaxLease, the leases lease_ms carries exactly.
func ValidateLease(lease time.Duration) error {
	if lease < time.Millisecond || lease > MaxLease || lease%time.Millisecond != 0 {
		return fmt.Errorf("%w: %w: %v is not a whole number of milliseconds from 1ms to %v", ErrInvalidInput, ErrInvalidLease, lease, MaxLease)
	}
	return nil
}

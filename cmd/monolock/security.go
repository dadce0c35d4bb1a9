package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"unicode"
	"unicode/utf8"
)

// security holds what SIGHUP reloads: the protocol port's TLS
// configuration and the authorization rules. A reload builds a complete
// new state from the files and swaps it in only if every file was good.
type security struct {
	certFile, keyFile, clientCAFile, aclFile string

	tls atomic.Pointer[tls.Config] // nil without -tls-cert
	acl atomic.Pointer[acl]        // nil without -acl-file
}

// checkCombination rejects the flag combinations that cannot work.
func (s *security) checkCombination() error {
	switch {
	case s.keyFile != "" && s.certFile == "":
		return errors.New("-tls-key needs -tls-cert")
	case s.certFile != "" && s.keyFile == "":
		return errors.New("-tls-cert needs -tls-key")
	case s.clientCAFile != "" && s.certFile == "":
		return errors.New("-tls-client-ca needs -tls-cert")
	case s.aclFile != "" && s.clientCAFile == "":
		return errors.New("-acl-file needs -tls-client-ca: without client certificates there are no identities")
	}
	return nil
}

// load reads every file and, if all are good, makes them current.
func (s *security) load() error {
	var cfg *tls.Config
	if s.certFile != "" {
		cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
		if err != nil {
			return fmt.Errorf("-tls-cert, -tls-key: %w", err)
		}
		cfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if s.clientCAFile != "" {
			pem, err := os.ReadFile(s.clientCAFile)
			if err != nil {
				return fmt.Errorf("-tls-client-ca: %w", err)
			}
			cfg.ClientCAs = x509.NewCertPool()
			if !cfg.ClientCAs.AppendCertsFromPEM(pem) {
				return fmt.Errorf("-tls-client-ca: no PEM certificate in %s", s.clientCAFile)
			}
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
			cfg.VerifyConnection = checkIdentity
		}
	}
	var rules *acl
	if s.aclFile != "" {
		f, err := os.Open(s.aclFile)
		if err != nil {
			return fmt.Errorf("-acl-file: %w", err)
		}
		rules, err = parseACL(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("-acl-file %s: %w", s.aclFile, err)
		}
	}
	s.tls.Store(cfg)
	s.acl.Store(rules)
	return nil
}

// listenerConfig is the TLS configuration of the listener: every new
// connection takes whatever configuration is current when it says hello.
func (s *security) listenerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.tls.Load(), nil
		},
	}
}

// checkIdentity refuses, in the handshake, a client certificate whose
// identity would come from a DNS SAN or Common Name that is neither a host
// name nor a plain name. Such a text ("spiffe://prod/importer" as a CN)
// would otherwise pass for the URI SAN that rules and audit readers take
// it for, and a CA that lets anyone choose a CN does not vouch for URIs.
// The order of monolock.Identity (URI SAN, DNS SAN, CN) is unchanged.
func checkIdentity(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return nil
	}
	cert := cs.PeerCertificates[0]
	switch {
	case len(cert.URIs) > 0:
		return nil
	case len(cert.DNSNames) > 0:
		if !isHostName(cert.DNSNames[0]) {
			return fmt.Errorf("client certificate's first DNS SAN %q is not an identity: a DNS SAN identity must be a host name (letters, digits, '-', '_', '.'); put a URI identity in a URI SAN", cert.DNSNames[0])
		}
	default:
		if !isPlainName(cert.Subject.CommonName) {
			return fmt.Errorf("client certificate's Common Name %q is not an identity: a CN identity must be a plain name (letters, digits, spaces and ASCII punctuation, but no : / ? # %% or backslash); put a URI identity in a URI SAN", cert.Subject.CommonName)
		}
	}
	return nil
}

// isHostName reports whether s has only the characters of a host name.
func isHostName(s string) bool {
	for _, r := range s {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("-_.", r)) {
			return false
		}
	}
	return s != ""
}

// isPlainName reports whether s is a name, not a URI or a path: letters,
// digits, combining marks, spaces and ASCII punctuation but for what a
// URI needs (: / ? # % and the backslash). "Doe, Jane" is one; a
// lookalike of ':' or '/', a format character (U+202E, U+200B) or a
// control character is not. An empty CN is no identity at all, as without
// mutual TLS.
func isPlainName(s string) bool {
	for _, r := range s {
		ok := unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r) || r == ' ' ||
			r < 0x7f && (unicode.IsPunct(r) || unicode.IsSymbol(r)) && !strings.ContainsRune(`:/?#%\`, r)
		if !ok {
			return false
		}
	}
	return true
}

// authorize is the server's Authorize hook: deny by default.
func (s *security) authorize(identity, lock string) bool {
	return s.acl.Load().allows(identity, lock)
}

// acl is the authorization file: {"rules":[{"identity": GLOB, "locks": [GLOB, ...]}]}.
type acl struct {
	Rules []rule `json:"rules"`
}

type rule struct {
	Identity string   `json:"identity"`
	Locks    []string `json:"locks"`
}

// allows reports whether any rule whose identity glob matches identity has
// a lock glob that matches lock.
func (a *acl) allows(identity, lock string) bool {
	for _, r := range a.Rules {
		if !glob(r.Identity, identity) {
			continue
		}
		for _, pattern := range r.Locks {
			if glob(pattern, lock) {
				return true
			}
		}
	}
	return false
}

// parseACL reads a rules file. Its keys are matched exactly, as they are
// documented: encoding/json alone would take "RULES" or "Locks" for them,
// and keep the last of two "locks" without a word.
func parseACL(r io.Reader) (*acl, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var top json.RawMessage
	if err := dec.Decode(&top); err != nil {
		return nil, fmt.Errorf("not a valid rules file: %w", err)
	}
	// Token, not More: More takes a stray ']' or '}' for the end.
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("not a valid rules file: more than one JSON value")
	} else if err != io.EOF {
		return nil, fmt.Errorf("not a valid rules file: after the JSON object: %w", err)
	}
	fields, err := exactObject(top, "rules")
	if err != nil {
		return nil, fmt.Errorf("not a valid rules file: %w", err)
	}
	var list []json.RawMessage
	if raw, ok := fields["rules"]; !ok {
		return nil, errors.New(`no "rules" list`)
	} else if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf(`not a valid rules file: "rules" is not a list: %w`, err)
	}
	if list == nil {
		return nil, errors.New(`no "rules" list`)
	}
	a := &acl{Rules: []rule{}}
	for i, raw := range list {
		f, err := exactObject(raw, "identity", "locks")
		if err != nil {
			return nil, fmt.Errorf("rule %d: %w", i+1, err)
		}
		var r rule
		if v, ok := f["identity"]; ok {
			if err := json.Unmarshal(v, &r.Identity); err != nil {
				return nil, fmt.Errorf(`rule %d: "identity" is not a string: %w`, i+1, err)
			}
		}
		if v, ok := f["locks"]; ok {
			if err := json.Unmarshal(v, &r.Locks); err != nil {
				return nil, fmt.Errorf(`rule %d (identity %q): "locks" is not a list of strings: %w`, i+1, r.Identity, err)
			}
		}
		switch {
		case r.Identity == "":
			return nil, fmt.Errorf("rule %d: empty identity", i+1)
		case len(r.Locks) == 0:
			return nil, fmt.Errorf("rule %d (identity %q): no lock patterns", i+1, r.Identity)
		}
		for j, p := range r.Locks {
			if p == "" {
				return nil, fmt.Errorf("rule %d (identity %q): lock pattern %d is empty", i+1, r.Identity, j+1)
			}
		}
		a.Rules = append(a.Rules, r)
	}
	return a, nil
}

// exactObject splits a JSON object into its fields, refusing a key that is
// not exactly one of keys, and a key that comes twice.
func exactObject(raw json.RawMessage, keys ...string) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	fields := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key := tok.(string) // inside an object, the decoder yields keys as strings
		switch {
		case !slices.Contains(keys, key):
			return nil, fmt.Errorf("unknown field %q (the fields are %s, in lower case)", key, strings.Join(keys, ", "))
		case fields[key] != nil:
			return nil, fmt.Errorf("field %q appears twice", key)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		fields[key] = v
	}
	return fields, nil
}

// glob reports whether the whole of s matches pattern, where * is any
// run of characters (slashes included), ? is exactly one character (one
// UTF-8 code point; a byte that is not UTF-8 counts as one), and every
// other character stands for itself, case sensitive.
//
// It walks both strings once, remembering the last * to retry from: the
// classic linear-space matcher, O(len(pattern) * len(s)) at worst.
func glob(pattern, s string) bool {
	p, i := 0, 0
	starP, starI := -1, 0
	for i < len(s) {
		if p < len(pattern) {
			pc, pw := utf8.DecodeRuneInString(pattern[p:])
			_, sw := utf8.DecodeRuneInString(s[i:])
			switch {
			case pc == '*':
				starP, starI = p, i
				p += pw
				continue
			case pc == '?' || pattern[p:p+pw] == s[i:i+sw]:
				p += pw
				i += sw
				continue
			}
		}
		if starP < 0 {
			return false
		}
		// Let the last * swallow one more character and try again.
		_, sw := utf8.DecodeRuneInString(s[starI:])
		starI += sw
		p, i = starP+1, starI
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

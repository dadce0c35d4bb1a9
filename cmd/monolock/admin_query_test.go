package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// A release whose query the admin API does not fully understand must never
// fall back to "whoever holds it now": with a stale token spelt a little
// wrong, that is the holder promoted since the operator looked.
func TestAdminRefusesAQueryItDoesNotUnderstand(t *testing.T) {
	s := start(t, nil, "-admin-listen", "127.0.0.1:0")
	a, first := rawAcquire(t, s.addr, "q", time.Minute)
	b, _ := rawAcquire(t, s.addr, "q", time.Minute)
	a.Close()
	second := b.expect(monolock.TypeAcquired, 0)
	stale := first.Token

	for _, query := range []string{
		fmt.Sprintf("?token=%d;", stale),
		fmt.Sprintf("?token=%d;x=1", stale),
		fmt.Sprintf("?Token=%d", stale),
		fmt.Sprintf("?tokem=%d", stale),
		fmt.Sprintf("?token%%3D%d", stale),
		fmt.Sprintf("?token=%d&dry_run=1", stale),
		"?&",
		"?%zz",
	} {
		code, body := httpDo(t, "POST", "http://"+s.admin+"/api/locks/q/release"+query)
		resp := decodeJSON(t, body)
		msg, _ := resp["error"].(string)
		if code != 400 || msg == "" {
			t.Errorf("release%s: %d %s, want 400 with the reason", query, code, body)
		}
		b.Write([]byte{monolock.TypeHeartbeat})
		if f := b.next(); f.Type != monolock.TypeAcquired || f.Token != second.Token {
			t.Fatalf("after release%s the holder got %+v, want ACQUIRED with token %d: it was ended", query, f, second.Token)
		}
	}

	// A token in the body (curl -d token=T) is not read: refused, not ignored.
	req, _ := http.NewRequest("POST", "http://"+s.admin+"/api/locks/q/release", strings.NewReader(fmt.Sprintf("token=%d", stale)))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), "?token=") {
		t.Errorf("release with the token in the body: %d %s, want 400 saying the token goes in the URL", resp.StatusCode, body)
	}
	b.Write([]byte{monolock.TypeHeartbeat})
	if f := b.next(); f.Type != monolock.TypeAcquired || f.Token != second.Token {
		t.Fatalf("after a release with a body the holder got %+v: it was ended", f)
	}

	// The other endpoints refuse what they do not take, too, and say what they take.
	for _, tc := range []struct{ path, want string }{
		{"/api/locks?mtach=q", "?match="},
		{"/api/locks?match=q&match=r", "?match="},
		{"/api/locks?match=q;", "semicolon"},
		{"/api/locks/q?verbose=1", "no query"},
		{"/api/info?x", "no query"},
	} {
		code, body := httpGet(t, "http://"+s.admin+tc.path)
		if code != 400 || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s: %d %s, want 400 naming %s", tc.path, code, body, tc.want)
		}
	}
	if code, body := httpGet(t, "http://"+s.admin+"/api/locks?match=q"); code != 200 || !strings.Contains(body, fmt.Sprint(second.Token)) {
		t.Fatalf("GET /api/locks?match=q: %d %s", code, body)
	}
}

// A 409 says what it compared: the holder may well be there, and the
// caller's token rounded by a tool that reads numbers as doubles (jq 1.6
// rounds tokens, which are above 2^53); the token is also given as a
// string, which such tools keep exact.
func TestAdminStaleTokenSaysWhatWasCompared(t *testing.T) {
	s := start(t, nil, "-admin-listen", "127.0.0.1:0")
	c, granted := rawAcquire(t, s.addr, "r", time.Minute)
	rounded := uint64(float64(granted.Token))
	if rounded == granted.Token {
		rounded += 256 // one token in 256 is a double already; the next one is what rounding gives its neighbours
	}
	code, body := httpDo(t, "POST", fmt.Sprintf("http://%s/api/locks/r/release?token=%d", s.admin, rounded))
	resp := decodeJSON(t, body)
	msg, _ := resp["error"].(string)
	holder, _ := resp["holder"].(map[string]any)
	switch {
	case code != 409:
		t.Fatalf("a rounded token: %d %s, want 409", code, body)
	case strings.Contains(msg, "the holder with this token is gone"):
		t.Errorf("the 409 says the holder is gone, while it holds: %q", msg)
	case !strings.Contains(msg, fmt.Sprint(rounded)) || !strings.Contains(msg, "rounded") || !strings.Contains(msg, "token_string"):
		t.Errorf("the 409 does not say what it compared, nor that the token may have been rounded: %q", msg)
	case resp["token_string"] != fmt.Sprint(rounded):
		t.Errorf("the 409's token_string is %v, want the token given, %d", resp["token_string"], rounded)
	case holder == nil || holder["token_string"] != fmt.Sprint(granted.Token):
		t.Errorf("the 409 does not name the current holder's token %d as a string: %s", granted.Token, body)
	}
	c.Write([]byte{monolock.TypeHeartbeat})
	if f := c.next(); f.Type != monolock.TypeAcquired || f.Token != granted.Token {
		t.Fatalf("the holder got %+v after a refused release", f)
	}
	code, body = httpGet(t, "http://"+s.admin+"/api/locks/r")
	if l := decodeJSON(t, body); code != 200 || l["holder"].(map[string]any)["token_string"] != fmt.Sprint(granted.Token) {
		t.Fatalf("GET /api/locks/r: %d %s, want holder.token_string %d", code, body, granted.Token)
	}
}

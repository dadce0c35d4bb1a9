package main

import (
	"fmt"
	"net"
	"net/http"
	"path"
	"strings"
)

// adminGuard refuses what a web page in a browser on the admin host could
// make the browser send: a request whose Host is not this API's address
// (DNS rebinding: evil.example made to resolve to 127.0.0.1 reads the
// locks), and a cross-origin state change (a form or fetch from any page
// releasing a lock). Clients that are not browsers (curl, monolock locks)
// send no Origin and pass.
func adminGuard(listen string, bound net.Addr, h http.Handler) http.Handler {
	_, port, _ := net.SplitHostPort(bound.String())
	configured, _, _ := net.SplitHostPort(listen)
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusForbidden, map[string]string{
			"error": "cross-origin request refused: the admin API takes state changes only from its own origin or from clients that are not browsers"})
	}))
	inner := cop.Handler(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// ServeMux would answer an unclean path (an empty or dot segment:
		// an unencoded name "x/" or "./x") with a redirect, method and
		// query kept, to another lock: a client that follows it would
		// release or kick there.
		if p := r.URL.Path; p != path.Clean(p) {
			writeJSON(w, http.StatusBadRequest, map[string]string{
				"error": fmt.Sprintf("path %q has an empty, . or .. segment: percent-encode a lock name that holds /, . or .. (url.PathEscape)", p)})
			return
		}
		if !adminHostAllowed(r.Host, configured, port) {
			writeJSON(w, http.StatusForbidden, map[string]string{
				"error": fmt.Sprintf("Host %q is not this admin API's address: use an IP address or localhost (any port), or the host of -admin-listen with port %s", r.Host, port)})
			return
		}
		inner.ServeHTTP(w, r)
	})
}

// adminHostAllowed reports whether a request's Host names the admin API:
// an IP address or localhost, with any port, since no DNS answer can
// rebind those and a port-forward (ssh -L, kubectl port-forward) to
// another local port sends its own; or the host the operator gave
// -admin-listen, with the API's port.
func adminHostAllowed(hostport, configured, port string) bool {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil { // no port: the scheme's default
		host, p = hostport, "80"
	}
	switch {
	case host == "":
		return false
	case net.ParseIP(host) != nil || strings.EqualFold(host, "localhost"):
		return true
	}
	return p == port && configured != "" && strings.EqualFold(host, configured)
}

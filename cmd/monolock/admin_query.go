package main

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// adminQueryKeys are the query keys each admin endpoint takes, each at most
// once; an endpoint not listed takes none.
var adminQueryKeys = map[string][]string{
	"/api/locks":                {"match"},
	"/api/locks/{name}/release": {"token"},
}

// strictQuery parses a query the admin API must understand in full. Go's
// own parser drops a pair it cannot read (a ';', a bad escape) and a caller
// ignores keys it does not know: a release whose ?token= was misspelt
// would then end whoever holds the lock now, the very holder the token was
// meant to protect. Here anything not understood is an error that says why.
func strictQuery(raw string, keys []string) (url.Values, error) {
	values := url.Values{}
	if raw == "" {
		return values, nil
	}
	takes := "this endpoint takes no query"
	if len(keys) > 0 {
		takes = "this endpoint takes only ?" + strings.Join(keys, "=, ?") + "=, each at most once"
	}
	for _, pair := range strings.Split(raw, "&") {
		switch {
		case pair == "":
			return nil, fmt.Errorf("empty parameter in query %q (%s)", raw, takes)
		case strings.Contains(pair, ";"):
			return nil, fmt.Errorf("semicolon in query %q: separate parameters with & (%s)", raw, takes)
		}
		k, v, _ := strings.Cut(pair, "=")
		key, err := url.QueryUnescape(k)
		if err != nil {
			return nil, fmt.Errorf("query %q: %v", raw, err)
		}
		value, err := url.QueryUnescape(v)
		if err != nil {
			return nil, fmt.Errorf("query %q: %v", raw, err)
		}
		switch {
		case !slices.Contains(keys, key):
			return nil, fmt.Errorf("unknown query parameter %q: %s", key, takes)
		case values.Has(key):
			return nil, fmt.Errorf("query parameter %q given twice: %s", key, takes)
		}
		values.Set(key, value)
	}
	return values, nil
}

package idempotency

import (
	"bytes"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgconn"
)

// Tests that need no server: the answers to database errors, retries, fingerprints, headers.

func TestFailMapsSQLStates(t *testing.T) {
	cases := []struct {
		err        error
		status     int
		retryAfter bool
	}{
		{&pgconn.PgError{Code: "22001"}, 400, false},
		{&pgconn.PgError{Code: "22023"}, 400, false},
		{&pgconn.PgError{Code: "22P02"}, 400, false},
		{&pgconn.PgError{Code: "54000"}, 413, false},
		{&pgconn.PgError{Code: "40001"}, 503, true},
		{&pgconn.PgError{Code: "40P01"}, 503, true},
		{&pgconn.PgError{Code: "08006"}, 503, true},
		{&pgconn.PgError{Code: "57P01"}, 503, true},
		{fmt.Errorf("read: %w", errors.New("unexpected EOF: conn closed")), 503, true},
		{&pgconn.PgError{Code: "42501"}, 500, false},
		{&pgconn.PgError{Code: "XX000", Message: "something else"}, 500, false},
		{&pgconn.PgError{Code: "XX000", Message: "cannot execute a distributed query from a query on a shard"}, 503, true},
	}
	var logged bytes.Buffer
	o := &Options{PolicyURL: "https://api.example/idempotency"}
	o.Logger = newTestLogger(&logged)
	for _, c := range cases {
		w := httptest.NewRecorder()
		o.fail(w, c.err)
		if w.Code != c.status {
			t.Errorf("%v: status %d, want %d", c.err, w.Code, c.status)
		}
		if got := w.Header().Get("Retry-After") != ""; got != c.retryAfter {
			t.Errorf("%v: Retry-After %q", c.err, w.Header().Get("Retry-After"))
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" ||
			!strings.Contains(w.Body.String(), `"type":"https://api.example/idempotency"`) {
			t.Errorf("%v: not a problem naming the policy: %s %s", c.err, ct, w.Body)
		}
	}
	if !strings.Contains(logged.String(), "42501") {
		t.Errorf("42501 (a set-up error) was not logged: %q", logged.String())
	}
}

func TestRetryIsBounded(t *testing.T) {
	calls := 0
	err := retry(func() error { calls++; return &pgconn.PgError{Code: "40001"} })
	if calls != 1+Retries || SQLState(err) != "40001" {
		t.Errorf("40001 every time: %d calls, %v", calls, err)
	}
	calls = 0
	err = retry(func() error {
		calls++
		if calls < 3 {
			return &pgconn.PgError{Code: "40P01"}
		}
		return nil
	})
	if calls != 3 || err != nil {
		t.Errorf("two deadlocks then success: %d calls, %v", calls, err)
	}
	calls = 0
	_ = retry(func() error { calls++; return &pgconn.PgError{Code: "23505"} })
	if calls != 1 {
		t.Errorf("23505 retried: %d calls", calls)
	}
}

func TestFingerprintInputs(t *testing.T) {
	o := &Options{}
	req := func(ct, body string) *http.Request {
		r := httptest.NewRequest("POST", "/payments?x=1", strings.NewReader(body))
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		return r
	}
	fp, _ := o.requestFingerprint(req("application/json; charset=utf-8", `{"b":1, "a":2}`), []byte(`{"b":1, "a":2}`))
	if fp.json == nil || fp.bytes != nil || *fp.json != `{"method":"POST","path":"/payments?x=1","body":{"b":1,"a":2}}` {
		t.Errorf("JSON body: %+v", fp)
	}
	fp, _ = o.requestFingerprint(req("application/problem+json", `[1]`), []byte(`[1]`))
	if fp.json == nil {
		t.Errorf("+json body not fingerprinted as JSON")
	}
	// Not JSON (bad JSON, or another type): the bytes.
	a, _ := o.requestFingerprint(req("application/json", `{"a":`), []byte(`{"a":`))
	b, _ := o.requestFingerprint(req("text/plain", `{"a":1}`), []byte(`{"a":1}`))
	c, _ := o.requestFingerprint(req("text/plain", `{"a":2}`), []byte(`{"a":2}`))
	if a.json != nil || b.json != nil || len(a.bytes) != 32 || bytes.Equal(b.bytes, c.bytes) {
		t.Errorf("byte fingerprints: %+v %+v %+v", a, b, c)
	}
	r2 := req("text/plain", `{"a":1}`)
	r2.Method = "PATCH"
	d, _ := o.requestFingerprint(r2, []byte(`{"a":1}`))
	if bytes.Equal(b.bytes, d.bytes) {
		t.Errorf("the method is not in the fingerprint")
	}
	o.Fingerprint = func(*http.Request, []byte) ([]byte, error) { return []byte("mine"), nil }
	e, _ := o.requestFingerprint(req("application/json", `{}`), []byte(`{}`))
	if e.json != nil || string(e.bytes) != "mine" {
		t.Errorf("override: %+v", e)
	}
}

func TestStoredHeaders(t *testing.T) {
	h := http.Header{}
	h.Set("Content-Type", "text/plain")
	h.Add("Set-Cookie", "a=1")
	h.Add("Set-Cookie", "b=2")
	for _, name := range []string{"Connection", "Keep-Alive", "Transfer-Encoding", "Date", "Content-Length", "Trailer", "Upgrade", "Te"} {
		h.Set(name, "x")
	}
	got := storedHeaders(h)
	if len(got) != 2 || got["Content-Type"] != "text/plain" {
		t.Fatalf("stored %v", got)
	}
	if v, ok := got["Set-Cookie"].([]string); !ok || len(v) != 2 || v[0] != "a=1" || v[1] != "b=2" {
		t.Errorf("Set-Cookie stored as %#v", got["Set-Cookie"])
	}
}

func TestReplayedDecodesStoredAnswer(t *testing.T) {
	code := int32(201)
	headers := `{"Location": "/p/1", "Set-Cookie": ["a=1", "b=2"]}`
	out, err := replayed(claimResult{status: "replay", code: &code, body: []byte{0, 1, 0xff}, headers: &headers})
	if err != nil || out.status != 201 || !bytes.Equal(out.body, []byte{0, 1, 0xff}) ||
		out.header.Get("Location") != "/p/1" || len(out.header.Values("Set-Cookie")) != 2 ||
		out.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %+v %v", out, err)
	}
	response := `{"ok": true}`
	out, _ = replayed(claimResult{status: "replay", response: &response})
	if out.status != 200 || string(out.body) != response || out.header.Get("Content-Type") != "application/json" {
		t.Errorf("jsonb-only replay: %+v", out)
	}
}

func TestMissingKeyAndPassThrough(t *testing.T) {
	o := Options{Pool: nil, PolicyURL: "/policy"}
	h := middlewareNoPool(o, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
	for _, c := range []struct {
		method, key string
		status      int
	}{
		{"GET", "", 204}, {"DELETE", "", 204}, {"POST", "", 400}, {"PATCH", "", 400},
		{"POST", `"` + strings.Repeat("k", 256) + `"`, 400}, {"POST", `a b`, 400}, {"POST", `""`, 400},
	} {
		r := httptest.NewRequest(c.method, "/x", nil)
		if c.key != "" {
			r.Header.Set("Idempotency-Key", c.key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.status {
			t.Errorf("%s key %q: %d, want %d", c.method, c.key, w.Code, c.status)
		}
		if c.status == 400 && (w.Header().Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(w.Body.String(), `"type":"/policy"`) || !strings.Contains(w.Body.String(), `"status":400`)) {
			t.Errorf("%s key %q: %s %s", c.method, c.key, w.Header(), w.Body)
		}
	}
}

func middlewareNoPool(o Options, h http.Handler) http.Handler { return middleware(o)(h) }

func newTestLogger(w *bytes.Buffer) *log.Logger { return log.New(w, "", 0) }

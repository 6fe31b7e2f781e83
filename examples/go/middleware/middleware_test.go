// Real HTTP requests to the receipts service and to test handlers behind the same middleware,
// served on 127.0.0.1:$HTTP_PORT (default 8089), against the database of the PG* environment.
// A replay must be the first response byte for byte: status, body and every stored header.
package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v4/pgxpool"

	idempotency "idempotency/clients/go"
)

var (
	base string // http://127.0.0.1:PORT
	pool *pgxpool.Pool
	run  = strconv.FormatInt(time.Now().UnixNano(), 36) // keys unique to this run

	slowEntered = make(chan struct{}, 1) // the slow handler is running
	slowRelease = make(chan struct{})    // and may answer
	flakyCalls  int32                    // calls of the flaky handler
	sniffCalls  int32
)

func TestMain(m *testing.M) {
	ctx := context.Background()
	var err error
	if pool, err = pgxpool.Connect(ctx, ""); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	if err := createSchema(ctx, pool); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	port := os.Getenv("HTTP_PORT")
	if port == "" {
		port = "8089"
	}
	listener, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	base = "http://" + listener.Addr().String()
	mux := http.NewServeMux()
	mux.Handle("/", service(pool))
	test := idempotency.Middleware(idempotency.Options{Pool: pool, Scope: func(*http.Request) string { return "tests" }})
	// Holds its transaction open until released: duplicates arrive while it runs.
	mux.Handle("/test/slow", test(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slowEntered <- struct{}{}
		<-slowRelease
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusAccepted)
		w.Write([]byte{0, 1, 2, 0xff})
	})))
	// Fails with 503 on its first call, then answers 200.
	mux.Handle("/test/flaky", test(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if atomic.AddInt32(&flakyCalls, 1) == 1 {
			http.Error(w, "gateway down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "done")
	})))
	// Sets no status and no Content-Type: net/http's defaults are what is stored.
	mux.Handle("/test/sniff", test(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		atomic.AddInt32(&sniffCalls, 1)
		w.Write([]byte("<html><body>ok</body></html>"))
	})))
	server := &http.Server{Handler: mux}
	go server.Serve(listener)
	code := m.Run()
	server.Close()
	pool.Close()
	os.Exit(code)
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// send: one request. A failure to send is an error of the test (status 0), not a stop: it may
// run in a goroutine of its own.
func send(t *testing.T, method, path, key, contentType string, body []byte) response {
	t.Helper()
	req, err := http.NewRequest(method, base+path, bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return response{}
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return response{}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Error(err)
	}
	return response{res.StatusCode, res.Header, b}
}

func postReceipt(t *testing.T, key string, amount int) response {
	form := url.Values{"amount": {strconv.Itoa(amount)}}.Encode()
	return send(t, http.MethodPost, "/receipts", key, "application/x-www-form-urlencoded", []byte(form))
}

// assertReplay: replay is first as first was sent, marked Idempotent-Replayed.
func assertReplay(t *testing.T, replay, first response, headers ...string) {
	t.Helper()
	if replay.status != first.status {
		t.Errorf("replay status %d, first %d", replay.status, first.status)
	}
	if !bytes.Equal(replay.body, first.body) {
		t.Errorf("replay body %q, first %q", replay.body, first.body)
	}
	if got := replay.header.Get("Idempotent-Replayed"); got != "true" {
		t.Errorf("Idempotent-Replayed: %q", got)
	}
	for _, h := range append(headers, "Content-Type", "Content-Length") {
		if got, want := strings.Join(replay.header.Values(h), " | "), strings.Join(first.header.Values(h), " | "); got != want {
			t.Errorf("header %s: replay %q, first %q", h, got, want)
		}
	}
}

func receiptCount(t *testing.T) int {
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM receipts`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestReplayIsTheFirstResponseByteForByte(t *testing.T) {
	before := receiptCount(t)
	first := postReceipt(t, "r-1-"+run, 100)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	if first.header.Get("Idempotent-Replayed") != "" {
		t.Error("the first response is not a replay")
	}
	location := first.header.Get("Location")
	if !strings.HasPrefix(location, "/receipts/") {
		t.Errorf("Location: %q", location)
	}
	if want := "Re\xe7u n\xb0 " + strings.TrimPrefix(location, "/receipts/") + "\r\nMontant: 100 EUR\r\n"; string(first.body) != want {
		t.Errorf("body %q, want %q (ISO-8859-1 bytes)", first.body, want)
	}
	if got := first.header.Values("Link"); len(got) != 2 {
		t.Errorf("two Link values: %q", got)
	}
	again := postReceipt(t, "r-1-"+run, 100)
	assertReplay(t, again, first, "Location", "Link")
	if n := receiptCount(t); n != before+1 {
		t.Errorf("%d receipts made, want 1", n-before)
	}
	// The receipt exists once, and GET passes through the middleware.
	got := send(t, http.MethodGet, location, "", "", nil)
	if got.status != http.StatusOK || got.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("GET %s: %d, replayed %q", location, got.status, got.header.Get("Idempotent-Replayed"))
	}
}

func TestTheSameKeyForAnotherRequestIs422(t *testing.T) {
	key := "r-2-" + run
	if first := postReceipt(t, key, 5); first.status != http.StatusCreated {
		t.Fatalf("first: %d", first.status)
	}
	before := receiptCount(t)
	if other := postReceipt(t, key, 6); other.status != http.StatusUnprocessableEntity {
		t.Errorf("another body: %d, want 422", other.status)
	}
	form := []byte(url.Values{"amount": {"5"}}.Encode())
	if other := send(t, http.MethodPost, "/receipts?draft=1", key, "application/x-www-form-urlencoded", form); other.status != http.StatusUnprocessableEntity {
		t.Errorf("another query: %d, want 422", other.status)
	}
	if n := receiptCount(t); n != before {
		t.Errorf("%d receipts made by the mismatches", n-before)
	}
}

func TestADuplicateInFlightIs409ThenTheReplay(t *testing.T) {
	key := "slow-" + run
	done := make(chan response)
	go func() { done <- send(t, http.MethodPost, "/test/slow", key, "", []byte("x")) }()
	select {
	case <-slowEntered: // the first request is inside its transaction now
	case first := <-done:
		t.Fatalf("the first request ended before its handler ran: %d %q", first.status, first.body)
	}
	dup := send(t, http.MethodPost, "/test/slow", key, "", []byte("x"))
	if dup.status != http.StatusConflict {
		t.Errorf("duplicate in flight: %d, want 409", dup.status)
	}
	if after, err := strconv.Atoi(dup.header.Get("Retry-After")); err != nil || after < 1 {
		t.Errorf("Retry-After: %q", dup.header.Get("Retry-After"))
	}
	close(slowRelease)
	first := <-done
	if first.status != http.StatusAccepted || !bytes.Equal(first.body, []byte{0, 1, 2, 0xff}) {
		t.Fatalf("first: %d %q", first.status, first.body)
	}
	assertReplay(t, send(t, http.MethodPost, "/test/slow", key, "", []byte("x")), first)
}

func TestAServerErrorIsNotStored(t *testing.T) {
	key := "flaky-" + run
	if first := send(t, http.MethodPost, "/test/flaky", key, "", nil); first.status != http.StatusServiceUnavailable {
		t.Fatalf("first: %d, want 503", first.status)
	}
	second := send(t, http.MethodPost, "/test/flaky", key, "", nil)
	if second.status != http.StatusOK || string(second.body) != "done" || second.header.Get("Idempotent-Replayed") != "" {
		t.Errorf("retry after a 503: %d %q replayed=%q, want the handler to run again", second.status, second.body,
			second.header.Get("Idempotent-Replayed"))
	}
	assertReplay(t, send(t, http.MethodPost, "/test/flaky", key, "", nil), second)
	if calls := atomic.LoadInt32(&flakyCalls); calls != 2 {
		t.Errorf("the handler ran %d times, want 2", calls)
	}
}

func TestDefaultsOfNetHTTPAreStored(t *testing.T) {
	key := "sniff-" + run
	first := send(t, http.MethodPost, "/test/sniff", key, "", nil)
	if first.status != http.StatusOK || !strings.HasPrefix(first.header.Get("Content-Type"), "text/html") {
		t.Fatalf("first: %d %q", first.status, first.header.Get("Content-Type"))
	}
	assertReplay(t, send(t, http.MethodPost, "/test/sniff", key, "", nil), first)
	// Stored with it (a replay served by another program gets it too).
	var code int32
	var stored string
	if err := pool.QueryRow(context.Background(),
		`SELECT response_code, response_headers->>'Content-Type' FROM idempotency.claim_key($1, NULL, 'tests')`,
		key).Scan(&code, &stored); err != nil || code != 200 || stored != first.header.Get("Content-Type") {
		t.Errorf("stored: %d %q (%v), want 200 %q", code, stored, err, first.header.Get("Content-Type"))
	}
	if calls := atomic.LoadInt32(&sniffCalls); calls != 1 {
		t.Errorf("the handler ran %d times, want 1", calls)
	}
}

func TestConcurrentDuplicatesMakeOneReceipt(t *testing.T) {
	key := "race-" + run
	before := receiptCount(t)
	results := make([]response, 8)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func(i int) { defer wg.Done(); results[i] = postReceipt(t, key, 42) }(i)
	}
	wg.Wait()
	var executed []response
	for _, r := range results {
		switch {
		case r.status == http.StatusCreated && r.header.Get("Idempotent-Replayed") == "":
			executed = append(executed, r)
		case r.status == http.StatusCreated || r.status == http.StatusConflict:
		default:
			t.Errorf("unexpected answer %d %q", r.status, r.body)
		}
	}
	if len(executed) != 1 {
		t.Fatalf("%d requests executed the handler, want 1", len(executed))
	}
	for _, r := range results {
		if r.status == http.StatusCreated && r.header.Get("Idempotent-Replayed") == "true" {
			assertReplay(t, r, executed[0], "Location", "Link")
		}
	}
	assertReplay(t, postReceipt(t, key, 42), executed[0], "Location", "Link")
	if n := receiptCount(t); n != before+1 {
		t.Errorf("%d receipts made, want 1", n-before)
	}
}

func TestWithoutAKeyAPOSTIs400(t *testing.T) {
	before := receiptCount(t)
	if r := postReceipt(t, "", 1); r.status != http.StatusBadRequest {
		t.Errorf("no key: %d, want 400", r.status)
	}
	if r := postReceipt(t, strings.Repeat("k", 256), 1); r.status != http.StatusBadRequest {
		t.Errorf("a key of 256 bytes: %d, want 400", r.status)
	}
	if n := receiptCount(t); n != before {
		t.Errorf("%d receipts made without a key", n-before)
	}
}

package idempotency

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v4/pgxpool"
)

// Tests against a real server: the PG* environment (or IDEM_TEST_DATABASE_URL) names it; the
// role needs USAGE on schema idempotency and may create a table. Without a server they skip.

var runID = func() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

var (
	poolOnce sync.Once
	pool     *pgxpool.Pool
	poolErr  error
)

func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	poolOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var cfg *pgxpool.Config
		if cfg, poolErr = pgxpool.ParseConfig(os.Getenv("IDEM_TEST_DATABASE_URL")); poolErr != nil {
			return
		}
		cfg.MaxConns = 30
		if pool, poolErr = pgxpool.ConnectConfig(ctx, cfg); poolErr != nil {
			return
		}
		if poolErr = pool.Ping(ctx); poolErr != nil {
			pool.Close()
			pool = nil
			return
		}
		_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS go_client_test_effects
		    (id bigserial PRIMARY KEY, scope text NOT NULL, key text NOT NULL, note text)`)
		if err != nil {
			poolErr = fmt.Errorf("set-up: %w", err)
		}
	})
	if pool == nil {
		t.Skipf("no PostgreSQL server from the PG* environment or IDEM_TEST_DATABASE_URL (%v): "+
			"these tests need one (test/suites/client_go.sh provides one)", poolErr)
	}
	if poolErr != nil {
		t.Fatalf("the server is reachable but not set up for the tests: %v", poolErr)
	}
	return pool
}

// effects: rows the handlers wrote under a scope.
func effects(t *testing.T, scope string) int {
	t.Helper()
	var n int
	if err := testPool(t).QueryRow(context.Background(),
		`SELECT count(*) FROM go_client_test_effects WHERE scope = $1::text`, scope).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// insertEffect writes an effect through the claim's transaction (inbox) or the pool.
func insertEffect(r *http.Request, note string) (int64, error) {
	const q = `INSERT INTO go_client_test_effects (scope, key, note) VALUES ($1::text, $2::text, $3::text) RETURNING id`
	c := ClaimFrom(r.Context())
	var id int64
	if tx := Tx(r.Context()); tx != nil {
		return id, tx.QueryRow(r.Context(), q, c.Scope, c.Key, note).Scan(&id)
	}
	return id, pool.QueryRow(r.Context(), q, c.Scope, c.Key, note).Scan(&id)
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

func post(t *testing.T, url, key, contentType string, body []byte) answer {
	t.Helper()
	req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, b}
}

// server: the middleware with opts around h, every request in scope.
func server(t *testing.T, opts Options, h http.HandlerFunc) (*httptest.Server, string) {
	opts.Pool = testPool(t)
	scope := runID + "-" + t.Name()
	opts.Scope = func(*http.Request) string { return scope }
	if opts.PolicyURL == "" {
		opts.PolicyURL = "https://api.example/policy"
	}
	srv := httptest.NewServer(Middleware(opts)(h))
	t.Cleanup(srv.Close)
	return srv, scope
}

// stored: the parts of an answer a replay must repeat.
func stored(a answer) string {
	h := a.header.Clone()
	for _, name := range []string{"Date", "Content-Length", "Idempotent-Replayed"} {
		h.Del(name)
	}
	var b strings.Builder
	h.Write(&b)
	return fmt.Sprintf("%d\n%s\n%x", a.status, b.String(), a.body)
}

func TestServerReplayByteForByte(t *testing.T) {
	body := []byte{0, 1, 2, 0xff, 0xfe, '\r', '\n', 'x'}
	srv, scope := server(t, Options{}, func(w http.ResponseWriter, r *http.Request) {
		id, err := insertEffect(r, "binary")
		if err != nil {
			t.Error(err)
		}
		in, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/x-test")
		w.Header().Set("Location", "/things/"+strconv.FormatInt(id, 10))
		w.Header().Add("Set-Cookie", "a=1")
		w.Header().Add("Set-Cookie", "b=2")
		w.Header().Set("X-Nonce", runID+time.Now().String())
		w.WriteHeader(http.StatusCreated)
		w.Write(in)
	})
	first := post(t, srv.URL+"/things", `"bin-1"`, "application/octet-stream", body)
	second := post(t, srv.URL+"/things", "bin-1", "application/octet-stream", body) // bare: the same key
	if first.status != 201 || !bytes.Equal(first.body, body) || first.replayed() {
		t.Fatalf("first: %+v", first)
	}
	if !second.replayed() || stored(first) != stored(second) {
		t.Errorf("second is not the first byte for byte:\n%s\n---\n%s", stored(first), stored(second))
	}
	if n := effects(t, scope); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
}

func TestServerJSONKeyOrderAndMismatch(t *testing.T) {
	srv, scope := server(t, Options{}, func(w http.ResponseWriter, r *http.Request) {
		insertEffect(r, "json")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		io.WriteString(w, `{"secret":"stored-answer"}`)
	})
	first := post(t, srv.URL+"/p", "j-1", "application/json", []byte(`{"amount": 5, "note": "x"}`))
	again := post(t, srv.URL+"/p", "j-1", "application/json", []byte(`{"note":"x","amount":5}`))
	other := post(t, srv.URL+"/p", "j-1", "application/json", []byte(`{"note":"x","amount":6}`))
	otherPath := post(t, srv.URL+"/q", "j-1", "application/json", []byte(`{"amount": 5, "note": "x"}`))
	if first.status != 201 || !again.replayed() || stored(first) != stored(again) {
		t.Errorf("key order: %+v then %+v", first, again)
	}
	for _, a := range []answer{other, otherPath} {
		if a.status != 422 || a.header.Get("Content-Type") != "application/problem+json" ||
			bytes.Contains(a.body, []byte("stored-answer")) || a.replayed() {
			t.Errorf("another request under the key: %+v", a)
		}
	}
	if n := effects(t, scope); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
}

func TestServerConcurrentDuplicates(t *testing.T) {
	srv, scope := server(t, Options{}, func(w http.ResponseWriter, r *http.Request) {
		insertEffect(r, "concurrent")
		w.WriteHeader(201)
		io.WriteString(w, "made")
	})
	const n = 25
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			answers[i] = post(t, srv.URL+"/c", "c-1", "text/plain", []byte("same"))
		}(i)
	}
	close(start)
	wg.Wait()
	fresh := 0
	for _, a := range answers {
		switch {
		case a.status == 201 && !a.replayed():
			fresh++
		case a.status == 201 && string(a.body) == "made":
		case a.status == 409 && a.header.Get("Retry-After") != "":
		default:
			t.Errorf("unexpected answer %d %v %q", a.status, a.header, a.body)
		}
	}
	if fresh != 1 || effects(t, scope) != 1 {
		t.Errorf("%d fresh answers, %d effects; want 1 and 1", fresh, effects(t, scope))
	}
}

// holding: a handler that signals when it runs and holds until released.
type holding struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newHolding() *holding {
	return &holding{entered: make(chan struct{}), release: make(chan struct{})}
}

func (h *holding) hold() {
	h.once.Do(func() { close(h.entered) })
	<-h.release
}

func TestServerInProgress(t *testing.T) {
	for _, mode := range []Mode{Inbox, TwoPhase} {
		t.Run(mode.String(), func(t *testing.T) {
			h := newHolding()
			srv, scope := server(t, Options{Mode: mode}, func(w http.ResponseWriter, r *http.Request) {
				h.hold()
				insertEffect(r, "held")
				w.WriteHeader(201)
			})
			done := make(chan answer)
			go func() { done <- post(t, srv.URL+"/h", "h-1", "text/plain", []byte("x")) }()
			<-h.entered
			dup := post(t, srv.URL+"/h", "h-1", "text/plain", []byte("x"))
			ra, err := strconv.Atoi(dup.header.Get("Retry-After"))
			if dup.status != 409 || err != nil || ra < 1 || dup.header.Get("Content-Type") != "application/problem+json" {
				t.Errorf("duplicate in flight: %+v", dup)
			}
			close(h.release)
			if first := <-done; first.status != 201 {
				t.Errorf("first: %+v", first)
			}
			if again := post(t, srv.URL+"/h", "h-1", "text/plain", []byte("x")); !again.replayed() || again.status != 201 {
				t.Errorf("after: %+v", again)
			}
			if n := effects(t, scope); n != 1 {
				t.Errorf("%d effects", n)
			}
		})
	}
}

func TestServerWaitReplays(t *testing.T) {
	h := newHolding()
	srv, scope := server(t, Options{Wait: 30 * time.Second}, func(w http.ResponseWriter, r *http.Request) {
		h.hold()
		insertEffect(r, "waited")
		w.WriteHeader(201)
		io.WriteString(w, "first")
	})
	done := make(chan answer, 2)
	go func() { done <- post(t, srv.URL+"/w", "w-1", "text/plain", []byte("x")) }()
	<-h.entered
	go func() { done <- post(t, srv.URL+"/w", "w-1", "text/plain", []byte("x")) }()
	// The duplicate is waiting when a claim_key of this test is running on the server.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		testPool(t).QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		   WHERE state = 'active' AND query LIKE '%claim_key%' AND pid <> pg_backend_pid()`).Scan(&waiting)
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the duplicate never waited in claim_key")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(h.release)
	a, b := <-done, <-done
	if a.status != 201 || b.status != 201 || a.replayed() == b.replayed() || string(a.body) != "first" || string(b.body) != "first" {
		t.Errorf("waited duplicate: %+v %+v", a, b)
	}
	if n := effects(t, scope); n != 1 {
		t.Errorf("%d effects", n)
	}
}

// failing: a handler that fails (a 503 or a panic) the first time, then succeeds; every
// attempt writes an effect first.
func failing(t *testing.T, how string) http.HandlerFunc {
	var mu sync.Mutex
	calls := 0
	return func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if _, err := insertEffect(r, how); err != nil {
			t.Error(err)
		}
		if n == 1 {
			switch how {
			case "panic":
				panic("the handler failed")
			case "400":
				w.WriteHeader(400)
				io.WriteString(w, "bad")
				return
			}
			w.WriteHeader(503)
			io.WriteString(w, "unavailable")
			return
		}
		w.WriteHeader(201)
		io.WriteString(w, "done")
	}
}

func TestServerFailuresNotStored(t *testing.T) {
	for _, how := range []string{"503", "panic"} {
		t.Run(how, func(t *testing.T) {
			srv, scope := server(t, Options{}, failing(t, how))
			first := post(t, srv.URL+"/f", "f-1", "text/plain", []byte("x"))
			if (how == "503" && (first.status != 503 || string(first.body) != "unavailable")) ||
				(how == "panic" && (first.status != 500 || first.header.Get("Content-Type") != "application/problem+json")) {
				t.Errorf("first: %+v", first)
			}
			if n := effects(t, scope); n != 0 {
				t.Errorf("the failed attempt's effect stayed: %d", n)
			}
			second := post(t, srv.URL+"/f", "f-1", "text/plain", []byte("x"))
			if second.status != 201 || second.replayed() {
				t.Errorf("the retry did not run afresh: %+v", second)
			}
			if n := effects(t, scope); n != 1 {
				t.Errorf("%d effects, want 1", n)
			}
		})
	}
}

func TestServerStoreErrors(t *testing.T) {
	for _, how := range []string{"503", "panic"} {
		t.Run(how, func(t *testing.T) {
			srv, scope := server(t, Options{StoreErrors: true}, failing(t, how))
			first := post(t, srv.URL+"/f", "s-1", "text/plain", []byte("x"))
			second := post(t, srv.URL+"/f", "s-1", "text/plain", []byte("x"))
			want := map[string]int{"503": 503, "panic": 500}[how]
			if first.status != want || !second.replayed() || stored(first) != stored(second) {
				t.Errorf("stored failure: %+v then %+v", first, second)
			}
			if n := effects(t, scope); n != 0 {
				t.Errorf("the failed handler's writes were kept: %d", n)
			}
		})
	}
}

func TestServer4xxStored(t *testing.T) {
	srv, scope := server(t, Options{}, failing(t, "400"))
	first := post(t, srv.URL+"/f", "b-1", "text/plain", []byte("x"))
	second := post(t, srv.URL+"/f", "b-1", "text/plain", []byte("x"))
	if first.status != 400 || !second.replayed() || stored(first) != stored(second) {
		t.Errorf("a 400: %+v then %+v", first, second)
	}
	if n := effects(t, scope); n != 1 { // a 4xx is an answer: the handler's writes commit with it
		t.Errorf("%d effects", n)
	}
}

func TestServerTwoPhaseReleaseAndCheckpoint(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv, scope := server(t, Options{Mode: TwoPhase, Lease: time.Minute}, func(w http.ResponseWriter, r *http.Request) {
		c := ClaimFrom(r.Context())
		mu.Lock()
		seen = append(seen, c.Status+":"+c.RecoveryPoint)
		n := len(seen)
		mu.Unlock()
		if Tx(r.Context()) != nil {
			t.Error("a two-phase handler got a transaction")
		}
		if n == 1 {
			if err := Checkpoint(r.Context(), "charged"); err != nil {
				t.Error(err)
			}
			w.WriteHeader(503) // a transient failure: the key is released
			return
		}
		insertEffect(r, "two-phase")
		w.WriteHeader(201)
		io.WriteString(w, "charged once")
	})
	first := post(t, srv.URL+"/t", "t-1", "text/plain", []byte("x"))
	second := post(t, srv.URL+"/t", "t-1", "text/plain", []byte("x"))
	third := post(t, srv.URL+"/t", "t-1", "text/plain", []byte("x"))
	if first.status != 503 || second.status != 201 || second.replayed() || !third.replayed() || string(third.body) != "charged once" {
		t.Errorf("answers: %+v %+v %+v", first, second, third)
	}
	if strings.Join(seen, ",") != "claimed:,reclaimed:charged" {
		t.Errorf("the handler saw %v", seen)
	}
	if n := effects(t, scope); n != 1 {
		t.Errorf("%d effects", n)
	}
}

func TestServerScopes(t *testing.T) {
	opts := Options{Pool: testPool(t), Scope: func(r *http.Request) string { return runID + "-" + r.Header.Get("X-Tenant") }}
	srv := httptest.NewServer(Middleware(opts)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		insertEffect(r, "tenant")
		w.WriteHeader(201)
	})))
	defer srv.Close()
	for _, tenant := range []string{"t1", "t2", "t1"} {
		req, _ := http.NewRequest("POST", srv.URL+"/s", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", "same")
		req.Header.Set("X-Tenant", tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if effects(t, runID+"-t1") != 1 || effects(t, runID+"-t2") != 1 {
		t.Errorf("two tenants, one key: %d and %d effects", effects(t, runID+"-t1"), effects(t, runID+"-t2"))
	}
}

func TestServerSQLStates(t *testing.T) {
	// A fingerprint over idempotency.max_fingerprint_size: 22001 from the server -> 400.
	srv, scope := server(t, Options{Fingerprint: func(*http.Request, []byte) ([]byte, error) {
		return bytes.Repeat([]byte{1}, 1<<20), nil
	}}, func(w http.ResponseWriter, r *http.Request) { insertEffect(r, "never") })
	a := post(t, srv.URL+"/q", "q-1", "text/plain", []byte("x"))
	if a.status != 400 || a.header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("22001: %+v", a)
	}
	if n := effects(t, scope); n != 0 {
		t.Errorf("%d effects", n)
	}
}

func TestServerPolicy(t *testing.T) {
	p := testPool(t)
	for _, c := range []struct {
		ttl  time.Duration
		want string
	}{
		{2 * time.Hour, `"ttl_seconds":7200`},
		{0, `"ttl_seconds":`}, // the server's default_ttl
	} {
		w := httptest.NewRecorder()
		PolicyHandler(Options{Pool: p, TTL: c.ttl}).ServeHTTP(w, httptest.NewRequest("GET", "/idempotency-policy", nil))
		if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" || !strings.Contains(w.Body.String(), c.want) ||
			!strings.HasPrefix(w.Body.String(), `{"header":"Idempotency-Key","required_for":["POST","PATCH"],"max_length":255,`) {
			t.Errorf("policy: %d %s", w.Code, w.Body)
		}
	}
	var def float64
	p.QueryRow(context.Background(), `SELECT extract(epoch FROM current_setting('idempotency.default_ttl')::interval)::float8`).Scan(&def)
	w := httptest.NewRecorder()
	PolicyHandler(Options{Pool: p}).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if !strings.Contains(w.Body.String(), fmt.Sprintf(`"ttl_seconds":%d}`, int64(def))) {
		t.Errorf("default ttl %v: %s", def, w.Body)
	}
}

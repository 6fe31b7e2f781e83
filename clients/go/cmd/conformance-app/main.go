// The conformance app of the Go package (clients/conformance/CONTRACT.md): a small payments
// service behind idempotency.Middleware, configured by the environment (DATABASE_URL, LISTEN,
// IDEM_MODE, IDEM_STORE_ERRORS, IDEM_WAIT_MS, IDEM_LEASE_SECONDS, IDEM_TTL_SECONDS).
//
//	cd clients/go && ./offline.sh go build -o /tmp/conformance-app ./cmd/conformance-app
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
	"time"

	idempotency "idempotency/clients/go"

	"github.com/jackc/pgx/v4/pgxpool"
)

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	v, err := strconv.Atoi(env(name, strconv.Itoa(def)))
	if err != nil {
		log.Fatalf("%s: %v", name, err)
	}
	return v
}

// nonce: a fresh random (version 4) UUID.
func nonce() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func tenant(r *http.Request) string {
	if t := r.Header.Get("X-Tenant"); t != "" {
		return t
	}
	return "default"
}

type app struct {
	pool *pgxpool.Pool
	mode idempotency.Mode
}

// insert: the effect. Inbox: through the claim's transaction; two-phase: on its own
// connection, autocommit (an outside effect).
func (a *app) insert(r *http.Request, amount int, note string) (int64, error) {
	const q = `INSERT INTO payments (tenant, amount, note) VALUES ($1::text, $2::int, $3::text) RETURNING id`
	var id int64
	if tx := idempotency.Tx(r.Context()); tx != nil {
		return id, tx.QueryRow(r.Context(), q, tenant(r), amount, note).Scan(&id)
	}
	if a.mode == idempotency.Inbox {
		return 0, fmt.Errorf("no claim transaction in inbox mode")
	}
	return id, a.pool.QueryRow(r.Context(), q, tenant(r), amount, note).Scan(&id)
}

// failures: X-Sleep-Ms, then X-Fail (raise, 503, 400). true when it answered.
func failures(w http.ResponseWriter, r *http.Request) bool {
	if ms, err := strconv.Atoi(r.Header.Get("X-Sleep-Ms")); err == nil && ms > 0 {
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-r.Context().Done():
		}
	}
	switch r.Header.Get("X-Fail") {
	case "raise":
		panic("X-Fail: raise")
	case "503":
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": "unavailable"})
		return true
	case "400":
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": "bad amount"})
		return true
	}
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
}

func (a *app) payments(w http.ResponseWriter, r *http.Request) {
	if failures(w, r) {
		return
	}
	var in struct {
		Amount int    `json:"amount"`
		Note   string `json:"note"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": "bad json"})
		return
	}
	id, err := a.insert(r, in.Amount, in.Note)
	if err != nil {
		log.Printf("payments: %v", err)
		writeJSON(w, http.StatusInternalServerError, map[string]any{"error": "insert failed"})
		return
	}
	w.Header().Set("Location", fmt.Sprintf("/payments/%d", id))
	w.Header().Set("X-Request-Nonce", nonce())
	writeJSON(w, http.StatusCreated, map[string]any{"id": id, "tenant": tenant(r), "amount": in.Amount})
}

func (a *app) echo(w http.ResponseWriter, r *http.Request) {
	if failures(w, r) {
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": "bad body"})
		return
	}
	if _, err := a.insert(r, len(body), "echo"); err != nil {
		log.Printf("echo: %v", err)
		writeJSON(w, http.StatusInternalServerError, map[string]any{"error": "insert failed"})
		return
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("X-Request-Nonce", nonce())
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}

// only serves h for exactly method and path; everything else is 404.
func only(method string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method {
			http.NotFound(w, r)
			return
		}
		h(w, r)
	})
}

func main() {
	log.SetPrefix("conformance-app: ")
	ctx := context.Background()
	pool, err := pgxpool.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatalf("DATABASE_URL: %v", err)
	}
	defer pool.Close()
	mode := idempotency.Inbox
	switch m := env("IDEM_MODE", "inbox"); m {
	case "inbox":
	case "two_phase":
		mode = idempotency.TwoPhase
	default:
		log.Fatalf("IDEM_MODE: %q is neither inbox nor two_phase", m)
	}
	opts := idempotency.Options{
		Pool:        pool,
		PolicyURL:   "/idempotency-policy",
		Scope:       tenant,
		Mode:        mode,
		StoreErrors: env("IDEM_STORE_ERRORS", "0") == "1",
		Wait:        time.Duration(envInt("IDEM_WAIT_MS", 0)) * time.Millisecond,
		TTL:         time.Duration(envInt("IDEM_TTL_SECONDS", 86400)) * time.Second,
		Lease:       time.Duration(envInt("IDEM_LEASE_SECONDS", 30)) * time.Second,
	}
	a := &app{pool: pool, mode: mode}
	idem := idempotency.Middleware(opts)
	mux := http.NewServeMux()
	mux.Handle("/healthz", only(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "ok")
	}))
	mux.Handle("/idempotency-policy", only(http.MethodGet, idempotency.PolicyHandler(opts).ServeHTTP))
	mux.Handle("/payments", only(http.MethodPost, idem(http.HandlerFunc(a.payments)).ServeHTTP))
	mux.Handle("/echo", only(http.MethodPost, idem(http.HandlerFunc(a.echo)).ServeHTTP))
	listen := env("LISTEN", "127.0.0.1:8080")
	log.Printf("listening on %s (%s)", listen, env("IDEM_MODE", "inbox"))
	srv := &http.Server{Addr: listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// Mode says where the handler's effect happens.
type Mode int

const (
	// Inbox: the handler runs inside the claim's transaction (Tx(r.Context())); its writes
	// and the stored answer commit together, or roll back together with the claim.
	Inbox Mode = iota
	// TwoPhase: the claim commits first (duplicates see in_progress until the lease ends),
	// then the handler runs (it calls outside services), then the answer is stored in a
	// transaction of its own. A 5xx or a panic releases the key: the retry runs afresh.
	TwoPhase
)

func (m Mode) String() string {
	if m == TwoPhase {
		return "two_phase"
	}
	return "inbox"
}

// Options configure the middleware and the policy document. Only Pool is required.
type Options struct {
	Pool *pgxpool.Pool
	// PolicyURL is the "type" of the problem documents the middleware answers with (400, 409,
	// 413, 422, 503): where the API explains its Idempotency-Key policy. "about:blank" when "".
	PolicyURL string
	// Scope names the key space of a request: the authenticated client or tenant, so that two
	// clients never share keys. "" (one space) when nil.
	Scope func(*http.Request) string
	Mode  Mode
	// StoreErrors stores 5xx answers and handler panics (as 500) like any other answer
	// (Stripe's behaviour); by default they are not stored and a retry runs afresh.
	StoreErrors bool
	// Wait: how long a duplicate waits for the request in flight before it gets 409.
	Wait time.Duration
	// TTL: how long completed keys are kept (the server's idempotency.default_ttl when 0).
	TTL time.Duration
	// Lease: how long a two-phase claim blocks its key when its holder dies (the server's
	// idempotency.default_lease when 0).
	Lease time.Duration
	// Fingerprint overrides the request fingerprint (at most idempotency.max_fingerprint_size
	// bytes). By default: a JSON body gives request_fingerprint(jsonb) of {method, path,
	// body}, so key order and spacing do not matter; any other body, the SHA-256 of
	// "METHOD PATH?QUERY\n" and its bytes.
	Fingerprint func(r *http.Request, body []byte) ([]byte, error)
	// RequiredFor: the methods that need a key (POST and PATCH when nil); others pass through.
	RequiredFor []string
	// MaxBody: the largest request body read, in bytes (1 MiB when 0); larger ones get 413.
	MaxBody int64
	// Logger for set-up and database errors (log.Default() when nil).
	Logger *log.Logger
}

func (o *Options) logf(format string, args ...any) {
	if o.Logger != nil {
		o.Logger.Printf(format, args...)
	} else {
		log.Printf(format, args...)
	}
}

func (o *Options) requiredFor() []string {
	if o.RequiredFor == nil {
		return []string{http.MethodPost, http.MethodPatch}
	}
	return o.RequiredFor
}

// seconds: a duration as the float8 parameter the SQL multiplies by 1 second; NULL when 0.
func seconds(d time.Duration) *float64 {
	if d <= 0 {
		return nil
	}
	s := d.Seconds()
	return &s
}

// Claim is the claim a handler runs under: ClaimFrom(r.Context()).
type Claim struct {
	Key   string
	Scope string
	Token string
	// Status is "claimed" or "reclaimed" (an earlier holder died or released the key).
	Status   string
	Attempts int
	// RecoveryPoint is the last checkpoint of an earlier attempt ("" when none).
	RecoveryPoint string

	tx    pgx.Tx
	pool  *pgxpool.Pool
	lease *float64
}

type claimKey struct{}

// ClaimFrom returns the claim of the request whose context is ctx; nil outside a claim.
func ClaimFrom(ctx context.Context) *Claim {
	c, _ := ctx.Value(claimKey{}).(*Claim)
	return c
}

// Tx is the transaction of the request's claim (Inbox mode), which the handler's writes must
// use: they commit with the stored answer or roll back with the claim. nil in TwoPhase mode
// and outside a claimed request.
func Tx(ctx context.Context) pgx.Tx {
	if c := ClaimFrom(ctx); c != nil {
		return c.tx
	}
	return nil
}

// ErrNoClaim: Checkpoint was called outside a claimed request.
var ErrNoClaim = errors.New("idempotency: no claim in this context")

// Checkpoint records a recovery point for the request's claim and renews its lease
// (idempotency.checkpoint_key): after a crash, the next attempt gets it in
// ClaimFrom(ctx).RecoveryPoint. For multi-step TwoPhase handlers.
func Checkpoint(ctx context.Context, recoveryPoint string) error {
	c := ClaimFrom(ctx)
	if c == nil {
		return ErrNoClaim
	}
	const q = `SELECT idempotency.checkpoint_key($1::text, $2::uuid, $3::text, $4::text,
	                                          lease => $5::float8 * interval '1 second')`
	if c.tx != nil {
		_, err := c.tx.Exec(ctx, q, c.Key, c.Token, recoveryPoint, c.Scope, c.lease)
		return err
	}
	return retry(func() error {
		_, err := c.pool.Exec(ctx, q, c.Key, c.Token, recoveryPoint, c.Scope, c.lease)
		return err
	})
}

// claimResult is what claim_key answered.
type claimResult struct {
	status        string
	token         *string
	code          *int32
	body          []byte
	headers       *string
	response      *string
	retryAfter    *int32
	recoveryPoint *string
	attempts      *int32
}

// querier: a transaction or the pool.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

const claimSQL = `SELECT status::text, token::text, response_code, response_body, response_headers::text,
       response::text, ceil(extract(epoch FROM retry_after))::int, recovery_point, attempts
  FROM idempotency.claim_key($1::text,
         CASE WHEN $2::jsonb IS NULL THEN $3::bytea ELSE idempotency.request_fingerprint($2::jsonb) END,
         $4::text, ttl => $5::float8 * interval '1 second', lease => $6::float8 * interval '1 second',
         wait => coalesce($7::float8, 0) * interval '1 second')`

// fingerprint is the claim's fingerprint: a JSON document for the server to hash as jsonb,
// or bytes.
type fingerprint struct {
	json  *string
	bytes []byte
}

func (o *Options) claim(ctx context.Context, q querier, key, scope string, fp fingerprint, lease *float64) (claimResult, error) {
	var c claimResult
	err := q.QueryRow(ctx, claimSQL, key, fp.json, fp.bytes, scope, seconds(o.TTL), lease, seconds(o.Wait)).
		Scan(&c.status, &c.token, &c.code, &c.body, &c.headers, &c.response, &c.retryAfter, &c.recoveryPoint, &c.attempts)
	return c, err
}

// requestFingerprint: Options.Fingerprint, or the default (see Options.Fingerprint).
func (o *Options) requestFingerprint(r *http.Request, body []byte) (fingerprint, error) {
	if o.Fingerprint != nil {
		b, err := o.Fingerprint(r, body)
		return fingerprint{bytes: b}, err
	}
	if isJSON(r.Header.Get("Content-Type")) && json.Valid(body) {
		doc, err := json.Marshal(struct {
			Method string          `json:"method"`
			Path   string          `json:"path"`
			Body   json.RawMessage `json:"body"`
		}{r.Method, r.URL.RequestURI(), json.RawMessage(body)})
		if err != nil {
			return fingerprint{}, err
		}
		s := string(doc)
		return fingerprint{json: &s}, nil
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s %s\n", r.Method, r.URL.RequestURI())
	h.Write(body)
	return fingerprint{bytes: h.Sum(nil)}, nil
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// Middleware returns the Idempotency-Key middleware: a request whose method needs a key is
// claimed; the handler runs for a new claim and its answer is stored (status, headers, body
// bytes); a duplicate gets that answer back byte for byte with Idempotent-Replayed: true, a
// 409 with Retry-After while the first is in flight, a 422 when the key was used for another
// request; a missing or malformed key gets 400.
func Middleware(opts Options) func(http.Handler) http.Handler {
	if opts.Pool == nil {
		panic("idempotency.Middleware: Options.Pool is nil")
	}
	return middleware(opts)
}

func middleware(opts Options) func(http.Handler) http.Handler {
	o := opts
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !o.needsKey(r.Method) {
				next.ServeHTTP(w, r)
				return
			}
			key, err := keyFromHeader(r.Header.Values("Idempotency-Key"))
			if err != nil {
				detail := fmt.Sprintf("%s %s needs an Idempotency-Key header: a string (\"...\") or a token of 1 to %d bytes (%v).",
					r.Method, r.URL.Path, MaxKeyLength, err)
				o.problem(w, http.StatusBadRequest, "Invalid or missing Idempotency-Key", detail)
				return
			}
			limit := o.MaxBody
			if limit <= 0 {
				limit = 1 << 20
			}
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
			if err != nil {
				o.problem(w, http.StatusRequestEntityTooLarge, "Request body too large", err.Error())
				return
			}
			fp, err := o.requestFingerprint(r, body)
			if err != nil {
				o.logf("idempotency: fingerprint: %v", err)
				o.problem(w, http.StatusInternalServerError, "Internal error", "The request fingerprint failed.")
				return
			}
			scope := ""
			if o.Scope != nil {
				scope = o.Scope(r)
			}
			req := &request{o: &o, key: key, scope: scope, fp: fp, body: body, next: next, r: r}
			var out *response
			if o.Mode == TwoPhase {
				out, err = req.twoPhase()
			} else {
				err = retry(func() (err error) {
					out, err = req.inbox()
					return err
				})
			}
			if req.abort {
				panic(http.ErrAbortHandler)
			}
			if err != nil {
				o.fail(w, err)
				return
			}
			out.send(w)
		})
	}
}

func (o *Options) needsKey(method string) bool {
	for _, m := range o.requiredFor() {
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

// request is one request under a key.
type request struct {
	o     *Options
	key   string
	scope string
	fp    fingerprint
	body  []byte
	next  http.Handler
	r     *http.Request
	abort bool // the handler panicked with http.ErrAbortHandler
}

// answer: what a claim that is not ours gets.
func (q *request) answer(c claimResult) (*response, bool) {
	switch c.status {
	case "replay":
		out, err := replayed(c)
		if err != nil {
			q.o.logf("idempotency: stored headers of key %q: %v", q.key, err)
			return q.o.problemResponse(http.StatusInternalServerError, "Internal error", "The stored answer could not be read."), true
		}
		return out, true
	case "in_progress":
		after := int32(1)
		if c.retryAfter != nil && *c.retryAfter > 1 {
			after = *c.retryAfter
		}
		out := q.o.problemResponse(http.StatusConflict, "Request in progress",
			"A request with this Idempotency-Key is still being processed; retry after the time in Retry-After.")
		out.header.Set("Retry-After", strconv.Itoa(int(after)))
		return out, true
	case "mismatch":
		return q.o.problemResponse(http.StatusUnprocessableEntity, "Idempotency-Key reused",
			"This Idempotency-Key was used for a different request."), true
	}
	return nil, false
}

// run runs the handler on a recorder; a panic is reported, not propagated.
func (q *request) run(c *Claim) (rec *recorder, panicked bool) {
	rec = &recorder{header: http.Header{}}
	r := q.r.WithContext(context.WithValue(q.r.Context(), claimKey{}, c))
	r.Body = io.NopCloser(bytes.NewReader(q.body))
	defer func() {
		if p := recover(); p != nil {
			panicked = true
			if p == http.ErrAbortHandler {
				q.abort = true
			} else {
				q.o.logf("idempotency: handler panicked under key %q: %v", q.key, p)
			}
		}
		rec.finish()
	}()
	q.next.ServeHTTP(rec, r)
	return rec, false
}

func newClaim(q *request, c claimResult, tx pgx.Tx, lease *float64) *Claim {
	cl := &Claim{Key: q.key, Scope: q.scope, Status: c.status, tx: tx, pool: q.o.Pool, lease: lease}
	if c.token != nil {
		cl.Token = *c.token
	}
	if c.attempts != nil {
		cl.Attempts = int(*c.attempts)
	}
	if c.recoveryPoint != nil {
		cl.RecoveryPoint = *c.recoveryPoint
	}
	return cl
}

const completeSQL = `SELECT status::text FROM idempotency.complete_key($1::text, $2::uuid, NULL::jsonb, $3::int, $4::text,
       response_body => $5::bytea, response_headers => $6::jsonb)`

// inbox: one attempt of claim, handler, complete and COMMIT in one transaction.
func (q *request) inbox() (*response, error) {
	ctx := q.r.Context()
	tx, err := q.o.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.Background()) // after COMMIT: a no-op
	c, err := q.o.claim(ctx, tx, q.key, q.scope, q.fp, seconds(q.o.Lease))
	if err != nil {
		return nil, err
	}
	if out, done := q.answer(c); done {
		return out, tx.Commit(ctx)
	}
	if c.status != "claimed" && c.status != "reclaimed" {
		return nil, fmt.Errorf("idempotency: unexpected claim status %q", c.status)
	}
	if q.o.StoreErrors {
		if _, err := tx.Exec(ctx, "SAVEPOINT idempotency_handler"); err != nil {
			return nil, err
		}
	}
	rec, panicked := q.run(newClaim(q, c, tx, seconds(q.o.Lease)))
	if q.abort {
		return nil, nil
	}
	if panicked || rec.status >= 500 {
		if !q.o.StoreErrors {
			// The claim rolls back with the handler's writes: a retry runs afresh.
			return q.failure(rec, panicked), nil
		}
		// Stored: the handler's writes go, the answer stays.
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT idempotency_handler"); err != nil {
			return nil, err
		}
		rec = q.failure(rec, panicked).recorded()
	}
	headers, err := json.Marshal(storedHeaders(rec.sent))
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, completeSQL, q.key, *c.token, rec.status, q.scope, rec.body.Bytes(), string(headers)); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return rec.response(), nil
}

// failure: what the client gets for a 5xx or a panic.
func (q *request) failure(rec *recorder, panicked bool) *response {
	if panicked {
		return q.o.problemResponse(http.StatusInternalServerError, "Internal error",
			"The request failed.")
	}
	return rec.response()
}

// twoPhase: claim and COMMIT, run the handler, then complete (or release) in a transaction
// of its own.
func (q *request) twoPhase() (*response, error) {
	ctx := q.r.Context()
	lease := seconds(q.o.Lease)
	var c claimResult
	err := retry(func() (err error) {
		c, err = q.o.claim(ctx, q.o.Pool, q.key, q.scope, q.fp, lease)
		return err
	})
	if err != nil {
		return nil, err
	}
	if out, done := q.answer(c); done {
		return out, nil
	}
	if c.status != "claimed" && c.status != "reclaimed" {
		return nil, fmt.Errorf("idempotency: unexpected claim status %q", c.status)
	}
	rec, panicked := q.run(newClaim(q, c, nil, lease))
	// The effect happened (or failed): finish the key even if the client has gone.
	bg, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if (panicked || rec.status >= 500) && !q.o.StoreErrors {
		if err := retry(func() error {
			_, err := q.o.Pool.Exec(bg, `SELECT idempotency.release_key($1::text, $2::uuid, $3::text)`, q.key, *c.token, q.scope)
			return err
		}); err != nil {
			// The key stays claimed until its lease ends; a retry gets 409 until then.
			q.o.logf("idempotency: release of key %q: %v", q.key, err)
		}
		if q.abort {
			return nil, nil
		}
		return q.failure(rec, panicked), nil
	}
	if q.abort {
		return nil, nil
	}
	if panicked || rec.status >= 500 {
		rec = q.failure(rec, panicked).recorded()
	}
	headers, err := json.Marshal(storedHeaders(rec.sent))
	if err != nil {
		return nil, err
	}
	if err := retry(func() error {
		_, err := q.o.Pool.Exec(bg, completeSQL, q.key, *c.token, rec.status, q.scope, rec.body.Bytes(), string(headers))
		return err
	}); err != nil {
		// The effect is done: answer it. The key is reclaimed after its lease (or was already,
		// 55000), and the next attempt sees the last checkpoint.
		q.o.logf("idempotency: complete of key %q after its effect: %v", q.key, err)
	}
	return rec.response(), nil
}

// response is an answer to send.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (out *response) send(w http.ResponseWriter) {
	for name, values := range out.header {
		w.Header()[name] = values
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(out.body)))
	w.WriteHeader(out.status)
	w.Write(out.body)
}

// recorded: the response as a recorder, to store it.
func (out *response) recorded() *recorder {
	rec := &recorder{header: out.header, sent: out.header.Clone(), status: out.status}
	rec.body.Write(out.body)
	return rec
}

// replayed: a stored answer as the first request got it, plus the replay marker.
func replayed(c claimResult) (*response, error) {
	out := &response{status: http.StatusOK, header: http.Header{}}
	if c.headers != nil {
		var stored map[string]json.RawMessage
		if err := json.Unmarshal([]byte(*c.headers), &stored); err != nil {
			return nil, err
		}
		for name, raw := range stored {
			var values []string
			if err := json.Unmarshal(raw, &values); err != nil {
				var value string
				if err := json.Unmarshal(raw, &value); err != nil {
					return nil, err
				}
				values = []string{value}
			}
			out.header[name] = values
		}
	}
	out.body = c.body
	if c.body == nil && c.response != nil { // completed with a jsonb response only
		out.body = []byte(*c.response)
		if out.header.Get("Content-Type") == "" {
			out.header.Set("Content-Type", "application/json")
		}
	}
	if c.code != nil {
		out.status = int(*c.code)
	}
	out.header.Set("Idempotent-Replayed", "true")
	return out, nil
}

// recorder is the http.ResponseWriter a handler writes to: it keeps the status, the headers
// as they were when the response started (as net/http sends them) and the body's bytes.
type recorder struct {
	header http.Header
	sent   http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status != 0 {
		return
	}
	r.status = status
	r.sent = r.header.Clone()
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	return r.body.Write(p)
}

// finish does what net/http does for a handler that set no status or Content-Type, so that
// what is stored is what the client gets.
func (r *recorder) finish() {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if _, set := r.sent["Content-Type"]; !set && r.body.Len() > 0 {
		r.sent.Set("Content-Type", http.DetectContentType(r.body.Bytes()))
	}
}

func (r *recorder) response() *response {
	return &response{status: r.status, header: r.sent, body: r.body.Bytes()}
}

// Headers that belong to one connection or one transfer, or that the server sets for each
// response: not stored (Content-Length follows from the stored body).
var unstored = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true,
	"Upgrade": true, "Content-Length": true, "Date": true, "Idempotent-Replayed": true,
}

// storedHeaders: the response's headers as complete_key takes them, a JSON object whose values
// are strings (one value) or arrays of strings (several, in order).
func storedHeaders(h http.Header) map[string]any {
	stored := map[string]any{}
	for name, values := range h {
		if unstored[http.CanonicalHeaderKey(name)] || len(values) == 0 {
			continue
		}
		if len(values) == 1 {
			stored[name] = values[0]
		} else {
			stored[name] = values
		}
	}
	return stored
}

// problemResponse: an RFC 9457 problem document whose type is the policy URL.
func (o *Options) problemResponse(status int, title, detail string) *response {
	typ := o.PolicyURL
	if typ == "" {
		typ = "about:blank"
	}
	body, _ := json.Marshal(map[string]any{"type": typ, "title": title, "status": status, "detail": detail})
	h := http.Header{}
	h.Set("Content-Type", "application/problem+json")
	return &response{status: status, header: h, body: body}
}

func (o *Options) problem(w http.ResponseWriter, status int, title, detail string) {
	o.problemResponse(status, title, detail).send(w)
}

// fail answers a database error: nothing was stored, so a retry with the key is safe.
func (o *Options) fail(w http.ResponseWriter, err error) {
	code := SQLState(err)
	switch {
	case Retryable(err) || Unavailable(err):
		o.logf("idempotency: database unavailable: %v", err)
		out := o.problemResponse(http.StatusServiceUnavailable, "Service unavailable",
			"The request could not be processed now; retry with the same Idempotency-Key.")
		out.header.Set("Retry-After", "1")
		out.send(w)
	case code == "22001" || code == "22023" || code == "22P02":
		o.problem(w, http.StatusBadRequest, "Invalid request", "The Idempotency-Key or the request was refused by the database (SQLSTATE "+code+").")
	case code == "54000":
		o.problem(w, http.StatusRequestEntityTooLarge, "Response too large to store",
			"The answer is larger than the stored answers may be; nothing was stored.")
	default:
		// 42501 is a set-up error (GRANT USAGE ON SCHEMA idempotency TO the role): logged.
		o.logf("idempotency: %v", err)
		o.problem(w, http.StatusInternalServerError, "Internal error", "Nothing was stored; retrying with the same Idempotency-Key is safe.")
	}
}

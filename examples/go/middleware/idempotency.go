// An Idempotency-Key middleware for net/http (the IETF draft-ietf-httpapi-idempotency-key-header)
// with the idempotency PostgreSQL extension and pgx v4. It wraps any handler: a POST or PATCH
// with an Idempotency-Key header is claimed (the fingerprint covers the method, the path with
// its query, and the body), the handler runs inside the claim's transaction, and the response it
// wrote (status, headers, body bytes) is stored with complete_key and committed with the
// handler's own writes (the inbox pattern). A retry gets that response back byte for byte, with
// Idempotent-Replayed: true.
//
//	claimed / reclaimed -> run the handler, store its response, COMMIT, send it
//	replay              -> the stored status, headers and body, as first sent
//	in_progress         -> 409 Conflict with Retry-After (the first request is still running)
//	mismatch            -> 422 Unprocessable Content (the key was used for another request)
//	no key on POST/PATCH -> 400 Bad Request; other methods pass through untouched
//
// A response of status 500 or more is not stored: the claim and the handler's writes roll
// back, and a retry with the same key runs afresh (the failure is sent as the handler wrote it).
// When the effect is a call to another system rather than writes to this database, use the
// two-phase pattern instead (claim and COMMIT, call, then complete_key in a new transaction).
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// Middleware makes the handlers it wraps idempotent. The role the pool connects as needs
// USAGE on schema idempotency (GRANT USAGE ON SCHEMA idempotency TO app).
type Middleware struct {
	Pool    *pgxpool.Pool
	Scope   string // namespace of the keys (say the API client's id); "" by default
	MaxBody int64  // the largest request body read, in bytes (1 MiB when 0)
}

const maxKeyLength = 255 // idempotency.max_key_length

type txKey struct{}

// Tx is the transaction of the request's claim, for a wrapped handler's writes: they commit
// with the stored response, or roll back with the claim. nil outside a claimed request.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

// Wrap returns next behind the Idempotency-Key protocol.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost && r.Method != http.MethodPatch {
			next.ServeHTTP(w, r)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		if key == "" || len(key) > maxKeyLength {
			problem(w, http.StatusBadRequest, "Idempotency-Key missing or too long",
				fmt.Sprintf("%s %s needs an Idempotency-Key header of 1 to %d bytes.", r.Method, r.URL.Path, maxKeyLength))
			return
		}
		limit := m.MaxBody
		if limit == 0 {
			limit = 1 << 20
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
		if err != nil {
			problem(w, http.StatusRequestEntityTooLarge, "Request body too large", err.Error())
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if err := m.serve(w, r, key, body, next); err != nil {
			// Nothing was stored (the transaction rolled back): a retry with the key is safe.
			problem(w, http.StatusInternalServerError, "Internal error", "Nothing was stored; retrying with the same key is safe.")
		}
	})
}

// fingerprint: SHA-256 of the method, the path with its query and the body (what
// idempotency.request_fingerprint(bytea) computes for the same bytes).
func fingerprint(r *http.Request, body []byte) []byte {
	h := sha256.New()
	fmt.Fprintf(h, "%s %s\n", r.Method, r.URL.RequestURI())
	h.Write(body)
	return h.Sum(nil)
}

// claim is what claim_key answered.
type claim struct {
	status     string
	token      *string
	code       *int32
	body       []byte // response_body: nil when none
	headers    []byte // response_headers (JSON): nil when none
	response   []byte // the jsonb response (keys completed by other clients): nil when none
	retryAfter *int32
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, key string, body []byte, next http.Handler) error {
	ctx := r.Context()
	tx, err := m.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // after a COMMIT: a no-op
	var c claim
	err = tx.QueryRow(ctx,
		`SELECT status::text, token::text, response_code, response_body, response_headers, response,
		        ceil(extract(epoch FROM retry_after))::int
		   FROM idempotency.claim_key($1, $2, $3)`,
		key, fingerprint(r, body), m.Scope).Scan(&c.status, &c.token, &c.code, &c.body, &c.headers, &c.response, &c.retryAfter)
	if err != nil {
		return err
	}
	switch c.status {
	case "claimed", "reclaimed":
	case "replay":
		return replay(w, c)
	case "in_progress":
		after := int32(1)
		if c.retryAfter != nil && *c.retryAfter > 1 {
			after = *c.retryAfter
		}
		w.Header().Set("Retry-After", strconv.Itoa(int(after)))
		problem(w, http.StatusConflict, "Request in progress",
			"A request with this Idempotency-Key is still being processed; retry later.")
		return nil
	case "mismatch":
		problem(w, http.StatusUnprocessableEntity, "Idempotency-Key reused",
			"This Idempotency-Key was used for a different request.")
		return nil
	default:
		return fmt.Errorf("unexpected claim status %q", c.status)
	}

	rec := &recorder{header: http.Header{}}
	next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, txKey{}, tx)))
	rec.finish()
	if rec.status >= 500 {
		tx.Rollback(ctx) // the claim goes with the handler's writes
		rec.writeTo(w)
		return nil
	}
	headers, err := json.Marshal(storedHeaders(rec.sent))
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx,
		`SELECT idempotency.complete_key($1, $2::uuid, NULL, $3, $4,
		                                 response_body => $5, response_headers => $6::jsonb)`,
		key, *c.token, rec.status, m.Scope, rec.body.Bytes(), string(headers)); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	rec.writeTo(w)
	return nil
}

// A replay: the stored status, headers and body as the first request sent them.
func replay(w http.ResponseWriter, c claim) error {
	header := w.Header()
	if c.headers != nil {
		var stored map[string]json.RawMessage
		if err := json.Unmarshal(c.headers, &stored); err != nil {
			return err
		}
		for name, raw := range stored {
			var values []string
			if err := json.Unmarshal(raw, &values); err != nil {
				var value string
				if err := json.Unmarshal(raw, &value); err != nil {
					return err
				}
				values = []string{value}
			}
			header[name] = values
		}
	}
	body := c.body
	if body == nil && c.response != nil { // completed with a jsonb response only
		body = c.response
		if header.Get("Content-Type") == "" {
			header.Set("Content-Type", "application/json")
		}
	}
	status := http.StatusOK
	if c.code != nil {
		status = int(*c.code)
	}
	header.Set("Content-Length", strconv.Itoa(len(body)))
	header.Set("Idempotent-Replayed", "true")
	w.WriteHeader(status)
	_, err := w.Write(body)
	return err
}

// recorder is the http.ResponseWriter a wrapped handler writes to: it keeps the status, the
// headers as they were when the response started (later changes are ignored, as net/http
// ignores them) and the body's bytes.
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
// what is stored is what the client got.
func (r *recorder) finish() {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if _, set := r.sent["Content-Type"]; !set && r.body.Len() > 0 {
		r.sent.Set("Content-Type", http.DetectContentType(r.body.Bytes()))
	}
}

func (r *recorder) writeTo(w http.ResponseWriter) {
	for name, values := range r.sent {
		w.Header()[name] = values
	}
	w.Header().Set("Content-Length", strconv.Itoa(r.body.Len()))
	w.WriteHeader(r.status)
	w.Write(r.body.Bytes())
}

// Headers that belong to one connection or one transfer, or that the server sets for each
// response: not stored (Content-Length follows from the stored body).
var unstored = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true, "Trailer": true,
	"Transfer-Encoding": true, "Upgrade": true, "Content-Length": true, "Date": true,
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

// problem writes an RFC 9457 problem (never stored: these answers are not completions).
func problem(w http.ResponseWriter, status int, title, detail string) {
	body, _ := json.Marshal(map[string]any{"type": "about:blank", "title": title, "status": status, "detail": detail})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}

// errNoTx: a wrapped handler was called outside a claimed request.
var errNoTx = errors.New("no idempotency transaction in this request's context")

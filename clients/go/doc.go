// Package idempotency makes net/http handlers and AMQP message consumers idempotent with the
// idempotency PostgreSQL extension (pgx v4).
//
// HTTP: Middleware(Options{Pool: pool, ...}) wraps a handler. A POST or PATCH with an
// Idempotency-Key header (a Structured Field string or a bare token) is claimed with
// idempotency.claim_key; the handler runs once per key and writes through Tx(r.Context()),
// the claim's transaction (Inbox mode), or calls outside services after the claim committed
// (TwoPhase mode). Its answer is stored with complete_key (status, headers, body bytes);
// duplicates get it back byte for byte with Idempotent-Replayed: true, 409 with Retry-After
// while it runs, 422 when the key was used for another request. PolicyHandler publishes the
// policy (the header, the methods, the key length, the ttl).
//
// Messages: Consumer (consumer.go) claims each AMQP delivery by its message id, runs the
// handler in the claim's transaction, completes, COMMITs and then acks; batches use
// claim_keys and complete_keys with one COMMIT and one multiple ack.
//
// Every statement names the schema and types each parameter ($1::text, $2::bytea, ...), and
// JSON is fingerprinted with idempotency.request_fingerprint($1::jsonb).
package idempotency

// Version follows the extension's.
const Version = "1.3.0"

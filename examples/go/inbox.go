// An at-least-once message handler made idempotent with the idempotency extension and
// pgx v4 (inbox pattern: claim, business write, complete, COMMIT in one transaction).
// The extension lives in its own schema, idempotency: the role the handler connects as
// needs USAGE on it (as a superuser, once: CREATE EXTENSION idempotency; GRANT USAGE ON
// SCHEMA idempotency TO app) and CREATE in the database's public schema for its table
// go_accounts (the owner of the database has it); the functions are called schema-qualified.
// The connection: a URL as the argument, else the PG* environment (PGHOST, PGPORT, ...).
// To try it (examples/README.md; the examples suite runs the Debian line):
//
//	go mod init example && go get github.com/jackc/pgx/v4 && go run .
//	GO111MODULE=off GOPATH=/usr/share/gocode go run inbox.go   # Debian's golang-github-jackc-pgx-v4-dev
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// ErrMismatch: the key was used before with another payload (reject: HTTP 422 / dead-letter).
var ErrMismatch = errors.New("idempotency key reused with another payload")

// RetryLater: another worker holds the key right now (HTTP 409 + Retry-After / redeliver later).
type RetryLater struct{ After time.Duration }

func (e *RetryLater) Error() string { return fmt.Sprintf("in progress, retry after %s", e.After) }

// HandleOnce runs effect at most once per key and returns its stored result on duplicates.
func HandleOnce(ctx context.Context, pool *pgxpool.Pool, key string, payload []byte,
	effect func(pgx.Tx) (any, error)) (result []byte, replayed bool, err error) {
	err = pool.BeginFunc(ctx, func(tx pgx.Tx) error {
		var status string
		var token, response *string // NULL unless claimed / replay
		var retryAfter *float64
		err := tx.QueryRow(ctx,
			`SELECT status::text, token::text, response::text, extract(epoch FROM retry_after)::float8
			   FROM idempotency.claim_key($1::text, idempotency.request_fingerprint($2::text::jsonb))`,
			key, string(payload)).Scan(&status, &token, &response, &retryAfter)
		if err != nil {
			return err
		}
		switch status {
		case "claimed", "reclaimed":
			out, err := effect(tx) // business writes, in this same transaction
			if err != nil {
				return err // rolls back the writes and the claim: a retry starts afresh
			}
			if result, err = json.Marshal(out); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `SELECT idempotency.complete_key($1::text, $2::text::uuid, $3::text::jsonb)`,
				key, *token, string(result))
			return err // nil: BeginFunc commits the key, the effect and the outcome together
		case "replay":
			result, replayed = []byte(*response), true
			return nil
		case "mismatch":
			return ErrMismatch
		default: // in_progress
			return &RetryLater{After: time.Duration(*retryAfter * float64(time.Second))}
		}
	})
	return result, replayed, err
}

func main() {
	ctx := context.Background()
	connString := "" // the PG* environment
	if len(os.Args) > 1 {
		connString = os.Args[1]
	}
	pool, err := pgxpool.Connect(ctx, connString)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	// The business table (the role owns its database, so it may create it).
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS go_accounts (
	    id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0)`); err != nil {
		panic(err)
	}
	msg := []byte(`{"id": "go-pay-1", "account": "alice", "amount": 100}`)
	for delivery := 1; delivery <= 2; delivery++ { // the broker delivers the message twice
		out, replayed, err := HandleOnce(ctx, pool, "go-pay-1", msg, func(tx pgx.Tx) (any, error) {
			var balance int64
			err := tx.QueryRow(ctx, `INSERT INTO go_accounts (id, balance) VALUES ('alice', 100)
			    ON CONFLICT (id) DO UPDATE SET balance = go_accounts.balance + 100
			    RETURNING balance`).Scan(&balance)
			return map[string]int64{"balance": balance}, err
		})
		fmt.Printf("delivery %d: result=%s replayed=%v err=%v\n", delivery, out, replayed, err)
	}
}

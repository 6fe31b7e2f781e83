// A receipts service behind the Idempotency-Key middleware of the Go package
// (clients/go, imported as idempotency/clients/go): POST /receipts creates a receipt and
// answers 201 with a Location header and a plain-text body in ISO-8859-1 (not JSON, not
// UTF-8); a retry with the same key gets those very bytes, status and headers back, and no
// second receipt is made. GET /receipts/{id} is safe and passes through the middleware
// untouched.
//
// The role it connects as needs USAGE on schema idempotency (as a superuser, once: CREATE
// EXTENSION idempotency; GRANT USAGE ON SCHEMA idempotency TO app) and may create its table
// receipts (the owner of its database may). The connection comes from the PG* environment
// (or a DSN as the second argument); it listens on the first argument (127.0.0.1:8080).
// With Debian's golang-go and golang-github-jackc-pgx-v4-dev, offline (GOPATH mode: the
// package comes from this clone, pgx from Debian's packages; clients/go/offline.sh):
//
//	cd examples/go/middleware && PGDATABASE=app PGUSER=app ../../../clients/go/offline.sh go run . 127.0.0.1:8080
//	curl -i -X POST localhost:8080/receipts -H 'Idempotency-Key: r-1' -d 'amount=100'
//
// Its tests (middleware_test.go) start the service on 127.0.0.1:$HTTP_PORT and send real
// requests: PGDATABASE=app PGUSER=app HTTP_PORT=8089 ../../../clients/go/offline.sh go test -v
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v4/pgxpool"

	idempotency "idempotency/clients/go"
)

var errNoTx = errors.New("no idempotency transaction in this request's context")

// createSchema makes the business table (once; the role owns its database).
func createSchema(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS receipts (
	    id bigserial PRIMARY KEY, amount bigint NOT NULL, at timestamptz NOT NULL DEFAULT now())`)
	return err
}

// createReceipt: the effect, written through the claim's transaction. The body is text in
// ISO-8859-1: "Reçu n° 7" has bytes that are not UTF-8 (0xe7, 0xb0).
func createReceipt(w http.ResponseWriter, r *http.Request) {
	tx := idempotency.Tx(r.Context())
	if tx == nil {
		http.Error(w, errNoTx.Error(), http.StatusInternalServerError)
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	amount, err := strconv.ParseInt(r.PostForm.Get("amount"), 10, 64)
	if err != nil || amount <= 0 {
		http.Error(w, "amount must be a positive integer", http.StatusBadRequest)
		return
	}
	var id int64
	if err := tx.QueryRow(r.Context(), `INSERT INTO receipts (amount) VALUES ($1) RETURNING id`, amount).Scan(&id); err != nil {
		http.Error(w, "could not store the receipt", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=iso-8859-1")
	w.Header().Set("Location", fmt.Sprintf("/receipts/%d", id))
	w.Header().Add("Link", fmt.Sprintf(`</receipts/%d>; rel="self"`, id))
	w.Header().Add("Link", `</receipts>; rel="collection"`)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "Re\xe7u n\xb0 %d\r\nMontant: %d EUR\r\n", id, amount)
}

func getReceipt(pool *pgxpool.Pool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(strings.TrimPrefix(r.URL.Path, "/receipts/"), 10, 64)
		if err != nil {
			http.NotFound(w, r)
			return
		}
		var amount int64
		if err := pool.QueryRow(r.Context(), `SELECT amount FROM receipts WHERE id = $1`, id).Scan(&amount); err != nil {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=iso-8859-1")
		fmt.Fprintf(w, "Re\xe7u n\xb0 %d\r\nMontant: %d EUR\r\n", id, amount)
	}
}

// service: the routes, the POST behind the middleware.
func service(pool *pgxpool.Pool) http.Handler {
	idem := idempotency.Middleware(idempotency.Options{Pool: pool})
	mux := http.NewServeMux()
	mux.Handle("/receipts", idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		createReceipt(w, r)
	})))
	mux.Handle("/receipts/", getReceipt(pool))
	return mux
}

func main() {
	addr, dsn := "127.0.0.1:8080", ""
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	if len(os.Args) > 2 {
		dsn = os.Args[2]
	}
	ctx := context.Background()
	pool, err := pgxpool.Connect(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := createSchema(ctx, pool); err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on http://%s", addr)
	log.Fatal(http.ListenAndServe(addr, service(pool)))
}

package idempotency_test

import (
	"context"
	"log"
	"net/http"
	"time"

	idempotency "idempotency/clients/go"

	"github.com/jackc/pgx/v4/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The README's quick starts, compiled by go vet and go test (not run: they need a server).

func ExampleMiddleware() {
	pool, err := pgxpool.Connect(context.Background(), "") // the PG* environment
	if err != nil {
		log.Fatal(err)
	}
	opts := idempotency.Options{Pool: pool, PolicyURL: "/idempotency-policy", TTL: 24 * time.Hour,
		Scope: func(r *http.Request) string { return r.Header.Get("X-Tenant") }}
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := idempotency.Tx(r.Context()) // the claim's transaction: commits with the stored answer
		tx.Exec(r.Context(), `INSERT INTO payments (amount) VALUES (5)`)
		w.WriteHeader(http.StatusCreated)
	})
	http.Handle("/payments", idempotency.Middleware(opts)(pay))
	http.Handle("/idempotency-policy", idempotency.PolicyHandler(opts))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nil))
}

func ExampleConsumer() {
	pool, _ := pgxpool.Connect(context.Background(), "")
	conn, _ := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	ch, _ := conn.Channel()
	c := idempotency.NewConsumer(idempotency.ConsumerOptions{Pool: pool, Batch: true, Prefetch: 50,
		Handler: func(ctx context.Context, d amqp.Delivery) error { // once per message id
			_, err := idempotency.Tx(ctx).Exec(ctx, `INSERT INTO ledger (body) VALUES ($1::jsonb)`, string(d.Body))
			return err
		}})
	ctx, stop := context.WithCancel(context.Background()) // cancel (on SIGTERM) to stop gracefully
	defer stop()
	log.Fatal(c.Run(ctx, ch, "payments"))
}

// The conformance consumer of the Go package (clients/conformance/CONTRACT.md): consumes
// QUEUE with idempotency.Consumer and applies each message's effect once, an INSERT INTO
// broker_effects (message_id, consumer, amount). Configured by the environment: AMQP_URL,
// DATABASE_URL, QUEUE, CONSUMER_MODE (single, batch, two_phase), PREFETCH, CONSUMER_ID,
// CRASH_AFTER_COMMIT (after the Nth COMMIT, SIGKILL itself before the ack), IDEM_LEASE_SECONDS
// (the two-phase lease, default 30). SIGTERM stops it gracefully.
//
//	cd clients/go && ./offline.sh go build -o /tmp/conformance-consumer ./cmd/conformance-consumer
package main

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	idempotency "idempotency/clients/go"

	"github.com/jackc/pgx/v4/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

func envInt(name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		log.Fatalf("%s: %v", name, err)
	}
	return n
}

func main() {
	consumerID := os.Getenv("CONSUMER_ID")
	if consumerID == "" {
		consumerID = "go-" + strconv.Itoa(os.Getpid())
	}
	log.SetPrefix("conformance-consumer " + consumerID + ": ")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	pool, err := pgxpool.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatalf("DATABASE_URL: %v", err)
	}
	defer pool.Close()
	conn, err := amqp.Dial(os.Getenv("AMQP_URL"))
	if err != nil {
		log.Fatalf("AMQP_URL: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatalf("channel: %v", err)
	}
	defer ch.Close()

	opts := idempotency.ConsumerOptions{
		Pool:       pool,
		Prefetch:   envInt("PREFETCH", 50),
		RetryDelay: time.Second,
		Lease:      time.Duration(envInt("IDEM_LEASE_SECONDS", 30)) * time.Second,
	}
	switch mode := os.Getenv("CONSUMER_MODE"); mode {
	case "", "single":
	case "batch":
		opts.Batch = true
	case "two_phase":
		opts.Mode = idempotency.TwoPhase
	default:
		log.Fatalf("CONSUMER_MODE: %q is not single, batch or two_phase", mode)
	}
	if crashAfter := envInt("CRASH_AFTER_COMMIT", 0); crashAfter > 0 {
		commits := 0
		opts.AfterCommit = func() {
			if commits++; commits >= crashAfter {
				log.Printf("CRASH_AFTER_COMMIT=%d: killed after the COMMIT, before the ack", crashAfter)
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		}
	}
	const insert = `INSERT INTO broker_effects (message_id, consumer, amount) VALUES ($1::text, $2::text, $3::int)`
	opts.Handler = func(ctx context.Context, d amqp.Delivery) error {
		var msg struct {
			Account string `json:"account"`
			Amount  int    `json:"amount"`
		}
		if err := json.Unmarshal(d.Body, &msg); err != nil {
			return idempotency.Permanent(err) // a poison message: dead-lettered
		}
		key := idempotency.ClaimFrom(ctx).Key
		if tx := idempotency.Tx(ctx); tx != nil { // single, batch: in the claim's transaction
			_, err := tx.Exec(ctx, insert, key, consumerID, msg.Amount)
			return err
		}
		_, err := pool.Exec(ctx, insert, key, consumerID, msg.Amount) // two_phase: an outside effect
		return err
	}
	queue := os.Getenv("QUEUE")
	// READY_FILE (the broker harness): created once SIGTERM stops the consumer gracefully (the
	// context above ends Run; everything that could fail on a signal is done).
	if ready := os.Getenv("READY_FILE"); ready != "" {
		if err := os.WriteFile(ready, nil, 0o644); err != nil {
			log.Fatalf("READY_FILE: %v", err)
		}
	}
	log.Printf("consuming %s (%s, prefetch %d)", queue, os.Getenv("CONSUMER_MODE"), opts.Prefetch)
	err = idempotency.NewConsumer(opts).Run(ctx, ch, queue)
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Fatalf("%v", err)
	}
	log.Printf("stopped")
}

package idempotency

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestBrokerConsumer runs Consumer.Run on a real RabbitMQ (IDEM_TEST_AMQP_URL, say
// amqp://guest:guest@127.0.0.1:5672/; skipped without): 300 messages, 100 of them delivered
// twice, 5 reusing a key with another body and one without a key; each mode applies the 300
// once, dead-letters the 6, and stops gracefully when its context is cancelled.
func TestBrokerConsumer(t *testing.T) {
	url := os.Getenv("IDEM_TEST_AMQP_URL")
	if url == "" {
		t.Skip("no broker: set IDEM_TEST_AMQP_URL (test/suites/client_go.sh starts one)")
	}
	p := testPool(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, mode := range []string{"single", "batch", "two_phase"} {
		t.Run(mode, func(t *testing.T) {
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			defer ch.Close()
			q := "go-test-" + runID + "-" + mode
			if _, err := ch.QueueDeclare(q+".dead", false, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := ch.QueueDeclare(q, false, false, false, false, amqp.Table{
				"x-dead-letter-exchange": "", "x-dead-letter-routing-key": q + ".dead"}); err != nil {
				t.Fatal(err)
			}
			defer ch.QueueDelete(q, false, false, false)
			defer ch.QueueDelete(q+".dead", false, false, false)
			publish := func(id, body string) {
				if err := ch.PublishWithContext(context.Background(), "", q, false, false,
					amqp.Publishing{MessageId: id, ContentType: "application/json", Body: []byte(body)}); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; i < 300; i++ {
				publish(fmt.Sprintf("m%d", i), fmt.Sprintf(`{"n": %d}`, i))
			}
			for i := 0; i < 100; i++ {
				publish(fmt.Sprintf("m%d", i*3), fmt.Sprintf(`{"n":%d}`, i*3)) // the same JSON, spaced otherwise
			}
			for i := 0; i < 5; i++ {
				publish(fmt.Sprintf("m%d", i*7), `{"n": -1}`)
			}
			publish("", `{"n": 0}`)

			scope := runID + "-broker-" + mode
			opts := ConsumerOptions{Pool: p, Scope: scope, Prefetch: 40, RetryDelay: 100 * time.Millisecond, Lease: time.Minute,
				Handler: effect}
			switch mode {
			case "batch":
				opts.Batch = true
			case "two_phase":
				opts.Mode = TwoPhase
			}
			c := NewConsumer(opts)
			consumeCh, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			defer consumeCh.Close()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx, consumeCh, q) }()
			deadline := time.Now().Add(60 * time.Second)
			for {
				dead, err := ch.QueueInspect(q + ".dead")
				if err != nil {
					t.Fatal(err)
				}
				main, err := ch.QueueInspect(q)
				if err != nil {
					t.Fatal(err)
				}
				if n := effects(t, scope); n >= 300 && dead.Messages == 6 && main.Messages == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after 60 s: %d effects, %d dead-lettered, %d queued", effects(t, scope), dead.Messages, main.Messages)
				}
				time.Sleep(50 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("the graceful stop: %v", err)
			}
			var n, distinct int
			p.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT key) FROM go_client_test_effects WHERE scope = $1::text`,
				scope).Scan(&n, &distinct)
			if n != 300 || distinct != 300 {
				t.Errorf("%d effects over %d keys, want 300 over 300", n, distinct)
			}
		})
	}
}

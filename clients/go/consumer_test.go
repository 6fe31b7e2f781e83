package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// fakeAcker records what the consumer does with each delivery (the broker's side).
type fakeAcker struct {
	mu     sync.Mutex
	events []string
}

func (f *fakeAcker) add(e string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, e)
	return nil
}
func (f *fakeAcker) Ack(tag uint64, multiple bool) error {
	if multiple {
		return f.add(fmt.Sprintf("ack<=%d", tag))
	}
	return f.add(fmt.Sprintf("ack %d", tag))
}
func (f *fakeAcker) Nack(tag uint64, multiple, requeue bool) error {
	return f.add(fmt.Sprintf("nack %d requeue=%v", tag, requeue))
}
func (f *fakeAcker) Reject(tag uint64, requeue bool) error {
	return f.add(fmt.Sprintf("reject %d requeue=%v", tag, requeue))
}
func (f *fakeAcker) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.events, ", ")
}

// deliveries: messages "id:body" with tags from 1.
func deliveries(acker amqp.Acknowledger, msgs ...string) []amqp.Delivery {
	var ds []amqp.Delivery
	for i, m := range msgs {
		id, body, _ := strings.Cut(m, ":")
		ds = append(ds, amqp.Delivery{Acknowledger: acker, DeliveryTag: uint64(i + 1), MessageId: id, Body: []byte(body)})
	}
	return ds
}

func TestMessageKey(t *testing.T) {
	d := amqp.Delivery{MessageId: "m-1"}
	if MessageKey(d) != "m-1" {
		t.Error("message id")
	}
	d.Headers = amqp.Table{"Idempotency-Key": "k-1"}
	if MessageKey(d) != "k-1" {
		t.Error("the producer's header first")
	}
	d.Headers = amqp.Table{"Idempotency-Key": []byte("k-2")}
	if MessageKey(d) != "k-2" {
		t.Error("a bytes header")
	}
	if MessageKey(amqp.Delivery{DeliveryTag: 7}) != "" {
		t.Error("the delivery tag is never a key")
	}
}

func TestAckManyStopsBelowHeld(t *testing.T) {
	f := &fakeAcker{}
	c := &Consumer{pending: map[uint64]*heldDelivery{}}
	c.pending[4] = &heldDelivery{}
	c.ackMany(f, []uint64{5, 1, 3, 2, 7})
	if f.String() != "ack<=3, ack 5, ack 7" {
		t.Errorf("acks: %s", f)
	}
	f = &fakeAcker{}
	delete(c.pending, 4)
	c.ackMany(f, []uint64{2, 9, 4})
	if f.String() != "ack<=9" {
		t.Errorf("acks: %s", f)
	}
}

// consumerEffects: an effect table for the consumer tests, counted per scope.
func consumer(t *testing.T, mode Mode, batch bool, h MessageHandler) (*Consumer, string) {
	p := testPool(t)
	scope := runID + "-" + t.Name()
	c := NewConsumer(ConsumerOptions{Pool: p, Scope: scope, Mode: mode, Batch: batch, RetryDelay: time.Hour, Lease: time.Minute, Handler: h})
	return c, scope
}

// effect: the message's effect, through the claim's transaction (inbox) or the pool.
func effect(ctx context.Context, d amqp.Delivery) error {
	c := ClaimFrom(ctx)
	q := `INSERT INTO go_client_test_effects (scope, key, note) VALUES ($1::text, $2::text, $3::text)`
	if tx := Tx(ctx); tx != nil {
		_, err := tx.Exec(ctx, q, c.Scope, c.Key, string(d.Body))
		return err
	}
	_, err := pool.Exec(ctx, q, c.Scope, c.Key, string(d.Body))
	return err
}

func TestConsumerSingle(t *testing.T) {
	for _, mode := range []Mode{Inbox, TwoPhase} {
		t.Run(mode.String(), func(t *testing.T) {
			f := &fakeAcker{}
			c, scope := consumer(t, mode, false, effect)
			ds := deliveries(f, `m1:{"a": 1, "b": 2}`, `m1:{"b":2,"a":1}`, `m1:{"a": 1, "b": 3}`, `m2:binary\x00`, `:no key`)
			c.Handle(context.Background(), ds)
			c.Handle(context.Background(), deliveries(f, `m2:binary\x00`)) // a redelivery
			want := "ack 1, ack 2, reject 3 requeue=false, ack 4, reject 5 requeue=false, ack 1"
			if f.String() != want {
				t.Errorf("broker saw %s\nwant %s", f, want)
			}
			if n := effects(t, scope); n != 2 {
				t.Errorf("%d effects, want 2", n)
			}
		})
	}
}

func TestConsumerBatch(t *testing.T) {
	f := &fakeAcker{}
	c, scope := consumer(t, Inbox, true, effect)
	c.Handle(context.Background(), deliveries(f, `old:{"x":0}`))
	f.events = nil
	ds := deliveries(f, `a:{"x":1}`, `b:{"x":2}`, `a:{"x":1}`, `b:{"x":20}`, `old:{"x":0}`, `c:{"x":3}`)
	c.Handle(context.Background(), ds)
	// The mismatch is dead-lettered first, then one multiple ack takes the rest.
	if want := "reject 4 requeue=false, ack<=6"; f.String() != want {
		t.Errorf("broker saw %s, want %s", f, want)
	}
	if n := effects(t, scope); n != 4 {
		t.Errorf("%d effects, want 4 (old, a, b, c)", n)
	}
	// Redelivered: every key was completed, so all replay (acked, no effect).
	f.events = nil
	c.Handle(context.Background(), deliveries(f, `c:{"x":3}`, `a:{"x":1}`, `b:{"x":2}`))
	if want := "ack<=3"; f.String() != want || effects(t, scope) != 4 || c.lowestHeld() != 0 {
		t.Errorf("redelivered: broker saw %s, want %s; %d effects", f, want, effects(t, scope))
	}
}

func TestConsumerBatchHandlerFails(t *testing.T) {
	f := &fakeAcker{}
	calls := 0
	c, scope := consumer(t, Inbox, true, func(ctx context.Context, d amqp.Delivery) error {
		calls++
		if string(d.Body) == "poison" {
			return Permanent(errors.New("cannot apply"))
		}
		if string(d.Body) == "later" {
			return errors.New("not now")
		}
		return effect(ctx, d)
	})
	c.Handle(context.Background(), deliveries(f, "p:ok", "q:poison", "r:later", "s:ok"))
	// The batch rolled back and ran one by one: ok, dead-lettered, held for a requeue, ok.
	if want := "ack 1, reject 2 requeue=false, ack 4"; f.String() != want {
		t.Errorf("broker saw %s, want %s", f, want)
	}
	if n := effects(t, scope); n != 2 {
		t.Errorf("%d effects, want 2", n)
	}
	if c.lowestHeld() != 3 || c.pending[3].delay != time.Hour {
		t.Errorf("r is not held for its requeue after RetryDelay")
	}
	c.flushPending()
	c.Wait()
	if !strings.HasSuffix(f.String(), "nack 3 requeue=true") {
		t.Errorf("broker saw %s", f)
	}
}

func TestConsumerInProgressWaitsRetryAfter(t *testing.T) {
	f := &fakeAcker{}
	c, scope := consumer(t, Inbox, false, effect)
	// Another consumer holds m (its transaction is open).
	ctx := context.Background()
	tx, err := testPool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT idempotency.claim_key('m'::text, NULL::bytea, $1::text)`, scope); err != nil {
		t.Fatal(err)
	}
	c.Handle(ctx, deliveries(f, "m:x"))
	if f.String() != "" || c.lowestHeld() != 1 || c.pending[1].delay < time.Second {
		t.Fatalf("in_progress: broker saw %q, held %v", f, c.pending)
	}
	tx.Rollback(ctx)
	c.flushPending() // a graceful stop requeues it at once
	if f.String() != "nack 1 requeue=true" {
		t.Errorf("broker saw %s", f)
	}
	f.events = nil
	c.Handle(ctx, deliveries(f, "m:x")) // the redelivery
	if f.String() != "ack 1" || effects(t, scope) != 1 {
		t.Errorf("redelivery: %s, %d effects", f, effects(t, scope))
	}
}

func TestConsumerTwoPhaseReleaseAndCheckpoint(t *testing.T) {
	f := &fakeAcker{}
	var seen []string
	c, scope := consumer(t, TwoPhase, false, func(ctx context.Context, d amqp.Delivery) error {
		cl := ClaimFrom(ctx)
		seen = append(seen, cl.Status+":"+cl.RecoveryPoint)
		if Tx(ctx) != nil {
			return errors.New("a transaction in two-phase mode")
		}
		if len(seen) == 1 {
			if err := Checkpoint(ctx, "step-1"); err != nil {
				return Permanent(err)
			}
			return errors.New("the gateway timed out")
		}
		return effect(ctx, d)
	})
	c.Handle(context.Background(), deliveries(f, "t:x"))
	c.flushPending()
	c.Handle(context.Background(), deliveries(f, "t:x"))
	c.Handle(context.Background(), deliveries(f, "t:x"))
	if want := "nack 1 requeue=true, ack 1, ack 1"; f.String() != want {
		t.Errorf("broker saw %s, want %s", f, want)
	}
	if strings.Join(seen, ",") != "claimed:,reclaimed:step-1" || effects(t, scope) != 1 {
		t.Errorf("handler saw %v; %d effects", seen, effects(t, scope))
	}
}

func TestConsumerBadKeyDeadLetteredDatabaseErrorRequeued(t *testing.T) {
	for _, batch := range []bool{false, true} {
		f := &fakeAcker{}
		c, scope := consumer(t, Inbox, batch, effect)
		long := strings.Repeat("k", 300) // over max_key_length: 22001
		c.Handle(context.Background(), deliveries(f, "ok1:x", long+":x", "ok2:x"))
		want := map[bool]string{false: "ack 1, reject 2 requeue=false, ack 3", true: "ack 1, reject 2 requeue=false, ack 3"}[batch]
		if f.String() != want || effects(t, scope) != 2 {
			t.Errorf("batch %v: broker saw %s, want %s; %d effects", batch, f, want, effects(t, scope))
		}
		// The database cannot be reached (here: a cancelled context): requeued after RetryDelay.
		f = &fakeAcker{}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		c.Handle(ctx, deliveries(f, "d1:x", "d2:x"))
		if f.String() != "" || c.lowestHeld() != 1 || len(c.pending) != 2 || c.pending[2].delay != time.Hour {
			t.Errorf("batch %v: a database error: broker saw %q, held %d", batch, f, len(c.pending))
		}
		c.flushPending()
		if f.String() != "nack 1 requeue=true, nack 2 requeue=true" && f.String() != "nack 2 requeue=true, nack 1 requeue=true" {
			t.Errorf("broker saw %s", f)
		}
		_ = scope
	}
}

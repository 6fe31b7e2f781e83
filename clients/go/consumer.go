package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

// MessageHandler applies one message's effect. In Inbox mode its writes go through
// Tx(ctx), the claim's transaction, and commit with the key; in TwoPhase mode the claim has
// committed before it runs (ClaimFrom(ctx) and Checkpoint(ctx, ...) work in both). An error
// rolls the message back (Inbox) or releases its key (TwoPhase), and the message is requeued
// after ConsumerOptions.RetryDelay; a Permanent error dead-letters it instead.
type MessageHandler func(ctx context.Context, d amqp.Delivery) error

// ConsumerOptions configure a Consumer. Pool and Handler are required.
type ConsumerOptions struct {
	Pool    *pgxpool.Pool
	Handler MessageHandler
	// Scope: the key space of this consumer's messages ("" by default).
	Scope string
	// Mode: Inbox (the handler runs in the claim's transaction) or TwoPhase (claim and
	// COMMIT, call the handler, complete; release on a failure).
	Mode Mode
	// Batch (Inbox only): claim_keys over up to Prefetch deliveries, the handlers, one
	// complete_keys, one COMMIT, one multiple ack.
	Batch bool
	// Prefetch: the channel's prefetch and the largest batch (50 when 0).
	Prefetch int
	// BatchWait: how long a batch waits for more deliveries once it has one (20 ms when 0).
	BatchWait time.Duration
	// TTL and Lease of the keys (the server's defaults when 0).
	TTL, Lease time.Duration
	// RetryDelay: how long a message waits before it is requeued after a database or
	// handler error (1 s when 0): no hot loop.
	RetryDelay time.Duration
	// Fingerprint overrides the message fingerprint. By default a JSON body is fingerprinted
	// as jsonb (request_fingerprint($1::jsonb)), any other body as its SHA-256.
	Fingerprint func(d amqp.Delivery) ([]byte, error)
	// AfterCommit, when set, is called after each COMMIT that completed keys and before the
	// acks (a test hook: a crash there is a redelivery of committed messages).
	AfterCommit func()
	// Logger (log.Default() when nil).
	Logger *log.Logger
}

// Permanent marks a handler error as permanent: the message is rejected without requeue
// (dead-lettered) instead of retried.
func Permanent(err error) error { return permanentError{err} }

type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

// IsPermanent: err was marked with Permanent.
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// handlerError: the handler failed (not the database).
type handlerError struct{ error }

func (e handlerError) Unwrap() error { return e.error }

// MessageKey is a delivery's idempotency key: its Idempotency-Key header when the producer
// set one, else its message id; never the delivery tag (a redelivery gets a new one). ""
// when it has neither: such a message cannot be deduplicated and is dead-lettered.
func MessageKey(d amqp.Delivery) string {
	switch v := d.Headers["Idempotency-Key"].(type) {
	case string:
		if v != "" {
			return v
		}
	case []byte:
		if len(v) > 0 {
			return string(v)
		}
	}
	return d.MessageId
}

// badInput: the database refused the message's key or fingerprint (SQLSTATE class 22: a key
// over idempotency.max_key_length, say): no retry can succeed, so it is dead-lettered.
func badInput(err error) bool {
	var he handlerError
	return !errors.As(err, &he) && strings.HasPrefix(SQLState(err), "22")
}

// Consumer applies each message's effect once over an at-least-once broker.
type Consumer struct {
	o       ConsumerOptions
	mu      sync.Mutex
	pending map[uint64]*heldDelivery // deliveries held for a delayed requeue
	wg      sync.WaitGroup
}

// NewConsumer returns a Consumer; run it with Run (or feed it deliveries with Handle).
func NewConsumer(opts ConsumerOptions) *Consumer {
	if opts.Pool == nil || opts.Handler == nil {
		panic("idempotency.NewConsumer: Pool and Handler are required")
	}
	if opts.Prefetch <= 0 {
		opts.Prefetch = 50
	}
	if opts.BatchWait <= 0 {
		opts.BatchWait = 20 * time.Millisecond
	}
	if opts.RetryDelay <= 0 {
		opts.RetryDelay = time.Second
	}
	if opts.Mode == TwoPhase {
		opts.Batch = false
	}
	return &Consumer{o: opts, pending: map[uint64]*heldDelivery{}}
}

func (c *Consumer) logf(format string, args ...any) {
	if c.o.Logger != nil {
		c.o.Logger.Printf(format, args...)
	} else {
		log.Printf(format, args...)
	}
}

// Run consumes queue on ch with manual acks until ctx is done (then it stops gracefully: no
// new deliveries, the batch in hand finishes, the deliveries not started and those waiting
// for a requeue are requeued at once) or the channel closes (an error). The caller closes
// the channel and the connection afterwards.
func (c *Consumer) Run(ctx context.Context, ch *amqp.Channel, queue string) error {
	if err := ch.Qos(c.o.Prefetch, 0, false); err != nil {
		return err
	}
	tag := fmt.Sprintf("idempotency-%d", time.Now().UnixNano())
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return err
	}
	// Handlers run to the end of the batch in hand even when ctx is done.
	work := context.Background()
	for {
		if ctx.Err() != nil { // a stop wins over deliveries already waiting
			return c.stop(ch, tag, deliveries)
		}
		var d amqp.Delivery
		var ok bool
		select {
		case <-ctx.Done():
			return c.stop(ch, tag, deliveries)
		case d, ok = <-deliveries:
			if !ok {
				c.flushPending()
				return errors.New("idempotency: the delivery channel closed")
			}
		}
		batch := []amqp.Delivery{d}
		if c.o.Batch {
			timer := time.NewTimer(c.o.BatchWait)
		fill:
			for len(batch) < c.o.Prefetch {
				select {
				case d, ok = <-deliveries:
					if !ok {
						break fill
					}
					batch = append(batch, d)
				case <-timer.C:
					break fill
				case <-ctx.Done():
					break fill
				}
			}
			timer.Stop()
		}
		c.Handle(work, batch)
	}
}

// stop: cancel the consumer, requeue what was delivered and not started, and the held ones.
func (c *Consumer) stop(ch *amqp.Channel, tag string, deliveries <-chan amqp.Delivery) error {
	err := ch.Cancel(tag, false)
	if err == nil {
		for d := range deliveries { // closed once the server confirmed the cancel
			d.Nack(false, true)
		}
	}
	c.flushPending()
	return err
}

// Handle processes deliveries: one at a time, or as one batch (ConsumerOptions.Batch). Every
// delivery is acked, rejected or requeued (now or after a delay) when it returns.
func (c *Consumer) Handle(ctx context.Context, deliveries []amqp.Delivery) {
	if c.o.Batch && len(deliveries) > 1 {
		c.batch(ctx, deliveries)
		return
	}
	for _, d := range deliveries {
		c.single(ctx, d)
	}
}

// Wait returns once no delivery is held for a delayed requeue any more.
func (c *Consumer) Wait() { c.wg.Wait() }

// requeueAfter holds d and requeues it after delay (the no-hot-loop requeue of in_progress
// and failed messages).
func (c *Consumer) requeueAfter(d amqp.Delivery, delay time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wg.Add(1)
	h := &heldDelivery{d: d, delay: delay}
	c.pending[d.DeliveryTag] = h
	h.timer = time.AfterFunc(delay, func() { c.release(d.DeliveryTag) })
}

// heldDelivery: a delivery waiting for its requeue.
type heldDelivery struct {
	d     amqp.Delivery
	delay time.Duration
	timer *time.Timer
}

// release requeues a held delivery (once).
func (c *Consumer) release(tag uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h, held := c.pending[tag]; held {
		delete(c.pending, tag)
		h.timer.Stop()
		h.d.Nack(false, true)
		c.wg.Done()
	}
}

// flushPending requeues every held delivery now.
func (c *Consumer) flushPending() {
	c.mu.Lock()
	tags := make([]uint64, 0, len(c.pending))
	for tag := range c.pending {
		tags = append(tags, tag)
	}
	c.mu.Unlock()
	for _, tag := range tags {
		c.release(tag)
	}
}

// lowestHeld: the lowest delivery tag held for a requeue (0 when none).
func (c *Consumer) lowestHeld() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var low uint64
	for tag := range c.pending {
		if low == 0 || tag < low {
			low = tag
		}
	}
	return low
}

func (c *Consumer) fingerprint(d amqp.Delivery) (fingerprint, error) {
	if c.o.Fingerprint != nil {
		b, err := c.o.Fingerprint(d)
		return fingerprint{bytes: b}, err
	}
	if json.Valid(d.Body) {
		s := string(d.Body)
		return fingerprint{json: &s}, nil
	}
	sum := sha256.Sum256(d.Body)
	return fingerprint{bytes: sum[:]}, nil
}

// outcome: what becomes of a delivery once the transaction is over.
type outcome int

const (
	ack outcome = iota
	reject
	requeue
)

func (c *Consumer) retryAfter(r claimResult) time.Duration {
	if r.retryAfter != nil && *r.retryAfter > 1 {
		return time.Duration(*r.retryAfter) * time.Second
	}
	return time.Second
}

func (c *Consumer) claimOptions() *Options {
	return &Options{Pool: c.o.Pool, TTL: c.o.TTL, Lease: c.o.Lease, Logger: c.o.Logger}
}

// single: one delivery in one transaction (Inbox) or claim, call, complete (TwoPhase).
func (c *Consumer) single(ctx context.Context, d amqp.Delivery) {
	key := MessageKey(d)
	if key == "" {
		c.logf("idempotency: message without a message id or Idempotency-Key header: dead-lettered")
		d.Reject(false)
		return
	}
	fp, err := c.fingerprint(d)
	if err != nil {
		c.logf("idempotency: fingerprint of %q: %v: dead-lettered", key, err)
		d.Reject(false)
		return
	}
	var r claimResult
	if c.o.Mode == TwoPhase {
		err = c.twoPhase(ctx, d, key, fp, &r)
	} else {
		err = retry(func() error { return c.inbox(ctx, d, key, fp, &r) })
	}
	c.settle(d, key, r, err)
}

// settle acks, rejects or requeues d after its claim r (and err).
func (c *Consumer) settle(d amqp.Delivery, key string, r claimResult, err error) {
	var he handlerError
	switch {
	case errors.As(err, &he) && IsPermanent(err):
		c.logf("idempotency: message %q failed for good: %v: dead-lettered", key, err)
		d.Reject(false)
	case badInput(err):
		c.logf("idempotency: message %q refused by the database: %v: dead-lettered", key, err)
		d.Reject(false)
	case err != nil:
		c.logf("idempotency: message %q: %v: requeued in %v", key, err, c.o.RetryDelay)
		c.requeueAfter(d, c.o.RetryDelay)
	case r.status == "mismatch":
		c.logf("idempotency: message %q reuses a key with another body: dead-lettered", key)
		d.Reject(false)
	case r.status == "in_progress":
		c.requeueAfter(d, c.retryAfter(r))
	default: // claimed and completed, or replay
		d.Ack(false)
	}
}

func (c *Consumer) inbox(ctx context.Context, d amqp.Delivery, key string, fp fingerprint, r *claimResult) error {
	tx, err := c.o.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background())
	o := c.claimOptions()
	if *r, err = o.claim(ctx, tx, key, c.o.Scope, fp, seconds(c.o.Lease)); err != nil {
		return err
	}
	if r.status != "claimed" && r.status != "reclaimed" {
		return tx.Commit(ctx)
	}
	cl := c.newClaim(key, *r, tx)
	if err := c.o.Handler(context.WithValue(ctx, claimKey{}, cl), d); err != nil {
		return handlerError{err}
	}
	if _, err := tx.Exec(ctx, `SELECT idempotency.complete_key($1::text, $2::uuid, NULL::jsonb, NULL::int, $3::text)`,
		key, cl.Token, c.o.Scope); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	c.committed()
	return nil
}

func (c *Consumer) committed() {
	if c.o.AfterCommit != nil {
		c.o.AfterCommit()
	}
}

func (c *Consumer) newClaim(key string, r claimResult, tx pgx.Tx) *Claim {
	cl := &Claim{Key: key, Scope: c.o.Scope, Status: r.status, tx: tx, pool: c.o.Pool, lease: seconds(c.o.Lease)}
	if r.token != nil {
		cl.Token = *r.token
	}
	if r.attempts != nil {
		cl.Attempts = int(*r.attempts)
	}
	if r.recoveryPoint != nil {
		cl.RecoveryPoint = *r.recoveryPoint
	}
	return cl
}

func (c *Consumer) twoPhase(ctx context.Context, d amqp.Delivery, key string, fp fingerprint, r *claimResult) error {
	o := c.claimOptions()
	if err := retry(func() (err error) {
		*r, err = o.claim(ctx, c.o.Pool, key, c.o.Scope, fp, seconds(c.o.Lease))
		return err
	}); err != nil {
		return err
	}
	if r.status != "claimed" && r.status != "reclaimed" {
		return nil
	}
	cl := c.newClaim(key, *r, nil)
	if err := c.o.Handler(context.WithValue(ctx, claimKey{}, cl), d); err != nil {
		if rerr := retry(func() error {
			_, err := c.o.Pool.Exec(ctx, `SELECT idempotency.release_key($1::text, $2::uuid, $3::text)`, key, cl.Token, c.o.Scope)
			return err
		}); rerr != nil {
			c.logf("idempotency: release of %q: %v (reclaimed when its lease ends)", key, rerr)
		}
		return handlerError{err}
	}
	if err := retry(func() error {
		_, err := c.o.Pool.Exec(ctx, `SELECT idempotency.complete_key($1::text, $2::uuid, NULL::jsonb, NULL::int, $3::text)`,
			key, cl.Token, c.o.Scope)
		return err
	}); err != nil {
		// The effect is done but not recorded: requeued, the message is in_progress until the
		// lease ends, then reclaimed with the last checkpoint.
		return err
	}
	c.committed()
	return nil
}

// batch: claim_keys over the deliveries, the handlers of the claimed ones, complete_keys, one
// COMMIT, then the rejects, the delayed requeues and one multiple ack. A handler error rolls
// the batch back and its deliveries are handled one by one.
func (c *Consumer) batch(ctx context.Context, ds []amqp.Delivery) {
	var keyed []amqp.Delivery
	var keys []string
	var jsons []*string
	var bytesFps [][]byte
	for _, d := range ds {
		key := MessageKey(d)
		fp, err := c.fingerprint(d)
		if key == "" || err != nil {
			c.logf("idempotency: message without a usable key or fingerprint (%v): dead-lettered", err)
			d.Reject(false)
			continue
		}
		keyed = append(keyed, d)
		keys = append(keys, key)
		jsons = append(jsons, fp.json)
		bytesFps = append(bytesFps, fp.bytes)
	}
	if len(keyed) == 0 {
		return
	}
	var results []claimResult
	err := retry(func() (err error) {
		results, err = c.batchAttempt(ctx, keyed, keys, jsons, bytesFps)
		return err
	})
	var he handlerError
	if errors.As(err, &he) || badInput(err) {
		c.logf("idempotency: a batch of %d failed (%v): one by one", len(keyed), err)
		for _, d := range keyed {
			c.single(ctx, d)
		}
		return
	}
	if err != nil {
		c.logf("idempotency: batch of %d: %v: requeued in %v", len(keyed), err, c.o.RetryDelay)
		for _, d := range keyed {
			c.requeueAfter(d, c.o.RetryDelay)
		}
		return
	}
	var acks []uint64
	for i, d := range keyed {
		switch r := results[i]; r.status {
		case "mismatch":
			c.settle(d, keys[i], r, nil)
		case "in_progress":
			if r.token == nil { // held by another consumer
				c.settle(d, keys[i], r, nil)
				continue
			}
			acks = append(acks, d.DeliveryTag) // a repeat of a message this batch completed
		default:
			acks = append(acks, d.DeliveryTag)
		}
	}
	c.ackMany(keyed[0].Acknowledger, acks)
}

// ackMany acks tags with one multiple ack up to the highest tag below any delivery held for
// a requeue (a multiple ack must not take those), and single acks for the rest.
func (c *Consumer) ackMany(acker amqp.Acknowledger, tags []uint64) {
	if len(tags) == 0 {
		return
	}
	sort.Slice(tags, func(i, j int) bool { return tags[i] < tags[j] })
	held := c.lowestHeld()
	upTo := -1
	for i, t := range tags {
		if held != 0 && t > held {
			break
		}
		upTo = i
	}
	if upTo >= 0 {
		acker.Ack(tags[upTo], true)
	}
	for _, t := range tags[upTo+1:] {
		acker.Ack(t, false)
	}
}

// batchAttempt: one transaction over the batch. A repeat of a key claimed earlier in the
// batch answers in_progress; its result is marked with a token so that batch() acks it.
func (c *Consumer) batchAttempt(ctx context.Context, ds []amqp.Delivery, keys []string, jsons []*string, fps [][]byte) ([]claimResult, error) {
	tx, err := c.o.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.Background())
	rows, err := tx.Query(ctx, `SELECT status::text, token::text, ceil(extract(epoch FROM retry_after))::int
  FROM idempotency.claim_keys($1::text[],
         ARRAY(SELECT CASE WHEN j IS NULL THEN b ELSE idempotency.request_fingerprint(j::jsonb) END
                 FROM unnest($2::text[], $3::bytea[]) WITH ORDINALITY AS u(j, b, i) ORDER BY i),
         $4::text, ttl => $5::float8 * interval '1 second', lease => $6::float8 * interval '1 second')
 ORDER BY ordinality`, keys, jsons, fps, c.o.Scope, seconds(c.o.TTL), seconds(c.o.Lease))
	if err != nil {
		return nil, err
	}
	results := make([]claimResult, 0, len(ds))
	for rows.Next() {
		var r claimResult
		if err := rows.Scan(&r.status, &r.token, &r.retryAfter); err != nil {
			rows.Close()
			return nil, err
		}
		results = append(results, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(results) != len(ds) {
		return nil, fmt.Errorf("idempotency: claim_keys answered %d rows for %d keys", len(results), len(ds))
	}
	var doneKeys, doneTokens []string
	claimedHere := map[string]bool{}
	for i, d := range ds {
		r := &results[i]
		switch r.status {
		case "claimed", "reclaimed":
			if err := c.o.Handler(context.WithValue(ctx, claimKey{}, c.newClaim(keys[i], *r, tx)), d); err != nil {
				return nil, handlerError{err}
			}
			doneKeys = append(doneKeys, keys[i])
			doneTokens = append(doneTokens, *r.token)
			claimedHere[keys[i]] = true
		case "in_progress":
			if claimedHere[keys[i]] {
				mark := "repeat"
				r.token = &mark
			}
		}
	}
	if len(doneKeys) > 0 {
		if _, err := tx.Exec(ctx, `SELECT count(*) FROM idempotency.complete_keys($1::text[], $2::uuid[],
		       array_fill(NULL::jsonb, ARRAY[cardinality($1::text[])]), scope => $3::text)`,
			doneKeys, doneTokens, c.o.Scope); err != nil {
			return nil, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	if len(doneKeys) > 0 {
		c.committed()
	}
	return results, nil
}

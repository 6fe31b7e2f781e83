package idempotency

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgconn"
)

// Retries is how many times a transaction that failed with a serialization failure (40001),
// a deadlock (40P01) or Citus' transient "cannot execute a distributed query from a query on
// a shard" is run again before the caller gets the error.
const Retries = 3

// SQLState is the SQLSTATE of err, or "" when it is not a server error.
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Retryable: err is worth running the whole transaction again for, at once.
func Retryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "40001", "40P01":
		return true
	case "XX000": // Citus, narrowly by its message
		return strings.Contains(pgErr.Message, "cannot execute a distributed query from a query on a shard")
	}
	return false
}

// Unavailable: the database cannot be reached now (connection lost or refused, the server
// shutting down, a timeout): answer 503 and let the client retry later.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if code := SQLState(err); code != "" {
		return strings.HasPrefix(code, "08") || strings.HasPrefix(code, "57P0") || code == "53300"
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	var netErr net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &netErr) ||
		pgconn.Timeout(err) || pgconn.SafeToRetry(err) || errors.Is(err, context.DeadlineExceeded) ||
		strings.Contains(err.Error(), "failed to connect") || strings.Contains(err.Error(), "conn closed")
}

// retry runs attempt until it succeeds, fails with an error that is not Retryable, or has
// run 1 + Retries times.
func retry(attempt func() error) error {
	var err error
	for i := 0; i <= Retries; i++ {
		if err = attempt(); err == nil || !Retryable(err) {
			return err
		}
	}
	return err
}

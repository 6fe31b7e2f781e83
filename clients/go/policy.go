package idempotency

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Policy is the published Idempotency-Key policy: what clients must send and how long a key
// is kept (its ttl: a retry after that runs afresh).
type Policy struct {
	Header      string   `json:"header"`
	RequiredFor []string `json:"required_for"`
	MaxLength   int      `json:"max_length"`
	TTLSeconds  int64    `json:"ttl_seconds"`
}

// PolicyHandler serves the policy document (application/json) at the URL given as
// Options.PolicyURL: {"header": "Idempotency-Key", "required_for": ["POST", "PATCH"],
// "max_length": 255, "ttl_seconds": N}. N is Options.TTL, or the server's
// idempotency.default_ttl (read once) when that is 0.
func PolicyHandler(opts Options) http.Handler {
	o := opts
	var once sync.Once
	var ttl int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() {
			ttl = int64(o.TTL / time.Second)
			if ttl > 0 || o.Pool == nil {
				return
			}
			ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
			defer cancel()
			ttl = 86400 // the extension's own default
			var s float64
			if err := o.Pool.QueryRow(ctx,
				`SELECT extract(epoch FROM current_setting('idempotency.default_ttl')::interval)::float8`).Scan(&s); err == nil {
				ttl = int64(s)
			}
		})
		body, _ := json.Marshal(Policy{Header: "Idempotency-Key", RequiredFor: o.requiredFor(), MaxLength: MaxKeyLength, TTLSeconds: ttl})
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	})
}

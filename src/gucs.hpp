// The configuration parameters (GUCs) of the extension, all under "idempotency.".
#pragma once

namespace idem::gucs {

// Defined once per process, from _PG_init.
void define();

// Read by the claim protocol (seconds / bytes); reloadable, validated by PostgreSQL.
extern int default_ttl_seconds;
extern int default_lease_seconds;
extern int max_key_length;
extern int max_response_size;

// Read by the cleanup worker.
extern int cleanup_interval_ms;
extern int cleanup_batch_size;
extern int cleanup_delay_ms;  // pause of the worker after each batch
extern char* databases;       // comma-separated list, empty = every database

}  // namespace idem::gucs

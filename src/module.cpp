// The shared library's entry: module magic and _PG_init, which wires the parts together.
#include "citus_guard.hpp"
#include "claim_result.hpp"
#include "own_claims.hpp"
#include "cleanup_shared.hpp"
#include "cleanup_worker.hpp"
#include "gucs.hpp"
#include "key_layout.hpp"
#include "key_store.hpp"
#include "key_wait.hpp"
#include "pg_boundary.hpp"
#include "result_scan.hpp"
#include "stats.hpp"

extern "C" {
PG_MODULE_MAGIC;

void _PG_init(void);
void _PG_init(void) {
  idem::gucs::define();
  idem::claim_result::on_load();
  idem::own_claims::on_load();
  idem::key_layout::on_load();
  idem::key_store::on_load();
  idem::citus_guard::install_if_citus();
  idem::key_wait::on_load();
  idem::result_scan::on_load();
  // Shared memory and the background worker exist only when the postmaster loads us.
  if (process_shared_preload_libraries_in_progress) {
    idem::stats::install_shared_memory_hooks();
    idem::cleanup_shared::install();
    idem::key_wait::install_shared_memory_hooks();
    idem::cleanup_worker::register_launcher();
  }
}
}

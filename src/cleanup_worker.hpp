// The cleanup background worker: a launcher (cleanup_launcher.cpp) that serves every database
// with the extension, one short-lived database worker at a time per database
// (cleanup_worker.cpp).
#pragma once

#include "pg.hpp"

namespace idem::cleanup_worker {

// Registers the launcher; called from _PG_init under shared_preload_libraries.
void register_launcher();

// How the launcher registers a database worker: the library, the entry point and the
// backend_type, and what it is started with in bgw_extra (bgw_main_arg: the registry entry).
constexpr const char* kLibrary = "idempotency";
constexpr const char* kDatabaseMain = "idempotency_cleanup_database_main";
constexpr const char* kWorkerType = "idempotency cleanup";
struct Registration {
  Oid database;
  uint64 ticket;
};
static_assert(sizeof(Registration) <= BGW_EXTRALEN, "bgw_extra too small");

}  // namespace idem::cleanup_worker

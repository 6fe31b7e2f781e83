// The cleanup background worker: a launcher that serves every database with the extension.
#pragma once

namespace idem::cleanup_worker {

// Registers the launcher; called from _PG_init under shared_preload_libraries.
void register_launcher();

}  // namespace idem::cleanup_worker

// The claim protocol: claim_key, complete_key, release_key, checkpoint_key.
#pragma once

namespace idem::claim_protocol {

// Per-process set-up (transaction callback); called from _PG_init.
void on_load();

}  // namespace idem::claim_protocol

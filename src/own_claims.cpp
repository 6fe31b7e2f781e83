// The claims of the current transaction (own_claims.hpp).
#include "own_claims.hpp"
#include "pg/memory.hpp"

namespace idem::own_claims {
namespace {

// The first claims of a transaction live in a small array (the common case: a few per
// transaction, nothing to allocate or clear); a batch's further claims in a hash table in
// TopTransactionContext (accounted, and gone with the transaction), up to kOwnClaimsKept in
// all. A claim not remembered is completed by the executor path.
constexpr size_t kOwnClaimsInArray = 64;
constexpr size_t kOwnClaimsKept = 100000;
std::array<OwnClaim, kOwnClaimsInArray> own_claims;
size_t own_claim_count = 0;
HTAB* more_own_claims = nullptr;  // entries: OwnClaim, keyed by its token (the first field)
size_t more_own_claim_count = 0;

// The hash table goes with TopTransactionContext.
void forget_own_claims(XactEvent, void*) {
  own_claim_count = 0;
  more_own_claims = nullptr;
  more_own_claim_count = 0;
}

// A subtransaction rolled back takes its claims with it (and their rows' space may be
// reused or truncated away). Every claim made since it began has an id at least its own.
// pg-frame: a subtransaction callback, called by PostgreSQL (owns no C++ object).
void forget_rolled_back_claims(SubXactEvent event, SubTransactionId rolled_back, SubTransactionId,
                               void*) {
  if (event != SUBXACT_EVENT_ABORT_SUB) return;
  size_t kept = 0;
  for (size_t i = 0; i < own_claim_count; ++i)
    if (own_claims[i].subtransaction < rolled_back) own_claims[kept++] = own_claims[i];
  own_claim_count = kept;
  if (more_own_claims == nullptr) return;
  HASH_SEQ_STATUS scan;
  hash_seq_init(&scan, more_own_claims);
  while (auto* entry = static_cast<OwnClaim*>(hash_seq_search(&scan))) {
    if (entry->subtransaction < rolled_back) continue;
    (void)hash_search(more_own_claims, &entry->token, HASH_REMOVE, nullptr);
    --more_own_claim_count;
  }
}

}  // namespace

void remember(const pg_uuid_t& token, const Interval& ttl, const key_store::RowAddress& where) {
  const OwnClaim claim{token, ttl, where, GetCurrentSubTransactionId()};
  if (own_claim_count < kOwnClaimsInArray) {
    own_claims[own_claim_count++] = claim;
    return;
  }
  if (own_claim_count + more_own_claim_count >= kOwnClaimsKept) return;
  if (more_own_claims == nullptr)
    more_own_claims =
        pg::memory::new_blob_table("idempotency claims of this transaction", 1024,
                                   sizeof(pg_uuid_t), sizeof(OwnClaim), TopTransactionContext);
  bool found = false;
  auto* entry = static_cast<OwnClaim*>(pg::memory::enter(more_own_claims, &token, &found));
  *entry = claim;
  if (!found) ++more_own_claim_count;
}

const OwnClaim* find(const pg_uuid_t& token) {
  for (size_t i = 0; i < own_claim_count; ++i)
    if (memcmp(own_claims[i].token.data, token.data, UUID_LEN) == 0) return &own_claims[i];
  if (more_own_claims == nullptr) return nullptr;
  return static_cast<const OwnClaim*>(pg::memory::find(more_own_claims, &token));
}

void on_load() {
  RegisterXactCallback(forget_own_claims, nullptr);
  RegisterSubXactCallback(forget_rolled_back_claims, nullptr);
}

}  // namespace idem::own_claims

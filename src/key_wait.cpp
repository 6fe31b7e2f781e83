// Waiting for a key's holder without polling (see key_wait.hpp).
#include "key_wait.hpp"

#include "gucs.hpp"
#include "pg_boundary.hpp"
#include "shared_memory.hpp"
#include "siphash.hpp"
#include "pg/waits.hpp"

namespace idem::key_wait {
namespace {

constexpr uint32 kSlots = 1024;

struct SharedSlots {
  // The key of the slots' hash, made when the shared memory is (once per cluster start).
  uint64 secret[2];
  ConditionVariable variables[kSlots];
};
SharedSlots* shared = nullptr;

// The slots this transaction wrote keys of.
uint64 touched_slots[kSlots / 64];
bool any_touched = false;

// pg-frame: the shmem startup hook, at postmaster start; owns no C++ object.
void initialize(SharedSlots* slots) {
  if (!pg_strong_random(slots->secret, sizeof slots->secret))
    ereport(FATAL, (errmsg("could not generate the secret of the idempotency key waits")));
  for (ConditionVariable& variable : slots->variables) ConditionVariableInit(&variable);
}

const unsigned char* bytes_of(const void* data) {
  return static_cast<const unsigned char*>(data);
}

void forget_touched() {
  memset(touched_slots, 0, sizeof touched_slots);
  any_touched = false;
}

// At the end of a transaction, once it is visible as ended to every other one (the
// callbacks run after ProcArrayEndTransaction): wake the waiters of every slot it wrote.
void wake_waiters(XactEvent event, void*) {
  if (!any_touched) return;
  switch (event) {
    case XACT_EVENT_COMMIT:
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PARALLEL_COMMIT:
    case XACT_EVENT_PARALLEL_ABORT:
      break;
    case XACT_EVENT_PREPARE:
      forget_touched();  // it ends elsewhere: its waiters fall back on the safety net
      return;
    default:
      return;
  }
  if (shared != nullptr)
    for (uint32 word = 0; word < kSlots / 64; ++word)
      for (uint64 bits = touched_slots[word]; bits != 0; bits &= bits - 1)
        ConditionVariableBroadcast(&shared->variables[word * 64 + pg_rightmost_one_pos64(bits)]);
  forget_touched();
}

}  // namespace

void install_shared_memory_hooks() {
  shared_memory::reserve("idempotency key waits", &shared, initialize);
}

void on_load() {
  RegisterXactCallback(wake_waiters, nullptr);
}

uint32 slot_of(Oid owner, const char* scope, size_t scope_length, const char* key,
               size_t key_length) {
  if (shared == nullptr) return 0;  // no slots: waiters poll
  // Slots are shared by every role and database of the cluster: a keyed hash (whose key no
  // role can read) of the database and the key's identity, so that no role can compute a
  // key of its own that shares a slot with another's, and wake-ups in one slot tell nothing.
  // The scope is length-prefixed: no two identities give the same input.
  SipHash24 hash(shared->secret[0], shared->secret[1]);
  hash.update_word(uint64{MyDatabaseId} | (uint64{owner} << 32));
  hash.update_word(scope_length);
  hash.update(bytes_of(scope), scope_length);
  hash.update(bytes_of(key), key_length);
  return static_cast<uint32>(hash.finish() % kSlots);
}

void touched(uint32 slot) {
  if (shared == nullptr) return;
  touched_slots[slot / 64] |= uint64{1} << (slot % 64);
  any_touched = true;
}

Waiter::Waiter(uint32 slot, bool waits) {
  if (waits && shared != nullptr) variable_ = &shared->variables[slot];
}

Waiter::~Waiter() {
  if (prepared_) ConditionVariableCancelSleep();
}

void Waiter::prepare() {
  // Once: preparing again would take us off the list and put us back, losing a wake-up
  // that came in between. ConditionVariableTimedSleep keeps us on the list between sleeps.
  if (variable_ == nullptr || prepared_) return;
  ConditionVariablePrepareToSleep(variable_);
  prepared_ = true;
}

void Waiter::sleep(TimestampTz deadline) {
  const int64 remaining_us = deadline - GetCurrentTimestamp();
  if (variable_ != nullptr && prepared_) {
    const long timeout_ms =
        std::max<long>(1, std::min<long>((remaining_us + 999) / 1000, gucs::wait_recheck_ms));
    pg::waits::on_condition_variable(variable_, timeout_ms);
    return;
  }
  // Without shared memory: poll, backing off from 1 ms to 50 ms.
  const int64 sleep_us = std::max<int64>(std::min(backoff_us_, remaining_us), 1000);
  backoff_us_ = std::min<int64>(backoff_us_ * 2, 50 * 1000);
  pg::waits::on_latch(static_cast<long>(sleep_us / 1000));
}

}  // namespace idem::key_wait

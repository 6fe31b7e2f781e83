// UUID version 7 (RFC 9562), laid out exactly as PostgreSQL 18's uuidv7():
//   48 bits Unix time in ms | version 7 | 12 bits sub-millisecond fraction |
//   variant 10 | 62 random bits.
// Values from one backend strictly increase: the (ms, fraction) pair is a 60-bit clock
// that never repeats or goes back; when the system clock is behind the last value (many
// calls within one fraction step, or the clock stepped back) it advances by one step.
#include "pg_boundary.hpp"
#include "pg/memory.hpp"

namespace idem::uuid_v7 {
namespace {

constexpr int64_t kNsPerMs = 1000 * 1000;
constexpr int64_t kFractionSteps = 1 << 12;
// Nanoseconds per 1/4096 ms, rounded up so that one step always changes the fraction.
constexpr int64_t kStepNs = (kNsPerMs + kFractionSteps - 1) / kFractionSteps;
constexpr int64_t kMaxUnixMs = (int64_t{1} << 48) - 1;
constexpr int64_t kUnixToPgEpochUs =
    int64_t{POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE} * SECS_PER_DAY * USECS_PER_SEC;

// Random bytes drawn from the CSPRNG in blocks: one pg_strong_random() call per 256 UUIDs
// instead of one per UUID. The owner pid makes the pool fork-safe: a child never uses
// bytes its parent may also use (the postmaster itself never generates).
class RandomPool {
 public:
  void fill(uint8_t* out, size_t n) {
    if (owner_pid_ != MyProcPid || used_ + n > sizeof bytes_) refill();
    memcpy(out, bytes_ + used_, n);
    // Bytes handed out are wiped, so a core dump never shows past UUIDs' randomness.
    memset(bytes_ + used_, 0, n);
    used_ += n;
  }

 private:
  void refill() {
    if (!pg_strong_random(bytes_, sizeof bytes_))
      throw Error(ERRCODE_INTERNAL_ERROR, "could not generate random bytes for a UUID");
    used_ = 0;
    owner_pid_ = MyProcPid;
  }
  uint8_t bytes_[4096];
  size_t used_ = 0;
  int owner_pid_ = 0;
};

RandomPool random_pool;
int64_t last_clock_ns = 0;  // (Unix ms, fraction) of the last UUID, as nanoseconds

int64_t now_unix_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1000 * kNsPerMs + ts.tv_nsec;
}

// Builds a v7 UUID from Unix ms and the 12-bit fraction; the rest is random.
pg_uuid_t* make_uuid(int64_t unix_ms, uint32_t fraction) {
  uint8_t random_bytes[8];
  random_pool.fill(random_bytes, sizeof random_bytes);
  auto* uuid = pg::memory::allocate<pg_uuid_t>();
  uint8_t* b = uuid->data;
  for (int i = 0; i < 6; ++i) b[i] = static_cast<uint8_t>(unix_ms >> (8 * (5 - i)));
  b[6] = static_cast<uint8_t>(0x70 | (fraction >> 8));
  b[7] = static_cast<uint8_t>(fraction & 0xff);
  memcpy(b + 8, random_bytes, 8);
  b[8] = static_cast<uint8_t>(0x80 | (b[8] & 0x3f));
  return uuid;
}

uint32_t fraction_of(int64_t ns_within_ms) {
  return static_cast<uint32_t>(ns_within_ms * kFractionSteps / kNsPerMs);
}

}  // namespace

pg_uuid_t* generate() {
  int64_t ns = now_unix_ns();
  // One step always moves the stored fraction by at least one, so this alone keeps the
  // stored (ms, fraction) clock strictly increasing, whatever the system clock does.
  if (ns <= last_clock_ns + kStepNs) ns = last_clock_ns + kStepNs;
  last_clock_ns = ns;
  int64_t unix_ms = ns / kNsPerMs;
  if (unix_ms > kMaxUnixMs)
    throw Error(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE, "the clock is beyond the UUIDv7 range");
  return make_uuid(unix_ms, fraction_of(ns % kNsPerMs));
}

pg_uuid_t* generate_at(TimestampTz when) {
  if (TIMESTAMP_NOT_FINITE(when))
    throw Error(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE,
                std::string("timestamp out of range for a UUIDv7: ") + timestamptz_to_str(when));
  int64_t unix_us = when + kUnixToPgEpochUs;
  if (unix_us < 0 || unix_us / 1000 > kMaxUnixMs)
    throw Error(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE,
                std::string("timestamp out of range for a UUIDv7: ") + timestamptz_to_str(when),
                "A UUIDv7 holds times from 1970-01-01 00:00:00 UTC to 10889-08-02 05:31:50.655 "
                "UTC (48 bits of Unix milliseconds).");
  return make_uuid(unix_us / 1000, fraction_of((unix_us % 1000) * 1000));
}

// The Unix time (ms precision) of a version 7, variant 10 UUID; nullopt for any other.
std::optional<TimestampTz> time_of(const pg_uuid_t* uuid) {
  const uint8_t* b = uuid->data;
  if ((b[6] >> 4) != 7 || (b[8] & 0xc0) != 0x80) return std::nullopt;
  int64_t unix_ms = 0;
  for (int i = 0; i < 6; ++i) unix_ms = (unix_ms << 8) | b[i];
  return unix_ms * 1000 - kUnixToPgEpochUs;
}

namespace {
Datum sql_gen_uuid_v7(FunctionCallInfo) {
  return UUIDPGetDatum(generate());
}

Datum sql_gen_uuid_v7_at(FunctionCallInfo fcinfo) {
  return UUIDPGetDatum(generate_at(PG_GETARG_TIMESTAMPTZ(0)));
}

Datum sql_uuid_v7_time(FunctionCallInfo fcinfo) {
  std::optional<TimestampTz> time = time_of(PG_GETARG_UUID_P(0));
  if (!time) PG_RETURN_NULL();
  PG_RETURN_TIMESTAMPTZ(*time);
}
}  // namespace

}  // namespace idem::uuid_v7

IDEM_SQL_FUNCTION(gen_uuid_v7, idem::uuid_v7::sql_gen_uuid_v7)
IDEM_SQL_FUNCTION(gen_uuid_v7_at, idem::uuid_v7::sql_gen_uuid_v7_at)
IDEM_SQL_FUNCTION(uuid_v7_time, idem::uuid_v7::sql_uuid_v7_time)

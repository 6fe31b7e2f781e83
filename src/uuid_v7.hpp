// UUIDv7 generation (RFC 9562, PostgreSQL 18 layout); also used for lease tokens.
#pragma once

#include "pg.hpp"

namespace idem::uuid_v7 {

// A new UUIDv7, strictly greater than every earlier one from this backend (palloc'd).
pg_uuid_t* generate();
// A UUIDv7 for the given time; throws Error 22008 outside 1970 .. 2^48 ms.
pg_uuid_t* generate_at(TimestampTz when);
// The millisecond time a v7 UUID carries; nullopt when the UUID is not version 7.
std::optional<TimestampTz> time_of(const pg_uuid_t* uuid);

}  // namespace idem::uuid_v7

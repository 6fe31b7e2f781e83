// PostgreSQL's cryptohash API (OpenSSL where the server uses it), as C++ hashes. Every
// wrapper that may raise catches (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::cryptohash {

// A new hash context of `type` (PG_SHA256, ...), nullptr when OpenSSL could not make one;
// pg_cryptohash_free() frees it. Raises (out of memory). Allocates it in the current memory
// context (with OpenSSL, its state outside it, owned by the current resource owner).
inline pg_cryptohash_ctx* create(pg_cryptohash_type type) {
  return pg_call([&] { return pg_cryptohash_create(type); });
}

}  // namespace idem::pg::cryptohash

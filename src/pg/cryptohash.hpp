// PostgreSQL's cryptohash API (OpenSSL where the server uses it), as C++ hashes. Every
// wrapper that may raise catches (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::cryptohash {

// A new SHA-256 context, nullptr when OpenSSL could not make one; pg_cryptohash_free() frees
// it. Raises (out of memory). Allocates it in the current memory context (with OpenSSL, its
// state outside it, owned by the current resource owner). On the claim path (the key lock's
// tag): captures nothing, so it compiles to the pg_call it replaced.
inline pg_cryptohash_ctx* new_sha256() {
  return pg_call([] { return pg_cryptohash_create(PG_SHA256); });
}

}  // namespace idem::pg::cryptohash

// SHA-256 through PostgreSQL's cryptohash API (OpenSSL where the server uses it): request
// fingerprints, and the key lock's tag, which an attacker must not be able to aim.
#pragma once

#include "pg/cryptohash.hpp"
#include "pg/memory.hpp"
#include "pg_boundary.hpp"

namespace idem {

// RAII owner of a PostgreSQL SHA-256 context.
class Sha256 {
 public:
  Sha256() {
    context_ = pg::cryptohash::new_sha256();
    if (context_ != nullptr && pg_cryptohash_init(context_) == 0) return;
    pg_cryptohash_free(context_);
    throw Error(ERRCODE_OUT_OF_MEMORY, "could not initialize SHA-256");
  }
  ~Sha256() { pg_cryptohash_free(context_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  Sha256(Sha256&&) = delete;
  Sha256& operator=(Sha256&&) = delete;

  void update(const void* data, size_t length) {
    if (pg_cryptohash_update(context_, static_cast<const uint8*>(data), length) < 0)
      throw Error(ERRCODE_INTERNAL_ERROR, "could not compute SHA-256");
  }
  // A token: one tag byte, a 4-byte length, the bytes.
  void token(char tag, const void* data, uint32_t length) {
    uint8_t header[5] = {static_cast<uint8_t>(tag), static_cast<uint8_t>(length >> 24),
                         static_cast<uint8_t>(length >> 16), static_cast<uint8_t>(length >> 8),
                         static_cast<uint8_t>(length)};
    update(header, sizeof header);
    if (length > 0) update(data, length);
  }
  // The digest as a palloc'd bytea.
  bytea* finish() {
    bytea* result = pg::memory::allocate_bytea<PG_SHA256_DIGEST_LENGTH>();
    SET_VARSIZE(result, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
    finish_into(reinterpret_cast<uint8*>(VARDATA(result)));
    return result;
  }
  // The digest into PG_SHA256_DIGEST_LENGTH bytes at `digest`.
  void finish_into(uint8* digest) {
    if (pg_cryptohash_final(context_, digest, PG_SHA256_DIGEST_LENGTH) < 0)
      throw Error(ERRCODE_INTERNAL_ERROR, "could not compute SHA-256");
  }

 private:
  pg_cryptohash_ctx* context_;
};

}  // namespace idem

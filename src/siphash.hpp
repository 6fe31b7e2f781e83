// SipHash-2-4 (Aumasson and Bernstein, 2012): a pseudorandom function keyed by a 128-bit
// secret, fast on short inputs. Used where a hash places one role's work next to another's
// in shared memory (the key waits' slots): without the secret, a role could compute inputs
// of its own that land where another role's do.
//
// No PostgreSQL header: the implementation is checked at compile time against the reference
// vectors of the paper (below), and a micro benchmark can use it on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace idem {

class SipHash24 {
 public:
  constexpr SipHash24(std::uint64_t k0, std::uint64_t k1)
      : v0_(k0 ^ 0x736f6d6570736575ULL),
        v1_(k1 ^ 0x646f72616e646f6dULL),
        v2_(k0 ^ 0x6c7967656e657261ULL),
        v3_(k1 ^ 0x7465646279746573ULL) {}

  // Eight bytes at once, given as the little-endian word they make; only before any
  // update() of a length that is not a multiple of 8.
  constexpr void update_word(std::uint64_t word) {
    total_ += 8;
    compress(word);
  }

  constexpr void update(const unsigned char* data, std::size_t length) {
    total_ += length;
    if (pending_bytes_ != 0) {
      for (; pending_bytes_ < 8 && length > 0; --length)
        pending_ |= std::uint64_t{*data++} << (8 * pending_bytes_++);
      if (pending_bytes_ < 8) return;
      compress(pending_);
      pending_ = 0;
      pending_bytes_ = 0;
    }
    for (; length >= 8; data += 8, length -= 8) compress(load_little_endian(data));
    for (std::size_t i = 0; i < length; ++i) pending_ |= std::uint64_t{data[i]} << (8 * i);
    pending_bytes_ = length;
  }

  // The digest of everything given to update(); the object is spent afterwards.
  constexpr std::uint64_t finish() {
    compress(pending_ | (std::uint64_t{total_ & 0xff} << 56));
    v2_ ^= 0xff;
    for (int i = 0; i < 4; ++i) round();
    return v0_ ^ v1_ ^ v2_ ^ v3_;
  }

 private:
  static constexpr std::uint64_t rotate(std::uint64_t x, int bits) {
    return (x << bits) | (x >> (64 - bits));
  }
  static constexpr std::uint64_t load_little_endian(const unsigned char* p) {
    if (!__builtin_is_constant_evaluated()) {  // one load at run time
      std::uint64_t word = 0;
      std::memcpy(&word, p, sizeof word);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
      word = __builtin_bswap64(word);
#endif
      return word;
    }
    std::uint64_t word = 0;
    for (int i = 7; i >= 0; --i) word = (word << 8) | p[i];
    return word;
  }
  constexpr void round() {
    v0_ += v1_;
    v1_ = rotate(v1_, 13) ^ v0_;
    v0_ = rotate(v0_, 32);
    v2_ += v3_;
    v3_ = rotate(v3_, 16) ^ v2_;
    v0_ += v3_;
    v3_ = rotate(v3_, 21) ^ v0_;
    v2_ += v1_;
    v1_ = rotate(v1_, 17) ^ v2_;
    v2_ = rotate(v2_, 32);
  }
  constexpr void compress(std::uint64_t word) {
    v3_ ^= word;
    round();
    round();
    v0_ ^= word;
  }

  std::uint64_t v0_, v1_, v2_, v3_;
  std::uint64_t pending_ = 0;  // the bytes of an incomplete word, little-endian
  std::size_t pending_bytes_ = 0;
  std::size_t total_ = 0;
};

namespace siphash_check {
// The paper's key 00 01 .. 0f and the first bytes 00 01 02 .. as messages.
constexpr unsigned char kBytes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
constexpr std::uint64_t digest(std::size_t length, std::size_t split) {
  SipHash24 hash(0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL);
  hash.update(kBytes, split);
  hash.update(kBytes + split, length - split);
  return hash.finish();
}
constexpr std::uint64_t digest_by_word() {
  SipHash24 hash(0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL);
  hash.update_word(0x0706050403020100ULL);
  hash.update(kBytes + 8, 7);
  return hash.finish();
}
// Reference outputs (the paper's appendix and its test vectors), whole and in two parts.
static_assert(digest(0, 0) == 0x726fdb47dd0e0e31ULL);
static_assert(digest(1, 0) == 0x74f839c593dc67fdULL);
static_assert(digest(15, 0) == 0xa129ca6149be45e5ULL);
static_assert(digest(15, 3) == 0xa129ca6149be45e5ULL);
static_assert(digest(15, 9) == 0xa129ca6149be45e5ULL);
static_assert(digest_by_word() == 0xa129ca6149be45e5ULL);
}  // namespace siphash_check

}  // namespace idem

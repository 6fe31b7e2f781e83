// The direct path's steps on idempotency_keys that run whole inside one pg_call, each a
// pg-frame function of its file (listed in test/lint/boundary.py's PG_FRAMES): the reading of
// the table's layout (key_layout.cpp). Every wrapper catches (pg_call).
#pragma once

#include "../key_layout.hpp"
#include "../pg_boundary.hpp"

namespace idem::pg::storage {

// key_layout::read_into_cache(table) under pg_call: the table's columns, labels and indexes
// read into the layout cache (what it finds unusable comes back as a LayoutCheck). Raises (a
// catalog or relcache read failure, out of memory). Allocates the index information in the
// layout's own memory context, under TopMemoryContext; takes AccessShareLock on each index.
inline key_layout::LayoutCheck read_layout(Relation table) {
  return pg_call([&] { return key_layout::read_into_cache(table); });
}

}  // namespace idem::pg::storage

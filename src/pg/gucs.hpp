// Settings (GUCs) changed for a while by C++, and put back. Every wrapper that may raise
// catches (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::gucs {

// Opens a new GUC nesting level and returns it. Raises not: it only increments a counter.
// pg-frame: a counter increment cannot raise.
inline int new_nest_level() {
  return NewGUCNestLevel();  // pg: only increments the nesting counter
}
// Sets `name` to `value` for this session at the current nesting level, to be put back by
// restore_nest_level(). Raises (no such setting, an invalid value). Allocates the old value's
// copy in the GUC machinery's own memory.
inline void set_at_nest_level(const char* name, const char* value) {
  pg_call([&] {
    (void)set_config_option(name, value, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0,
                            false);
  });
}
// Puts back every setting changed at nesting level `level` and above (AtEOXact_GUC, not
// committing them). Called from destructors, so without pg_call: it only restores saved
// values, which cannot fail for the settings set above.
// pg-frame: restoring saved values does not raise; called from noexcept code.
inline void restore_nest_level(int level) noexcept {
  AtEOXact_GUC(false, level);
}

}  // namespace idem::pg::gucs

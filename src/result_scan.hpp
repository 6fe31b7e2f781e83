// claim_key and complete_key in FROM, run by a scan node of ours.
//
// PostgreSQL runs a function in FROM with a function scan: it forms the function's composite,
// copies it into a tuplestore and reads it back, and looks the row type up again on every
// execution. Our scan hands the function a row to fill (DirectRow, as fcinfo->resultinfo) and
// returns it as it is. The planner hook puts it in place of the function scan only for a call
// of one of our functions, alone in its FROM item, with no ORDINALITY, no row mark, no
// whole-row reference and no correlated sub-select in its arguments; every other case keeps the
// function scan, and so does `SET idempotency.result_scan = off`. What PostgreSQL's function scan
// does for a call, ours does too: the EXECUTE privilege check and its hook, the function's
// statistics, strictness, a call again only when an argument's parameter changed.
#pragma once

#include "claim_result.hpp"

namespace idem::result_scan {

// The row a call in our scan writes its columns to, in place of a composite Datum.
struct DirectRow {
  NodeTag type;  // T_Invalid: no PostgreSQL code reads a resultinfo it did not set
  uint32 magic;  // kDirectRowMagic
  int columns;   // of the row type the scan returns
  bool filled;   // set by the function
  Datum values[claim_result::kResultFields];
  bool nulls[claim_result::kResultFields];
  claim_result::ResultStorage storage;  // what values point to (the token, retry_after)
};

// The row this call of a claim_result function writes to, or nullptr when it is called by
// anything else and returns a composite Datum.
DirectRow* direct_row(FunctionCallInfo fcinfo);

// Installs the planner hook and registers the scan; called from _PG_init.
void on_load();

}  // namespace idem::result_scan

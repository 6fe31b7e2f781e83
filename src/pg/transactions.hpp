// Transactions, as C++ asks about them. Every wrapper catches (pg_call).
#pragma once

#include "../pg_boundary.hpp"

namespace idem::pg::transactions {

// Is `xid` another transaction that is still open (not this one, nor a subtransaction of
// it)? Reads the proc array and, for an old xid, pg_subtrans. Raises (an I/O error on
// pg_subtrans). Allocates nothing.
inline bool open_other(TransactionId xid) {
  return pg_call([&] {
    return TransactionIdIsNormal(xid) && !TransactionIdIsCurrentTransactionId(xid) &&
           TransactionIdIsInProgress(xid);
  });
}

}  // namespace idem::pg::transactions

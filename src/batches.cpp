// The batch SQL functions, claim_keys and complete_keys: the single-key steps of the claim
// protocol for every element of arrays, in one call.
//
// Each element is handled as the single-key function would handle it, in input order, in
// the caller's transaction, with the same validation, limits and SQLSTATEs; one row comes
// back per element, in input order, with its 1-based ordinality and its key. A batch never
// waits: a key held by an open transaction (another's, or an earlier element of this very
// batch) answers in_progress. So a key repeated in one batch is decided by its first
// occurrence, and every later occurrence gets what a duplicate gets at that moment:
// in_progress while the first occurrence's claim is open, replay / mismatch like the first
// when the key was completed. Any error (a bad element, a fenced completion) fails the
// whole call, which then changes nothing; its detail names the element.
#include "claim_protocol.hpp"
#include "responses.hpp"
#include "pg/arrays.hpp"
#include "pg/fmgr.hpp"
#include "pg/memory.hpp"
#include "pg/srf.hpp"

namespace idem::batches {
namespace {

using namespace arguments;  // NOLINT(google-build-using-namespace): the argument readers
using claim_protocol::as_owner;
using claim_protocol::ClaimRequest;
using claim_result::ClaimResult;
using key_store::KeyRow;
using key_store::Session;

// A one-dimensional array argument (array nullptr: the argument is NULL). Its elements are
// read in order by an ElementWalk, never copied out all at once: a batch of millions of keys
// costs no memory per element beyond the array PostgreSQL already holds.
struct ArrayArgument {
  ArrayType* array = nullptr;
  int count = 0;
};

ArrayArgument array_argument(FunctionCallInfo fcinfo, int n, Oid element_type, const char* name,
                             int expected_count) {
  ArrayArgument argument;
  if (PG_ARGISNULL(n)) return argument;
  ArrayType* array = pg::arrays::argument(fcinfo, n);
  if (ARR_NDIM(array) > 1)
    throw Error(ERRCODE_ARRAY_SUBSCRIPT_ERROR,
                std::string(name) + " must be a one-dimensional array",
                std::string(name) + " has " + std::to_string(ARR_NDIM(array)) + " dimensions.");
  if (ARR_ELEMTYPE(array) != element_type)
    throw Error(ERRCODE_DATATYPE_MISMATCH, std::string(name) + " is an array of another type");
  argument.array = array;
  argument.count = ARR_NDIM(array) == 0 ? 0 : ARR_DIMS(array)[0];
  if (expected_count >= 0 && argument.count != expected_count)
    throw Error(ERRCODE_ARRAY_SUBSCRIPT_ERROR, std::string(name) + " and keys differ in length",
                std::string(name) + " has " + std::to_string(argument.count) +
                    " elements; keys has " + std::to_string(expected_count) + ".",
                "Pass one element per key, or NULL for none.");
  return argument;
}

ArrayArgument keys_argument(FunctionCallInfo fcinfo) {
  if (PG_ARGISNULL(0))
    throw Error(ERRCODE_NULL_VALUE_NOT_ALLOWED, "keys must not be null", {},
                "Pass an array of keys; an empty array gives no rows.");
  return array_argument(fcinfo, 0, TEXTOID, "keys", -1);
}

// Walks the arrays of one batch in step, element by element (an absent array gives NULLs).
// Values point into the arrays. Trivially destructible: its iterators live in the current
// memory context.
class ElementWalk {
 public:
  static constexpr int kMaxArrays = 6;
  ElementWalk(std::initializer_list<const ArrayArgument*> arrays) {
    for (const ArrayArgument* argument : arrays) {
      ArrayType* array = argument->array;
      iterators_[count_++] = array == nullptr ? nullptr : pg::arrays::iterate(array);
    }
  }
  // Moves every array to its next element.
  void next() {
    for (int k = 0; k < count_; ++k) {
      nulls_[k] = true;
      if (iterators_[k] == nullptr) continue;
      ArrayIterator iterator = iterators_[k];
      Datum* value = &values_[k];
      bool* is_null = &nulls_[k];
      if (!pg::arrays::next(iterator, value, is_null)) *is_null = true;
    }
  }
  Datum value(int k) const { return values_[k]; }
  bool is_null(int k) const { return nulls_[k]; }

 private:
  ArrayIterator iterators_[kMaxArrays] = {};
  Datum values_[kMaxArrays] = {};
  bool nulls_[kMaxArrays] = {};
  int count_ = 0;
};

// Runs `work` for the element at `ordinality`; an error says which element it was. Answers
// interrupts first: a batch of any size can be cancelled within an element's time.
template <typename Work>
auto for_element(int ordinality, Work&& work) {
  check_for_interrupts();
  try {
    return work();
  } catch (const Error& e) {
    const std::string where = "At element " + std::to_string(ordinality) + " of keys.";
    throw Error(e.sqlstate(), e.what(), e.detail().empty() ? where : e.detail() + " " + where,
                e.hint());
  }
}

// The rows of a batch function, in the tuplestore of materialize mode.
struct BatchOutput {
  Tuplestorestate* rows = nullptr;
  TupleDesc descriptor = nullptr;
  Oid status_type = InvalidOid;
};

BatchOutput begin_batch_output(FunctionCallInfo fcinfo) {
  BatchOutput output;
  pg::srf::materialize(fcinfo);
  auto* result_info = reinterpret_cast<ReturnSetInfo*>(fcinfo->resultinfo);
  output.rows = result_info->setResult;
  output.descriptor = result_info->setDesc;
  if (output.descriptor->natts != 2 + claim_result::kBatchResultFields ||
      TupleDescAttr(output.descriptor, 0)->atttypid != INT4OID ||
      TupleDescAttr(output.descriptor, 1)->atttypid != TEXTOID)
    throw Error(ERRCODE_DATATYPE_MISMATCH, "the batch function returns columns of unexpected types",
                {}, "Update the extension: ALTER EXTENSION idempotency UPDATE.");
  output.status_type = TupleDescAttr(output.descriptor, 2)->atttypid;
  return output;
}

void put_batch_row(const BatchOutput& output, int ordinality, Datum key,
                   const ClaimResult& result) {
  Datum values[2 + claim_result::kBatchResultFields];
  bool nulls[2 + claim_result::kBatchResultFields];
  values[0] = Int32GetDatum(ordinality);
  nulls[0] = false;
  values[1] = key;
  nulls[1] = false;
  claim_result::ResultStorage storage;
  claim_result::fill(result, output.status_type, values + 2, nulls + 2, storage,
                     claim_result::kBatchResultFields);
  pg::srf::put_row(output.rows, output.descriptor, values, nulls);
}

// Checks every element with `check(walk, ordinality)` before any is acted on (a bad element
// fails the call, which then has changed nothing), then runs `work(store, at, walk,
// ordinality)` for each as the installation's owner. Each element runs in a memory context
// that is emptied after it, so a batch of any size runs in bounded memory.
template <typename Check, typename Work>
void for_each_element(FunctionCallInfo fcinfo, std::initializer_list<const ArrayArgument*> arrays,
                      int count, Check&& check, Work&& work) {
  MemoryContext function_context = CurrentMemoryContext;
  MemoryContext per_element =
      pg::memory::new_context(function_context, "idempotency batch element");
  {
    ElementWalk walk(arrays);
    for (int i = 1; i <= count; ++i) {
      walk.next();
      MemoryContextSwitchTo(per_element);
      for_element(i, [&] { return check(walk, i); });
      MemoryContextSwitchTo(function_context);
      pg::memory::reset(per_element);
    }
  }
  BatchOutput output = begin_batch_output(fcinfo);
  ElementWalk walk(arrays);
  (void)as_owner(fcinfo, [&](Session& store, const caller::Installation& at) {
    for (int i = 1; i <= count; ++i) {
      walk.next();
      MemoryContextSwitchTo(per_element);
      store.use_context(per_element);
      put_batch_row(output, i, walk.value(0),
                    for_element(i, [&] { return work(store, at, walk); }));
      MemoryContextSwitchTo(function_context);
      pg::memory::reset(per_element);
    }
    return true;
  });
  MemoryContextSwitchTo(function_context);
}

// The key of the current element, checked (keys are the walk's first array).
KeyName element_name(const ElementWalk& walk, text* scope) {
  if (walk.is_null(0)) reject_null_key();
  text* key = pg::fmgr::text_value(walk.value(0));
  return checked_name(scope, key);
}

Datum sql_claim_keys(FunctionCallInfo fcinfo) {
  const Caller caller = calling("claim_keys");
  const ArrayArgument keys = keys_argument(fcinfo);
  const ArrayArgument fingerprints =
      array_argument(fcinfo, 1, BYTEAOID, "fingerprints", keys.count);
  if (PG_ARGISNULL(2)) reject_null_scope();
  text* scope = text_argument(fcinfo, 2);
  ClaimRequest request(KeyName{scope, nullptr});
  request.ttl = ttl_argument(fcinfo, 3);
  request.lease = lease_argument(fcinfo, 4);
  request.caller = caller;
  // A batch never waits: its deadline has passed already.
  request.deadline = GetCurrentTimestamp();
  auto fingerprint_of = [](const ElementWalk& walk) {
    return walk.is_null(1) ? nullptr : fingerprint_value(walk.value(1));
  };
  for_each_element(
      fcinfo, {&keys, &fingerprints}, keys.count,
      [&](const ElementWalk& walk, int) {
        (void)element_name(walk, scope);
        (void)fingerprint_of(walk);
        return true;
      },
      [&](Session& store, const caller::Installation& at, const ElementWalk& walk) {
        request.name = element_name(walk, scope);
        request.fingerprint = fingerprint_of(walk);
        request.table = at.table;
        return claim_protocol::claim(store, request);
      });
  return static_cast<Datum>(0);
}

Datum sql_complete_keys(FunctionCallInfo fcinfo) {
  const Caller caller = calling("complete_keys");
  const ArrayArgument keys = keys_argument(fcinfo);
  const ArrayArgument tokens = array_argument(fcinfo, 1, UUIDOID, "tokens", keys.count);
  if (tokens.array == nullptr)
    throw Error(ERRCODE_NULL_VALUE_NOT_ALLOWED, "tokens must not be null", {},
                "Pass the tokens that claim_keys returned, one per key.");
  const ArrayArgument responses = array_argument(fcinfo, 2, JSONBOID, "responses", keys.count);
  const ArrayArgument codes = array_argument(fcinfo, 3, INT4OID, "response_codes", keys.count);
  if (PG_ARGISNULL(4)) reject_null_scope();
  text* scope = text_argument(fcinfo, 4);
  const ArrayArgument bodies =
      argument_given(fcinfo, 5) ? array_argument(fcinfo, 5, BYTEAOID, "response_bodies", keys.count)
                                : ArrayArgument{};
  const ArrayArgument headers =
      argument_given(fcinfo, 6)
          ? array_argument(fcinfo, 6, JSONBOID, "response_headers", keys.count)
          : ArrayArgument{};
  const TimestampTz now = GetCurrentTimestamp();
  struct Completion {
    KeyName name;
    pg_uuid_t token;
    key_store::Outcome outcome;
  };
  auto completion_of = [&](const ElementWalk& walk) {
    Completion completion{element_name(walk, scope), {}, {}};
    if (walk.is_null(1))
      throw Error(ERRCODE_NULL_VALUE_NOT_ALLOWED, "token must not be null", {},
                  "Pass the token that claim_keys returned for this key.");
    completion.token = *DatumGetUUIDP(walk.value(1));
    responses::ResponseArguments given;
    if (!walk.is_null(2)) given.response = walk.value(2);
    if (!walk.is_null(3)) given.code = DatumGetInt32(walk.value(3));
    if (!walk.is_null(4)) given.body = walk.value(4);
    if (!walk.is_null(5)) given.headers = walk.value(5);
    completion.outcome = responses::outcome_value(given);
    return completion;
  };
  for_each_element(
      fcinfo, {&keys, &tokens, &responses, &codes, &bodies, &headers}, keys.count,
      [&](const ElementWalk& walk, int) {
        (void)completion_of(walk);
        return true;
      },
      [&](Session& store, const caller::Installation&, const ElementWalk& walk) {
        const Completion completion = completion_of(walk);
        KeyRow row = claim_protocol::complete(store, completion.name, completion.token,
                                              completion.outcome, caller, now);
        return claim_result::stored_answer(claim_result::Status::kReplay, row, now);
      });
  return static_cast<Datum>(0);
}

// ALTER TYPE ... RENAME VALUE keeps a label's OID under a new name: look the labels up again.

}  // namespace
}  // namespace idem::batches

IDEM_SQL_FUNCTION(claim_keys, idem::batches::sql_claim_keys)
IDEM_SQL_FUNCTION(complete_keys, idem::batches::sql_complete_keys)

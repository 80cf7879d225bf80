// An exchange between ranks (or a worker and its ps tasks) and their keys'
// owners (graphmod/horovod/exchange.py, rewrite_rules/ps_shards.py), done in
// one pass each side instead of a few dozen small TF ops a step (unique,
// argsort, bincount, repeat, cumsums, gathers, stitches):
//
//   Route (each sender): the ids of every table, deduplicated per table (with
//     each key's count), ordered by owner rank, then table, then first
//     occurrence; and per id, where its row sits in the flat buffer the
//     owners send back (each entry `widths[table]` floats, entries in sent
//     order) and its occurrence number among the same key's ids.
//   Serve (each owner): what arrived (entries per source rank, in rank order),
//     per table: the keys to look up, each as often as it occurred in all
//     ranks' batches together (keys in order of first arrival), and per entry
//     its key, the lookup holding its key's row (the last), where the entry's
//     own lookups start, and where its row goes in the flat buffer sent back
//     (entries in arrival order).
//   ScatterGradients (each sender, after the backward pass): gradient rows
//     summed into the entries it sent, laid out as the rows that came back
//     (each entry its dim floats, then 1 when a gradient reached it, else 0),
//     so that they return to the owners without their keys: each owner knows
//     which keys it served.
//   GatherGradients (each owner): from that buffer as it arrived, per table,
//     the keys a gradient reached and their gradient rows.
//   PackRows / UnpackRows: the rows' moves themselves, on each side of their
//     all-to-all (their gradients, for autodiff, are TF ops:
//     graphmod/embeddings/routing.py).
// All are pure C++ (no TF), tested under the sanitizers (exchange_plan_test).
#ifndef GRAPHMOD_NATIVE_EXCHANGE_PLAN_H_
#define GRAPHMOD_NATIVE_EXCHANGE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

namespace graphmod {

// The rank of `size` ranks that owns `key`: its mixed bits' top 32, scaled to
// the ranks (graphmod/embeddings/partition.py's owner_of computes the same).
inline int OwnerRank(int64_t key, int size) {
  uint64_t h = static_cast<uint64_t>(key);
  h ^= h >> 31;
  h *= 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  return static_cast<int>(((h >> 32) * static_cast<uint64_t>(size)) >> 32);
}

struct IdSpan {
  const int64_t* ids;
  int64_t n;
};

struct Route {
  // Per entry (a table's unique key), in sent order: key, count, table.
  std::vector<int64_t> keys, counts;
  std::vector<int32_t> tables;
  std::vector<int32_t> splits;        // entries per owner rank
  std::vector<int32_t> float_splits;  // floats per owner rank in the returned buffer
  // Per table, per id: its entry's first float in the returned buffer, and
  // how many ids of the same key come before it in the table's ids.
  std::vector<std::vector<int32_t>> at, occurrence;
};

// Plans the sending of tables' ids to `size` owners; widths[t] is the floats
// per entry of table t in the buffer sent back. Returns an error message, or
// "" (then *out holds the plan).
std::string PlanRoute(const std::vector<IdSpan>& tables, int size,
                      const std::vector<int32_t>& widths, Route* out);

struct Received {
  const int64_t* keys;    // per entry
  const int64_t* counts;  // per entry, or nullptr: each entry counts once
  const int64_t* tables;  // per entry
  int64_t n;
  const int32_t* splits;  // entries per source rank
  int size;
};

struct Serve {
  struct Table {
    std::vector<int64_t> lookups;  // keys to look up, each as often as it occurred
    std::vector<int64_t> keys;     // per entry (arrival order): its key
    std::vector<int32_t> last;     // the lookup holding the entry's key's row
    std::vector<int32_t> first;    // where the entry's own lookups start
    std::vector<int32_t> count;    // how many lookups are the entry's
    std::vector<int32_t> out_at;   // the entry's first float in the buffer sent back
  };
  std::vector<Table> tables;
  std::vector<int32_t> back_splits;  // floats per source rank in the buffer sent back
};

// Plans an owner's lookups of what arrived, for `widths.size()` tables.
// Returns an error message, or "" (then *out holds the plan).
std::string PlanServe(const Received& in, const std::vector<int32_t>& widths, Serve* out);

struct GradientSpan {
  const int64_t* keys;  // n keys of the table
  const float* rows;    // n rows of dims[table] floats
  int64_t n;
};

// Sums each table's gradient rows into the entries the route sent (entries'
// keys and tables in sent order; dims[t] + 1 == widths[t]); out gets the
// buffer (as long as the returned rows). Returns an error message (a key the
// route did not send), or "".
std::string ScatterGradients(const std::vector<int64_t>& keys, const std::vector<int32_t>& tables,
                             const std::vector<int32_t>& widths,
                             const std::vector<GradientSpan>& grads, std::vector<float>* out);

// Per table t: from `received` (n floats, the rows' layout: an entry's
// widths[t] - 1 gradient floats, then its flag), the entries at out_at[t]
// (keys[t] their keys) whose flag is set: their keys into keys_out[t] and
// gradient rows into rows_out[t]. Returns an error message, or "".
std::string GatherGradients(const float* received, int64_t n, const std::vector<int32_t>& widths,
                            const std::vector<std::vector<int64_t>>& keys,
                            const std::vector<std::vector<int32_t>>& out_at,
                            std::vector<std::vector<int64_t>>* keys_out,
                            std::vector<std::vector<float>>* rows_out);

// One table's part of the rows an owner sends back.
struct PackTable {
  const float* rows;       // num_rows x dim: the owner's lookups' rows
  int64_t num_rows;
  const int64_t* handles;  // per lookup, its row handle (-1: refused), or nullptr
  const int32_t *last, *first, *count, *out_at;  // per entry (GraphmodExchangeServe's)
  int64_t entries;
  int dim, width;          // width > dim: the entry's refused lookups follow its row
};

// Fills back (total floats): each entry's row (its key's last lookup's) at
// out_at, then (width > dim) how many of its lookups were refused. Returns
// an error message, or "".
std::string PackRows(const std::vector<PackTable>& tables, int64_t total, float* back);

// One table's part of the rows a sender gets back.
struct UnpackTable {
  const int32_t* at;          // per id, its entry's first float (GraphmodExchangeRoute's)
  const int32_t* occurrence;  // per id, its occurrence among its key's ids
  int64_t n;
  int dim, width;             // width > dim: the entry's refused count follows its row
  float* rows;                // n x dim out
  bool* no_row;               // n out: the id is one of its key's refused lookups
};

std::string UnpackRows(const float* returned, int64_t n, const std::vector<UnpackTable>& tables);

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_EXCHANGE_PLAN_H_

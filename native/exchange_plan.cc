#include "native/exchange_plan.h"

#include <limits>

#include "native/bits.h"

namespace graphmod {
namespace {

constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();

// Numbers distinct keys in order of first appearance (tf.unique's order):
// open addressing over a power-of-two array at most half full.
class FirstSeen {
 public:
  explicit FirstSeen(int64_t n) {
    size_t capacity = 16;
    while (capacity < 2 * static_cast<size_t>(n)) capacity *= 2;
    mask_ = capacity - 1;
    slots_.assign(capacity, -1);
  }
  // key's number; a new key gets the next one.
  int32_t Number(int64_t key) {
    for (size_t s = HashKey(key) & mask_;; s = (s + 1) & mask_) {
      const int32_t u = slots_[s];
      if (u < 0) {
        slots_[s] = static_cast<int32_t>(keys_.size());
        keys_.push_back(key);
        return slots_[s];
      }
      if (keys_[u] == key) return u;
    }
  }
  // key's number, or -1 when it has none.
  int32_t Find(int64_t key) const {
    for (size_t s = HashKey(key) & mask_;; s = (s + 1) & mask_) {
      const int32_t u = slots_[s];
      if (u < 0 || keys_[u] == key) return u;
    }
  }
  const std::vector<int64_t>& keys() const { return keys_; }

 private:
  size_t mask_ = 0;
  std::vector<int32_t> slots_;
  std::vector<int64_t> keys_;
};

}  // namespace

std::string PlanRoute(const std::vector<IdSpan>& tables, int size,
                      const std::vector<int32_t>& widths, Route* out) {
  if (size < 1) return "the exchange needs at least 1 rank, got " + std::to_string(size);
  if (widths.size() != tables.size())
    return "widths has " + std::to_string(widths.size()) + " entries for " +
           std::to_string(tables.size()) + " tables";
  const size_t num_tables = tables.size();
  *out = Route();
  out->splits.assign(size, 0);
  out->float_splits.assign(size, 0);
  out->at.resize(num_tables);
  out->occurrence.resize(num_tables);

  // Each table's distinct keys with their counts, and per id its key's number
  // and occurrence.
  std::vector<std::vector<int64_t>> unique(num_tables), counts(num_tables);
  std::vector<std::vector<int32_t>> number(num_tables);
  int64_t entries = 0;
  std::vector<int64_t> floats(size, 0);
  for (size_t t = 0; t < num_tables; ++t) {
    if (widths[t] < 0) return "table " + std::to_string(t) + " has a negative width";
    const IdSpan& span = tables[t];
    if (span.n > kMaxIndex)
      return "table " + std::to_string(t) + " has " + std::to_string(span.n) +
             " ids in one exchange, more than 2^31-1";
    FirstSeen seen(span.n);
    number[t].resize(span.n);
    out->occurrence[t].resize(span.n);
    for (int64_t i = 0; i < span.n; ++i) {
      const int32_t u = seen.Number(span.ids[i]);
      if (static_cast<size_t>(u) == counts[t].size()) counts[t].push_back(0);
      number[t][i] = u;
      out->occurrence[t][i] = static_cast<int32_t>(counts[t][u]++);
    }
    unique[t] = seen.keys();
    for (int64_t key : unique[t]) {
      const int owner = OwnerRank(key, size);
      ++out->splits[owner];
      floats[owner] += widths[t];
    }
    entries += static_cast<int64_t>(unique[t].size());
  }
  int64_t total_floats = 0;
  for (int r = 0; r < size; ++r) {
    total_floats += floats[r];
    out->float_splits[r] = static_cast<int32_t>(floats[r]);
  }
  if (entries > kMaxIndex || total_floats > kMaxIndex)
    return "one exchange would send " + std::to_string(entries) + " keys in " +
           std::to_string(total_floats) + " floats, more than 2^31-1";

  // Sent order: by owner (a counting sort), then table, then first occurrence.
  std::vector<int64_t> next(size, 0), next_float(size, 0);
  for (int r = 1; r < size; ++r) {
    next[r] = next[r - 1] + out->splits[r - 1];
    next_float[r] = next_float[r - 1] + floats[r - 1];
  }
  out->keys.resize(entries);
  out->counts.resize(entries);
  out->tables.resize(entries);
  for (size_t t = 0; t < num_tables; ++t) {
    std::vector<int32_t> float_at(unique[t].size());
    for (size_t u = 0; u < unique[t].size(); ++u) {
      const int owner = OwnerRank(unique[t][u], size);
      const int64_t e = next[owner]++;
      out->keys[e] = unique[t][u];
      out->counts[e] = counts[t][u];
      out->tables[e] = static_cast<int32_t>(t);
      float_at[u] = static_cast<int32_t>(next_float[owner]);
      next_float[owner] += widths[t];
    }
    out->at[t].resize(number[t].size());
    for (size_t i = 0; i < number[t].size(); ++i) out->at[t][i] = float_at[number[t][i]];
  }
  return "";
}

std::string PlanServe(const Received& in, const std::vector<int32_t>& widths, Serve* out) {
  const int64_t num_tables = static_cast<int64_t>(widths.size());
  if (in.size < 1) return "the exchange needs at least 1 rank, got " + std::to_string(in.size);
  int64_t arrived = 0;
  for (int r = 0; r < in.size; ++r) {
    if (in.splits[r] < 0) return "a negative split arrived from rank " + std::to_string(r);
    arrived += in.splits[r];
  }
  if (arrived != in.n)
    return "the splits count " + std::to_string(arrived) + " entries, but " +
           std::to_string(in.n) + " arrived";
  *out = Serve();
  out->tables.resize(num_tables);
  out->back_splits.assign(in.size, 0);

  // Per table: its entries' key numbers and counts (arrival order), each
  // key's total count.
  std::vector<std::vector<int32_t>> number(num_tables);
  std::vector<std::vector<int64_t>> total(num_tables);
  std::vector<FirstSeen> seen;
  seen.reserve(num_tables);
  std::vector<int64_t> per_table(num_tables, 0);
  for (int64_t e = 0; e < in.n; ++e) {
    const int64_t t = in.tables[e];
    if (t < 0 || t >= num_tables)
      return "entry " + std::to_string(e) + " names table " + std::to_string(t) + " of " +
             std::to_string(num_tables);
    ++per_table[t];
  }
  for (int64_t t = 0; t < num_tables; ++t) seen.emplace_back(per_table[t]);

  int64_t floats = 0;
  int rank = 0;
  int64_t rank_end = in.size > 0 ? in.splits[0] : 0;
  for (int64_t e = 0; e < in.n; ++e) {
    while (e >= rank_end) rank_end += in.splits[++rank];
    const int64_t t = in.tables[e];
    const int64_t count = in.counts == nullptr ? 1 : in.counts[e];
    if (count < 1 || count > kMaxIndex)
      return "entry " + std::to_string(e) + " counts " + std::to_string(count) + " lookups";
    Serve::Table& table = out->tables[t];
    const int32_t u = seen[t].Number(in.keys[e]);
    if (static_cast<size_t>(u) == total[t].size()) total[t].push_back(0);
    total[t][u] += count;
    number[t].push_back(u);
    table.keys.push_back(in.keys[e]);
    table.count.push_back(static_cast<int32_t>(count));
    table.out_at.push_back(static_cast<int32_t>(floats));
    floats += widths[t];
    out->back_splits[rank] += widths[t];
    if (floats > kMaxIndex) return "the rows sent back would exceed 2^31-1 floats";
  }

  for (int64_t t = 0; t < num_tables; ++t) {
    Serve::Table& table = out->tables[t];
    const std::vector<int64_t>& keys = seen[t].keys();
    // Each key's lookups are consecutive, keys in order of first arrival.
    std::vector<int64_t> start(keys.size()), taken(keys.size(), 0);
    int64_t lookups = 0;
    for (size_t u = 0; u < keys.size(); ++u) {
      start[u] = lookups;
      lookups += total[t][u];
    }
    if (lookups > kMaxIndex) return "one table's lookups would exceed 2^31-1";
    table.lookups.reserve(lookups);
    for (size_t u = 0; u < keys.size(); ++u)
      table.lookups.insert(table.lookups.end(), total[t][u], keys[u]);
    table.first.resize(number[t].size());
    table.last.resize(number[t].size());
    for (size_t i = 0; i < number[t].size(); ++i) {
      const int32_t u = number[t][i];
      table.first[i] = static_cast<int32_t>(start[u] + taken[u]);
      taken[u] += table.count[i];
      table.last[i] = static_cast<int32_t>(start[u] + total[t][u] - 1);
    }
  }
  return "";
}

std::string ScatterGradients(const std::vector<int64_t>& keys, const std::vector<int32_t>& tables,
                             const std::vector<int32_t>& widths,
                             const std::vector<GradientSpan>& grads, std::vector<float>* out) {
  const size_t num_tables = widths.size();
  if (grads.size() != num_tables)
    return "gradients of " + std::to_string(grads.size()) + " tables for an exchange of " +
           std::to_string(num_tables);
  // Per table, its entries' keys numbered as sent, and where each entry starts.
  std::vector<FirstSeen> seen;
  std::vector<std::vector<int64_t>> entry_at(num_tables);
  std::vector<int64_t> per_table(num_tables, 0);
  for (int32_t t : tables) {
    if (t < 0 || static_cast<size_t>(t) >= num_tables)
      return "an entry names table " + std::to_string(t) + " of " + std::to_string(num_tables);
    ++per_table[t];
  }
  seen.reserve(num_tables);
  for (size_t t = 0; t < num_tables; ++t) seen.emplace_back(per_table[t]);
  int64_t floats = 0;
  for (size_t e = 0; e < keys.size(); ++e) {
    const int32_t t = tables[e];
    if (static_cast<size_t>(seen[t].Number(keys[e])) != entry_at[t].size())
      return "table " + std::to_string(t) + " sent key " + std::to_string(keys[e]) + " twice";
    entry_at[t].push_back(floats);
    floats += widths[t];
  }
  out->assign(floats, 0.0f);
  for (size_t t = 0; t < num_tables; ++t) {
    const int64_t dim = widths[t] - 1;
    const GradientSpan& g = grads[t];
    for (int64_t i = 0; i < g.n; ++i) {
      const int32_t u = seen[t].Find(g.keys[i]);
      if (u < 0)
        return "table " + std::to_string(t) + " has a gradient for key " +
               std::to_string(g.keys[i]) + ", which its lookups did not send";
      float* row = out->data() + entry_at[t][u];
      for (int64_t j = 0; j < dim; ++j) row[j] += g.rows[i * dim + j];
      row[dim] = 1.0f;
    }
  }
  return "";
}

std::string GatherGradients(const float* received, int64_t n, const std::vector<int32_t>& widths,
                            const std::vector<std::vector<int64_t>>& keys,
                            const std::vector<std::vector<int32_t>>& out_at,
                            std::vector<std::vector<int64_t>>* keys_out,
                            std::vector<std::vector<float>>* rows_out) {
  const size_t num_tables = widths.size();
  if (keys.size() != num_tables || out_at.size() != num_tables)
    return "keys and positions of " + std::to_string(keys.size()) + " and " +
           std::to_string(out_at.size()) + " tables for " + std::to_string(num_tables);
  keys_out->assign(num_tables, {});
  rows_out->assign(num_tables, {});
  for (size_t t = 0; t < num_tables; ++t) {
    if (keys[t].size() != out_at[t].size())
      return "table " + std::to_string(t) + " has " + std::to_string(keys[t].size()) +
             " keys for " + std::to_string(out_at[t].size()) + " positions";
    const int64_t dim = widths[t] - 1;
    if (dim < 0) return "table " + std::to_string(t) + " has no flag in its width";
    for (size_t e = 0; e < keys[t].size(); ++e) {
      const int64_t at = out_at[t][e];
      if (at < 0 || at + dim + 1 > n)
        return "table " + std::to_string(t) + "'s entry " + std::to_string(e) + " at " +
               std::to_string(at) + " lies outside the " + std::to_string(n) +
               " floats received";
      if (received[at + dim] == 0.0f) continue;  // no gradient reached it
      (*keys_out)[t].push_back(keys[t][e]);
      (*rows_out)[t].insert((*rows_out)[t].end(), received + at, received + at + dim);
    }
  }
  return "";
}

std::string PackRows(const std::vector<PackTable>& tables, int64_t total, float* back) {
  for (size_t t = 0; t < tables.size(); ++t) {
    const PackTable& p = tables[t];
    const std::string table = "table " + std::to_string(t);
    // refused[i]: refused lookups among the first i.
    std::vector<int64_t> refused;
    if (p.width > p.dim) {
      if (p.handles == nullptr && p.num_rows > 0)
        return table + " has no row handles to count refusals by";
      refused.assign(p.num_rows + 1, 0);
      for (int64_t i = 0; i < p.num_rows; ++i) refused[i + 1] = refused[i] + (p.handles[i] < 0);
    }
    for (int64_t e = 0; e < p.entries; ++e) {
      const int64_t last = p.last[e], first = p.first[e], count = p.count[e], at = p.out_at[e];
      if (last < 0 || last >= p.num_rows || first < 0 || count < 0 || first + count > p.num_rows)
        return table + "'s entry " + std::to_string(e) + " names lookups outside its " +
               std::to_string(p.num_rows);
      if (at < 0 || at + p.width > total)
        return table + "'s entry " + std::to_string(e) + " lies outside the " +
               std::to_string(total) + " floats sent back";
      std::copy(p.rows + last * p.dim, p.rows + (last + 1) * p.dim, back + at);
      if (p.width > p.dim) {
        const int64_t no_row = refused[first + count] - refused[first];
        if (no_row > (int64_t{1} << 24))  // a float holds counts exactly up to 2^24
          return table + "'s entry " + std::to_string(e) + " has " + std::to_string(no_row) +
                 " refused lookups in one step, more than 2^24";
        back[at + p.dim] = static_cast<float>(no_row);
      }
    }
  }
  return "";
}

std::string UnpackRows(const float* returned, int64_t n, const std::vector<UnpackTable>& tables) {
  for (size_t t = 0; t < tables.size(); ++t) {
    const UnpackTable& u = tables[t];
    for (int64_t i = 0; i < u.n; ++i) {
      const int64_t at = u.at[i];
      if (at < 0 || at + u.width > n)
        return "table " + std::to_string(t) + "'s id " + std::to_string(i) + " reads at " +
               std::to_string(at) + ", outside the " + std::to_string(n) + " floats returned";
      std::copy(returned + at, returned + at + u.dim, u.rows + i * u.dim);
      u.no_row[i] = u.width > u.dim && u.occurrence[i] < returned[at + u.dim];
    }
  }
  return "";
}

}  // namespace graphmod

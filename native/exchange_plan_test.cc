// exchange_plan: a simulated exchange between ranks (each rank's Route, the
// all-to-all done by hand, each owner's Serve, rows sent back) delivers each
// id its own key's row; and the plans' orders and counts are the ones
// graphmod/horovod/exchange.py relies on.
#include "native/exchange_plan.h"

#include <map>
#include <memory>
#include <random>
#include <vector>

#include "native/test_check.h"

namespace graphmod {
namespace {

// A row's float j for key k of table t (what an owner "looks up").
float RowValue(int64_t key, int t, int j) {
  return static_cast<float>((key % 1000) * 10 + t) + 0.25f * j;
}

void TestRouteOrderAndCounts() {
  const std::vector<int64_t> a = {7, 3, 7, 7, 9, 3}, b = {3, 5};
  const std::vector<int32_t> widths = {4, 2};
  Route r;
  CHECK(PlanRoute({{a.data(), 6}, {b.data(), 2}}, 3, widths, &r).empty());
  // Entries: owner, then table, then first occurrence.
  CHECK(r.keys.size() == 5);
  int64_t entries = 0, floats = 0;
  for (int owner = 0; owner < 3; ++owner) {
    int last_table = -1;
    for (int e = 0; e < r.splits[owner]; ++e) {
      const int64_t i = entries + e;
      CHECK(OwnerRank(r.keys[i], 3) == owner);
      CHECK(r.tables[i] >= last_table);
      last_table = r.tables[i];
      floats += widths[r.tables[i]];
    }
    entries += r.splits[owner];
  }
  CHECK(entries == 5);
  CHECK(floats == r.float_splits[0] + r.float_splits[1] + r.float_splits[2]);
  CHECK(floats == 3 * 4 + 2 * 2);
  std::map<std::pair<int, int64_t>, int64_t> count;
  for (size_t i = 0; i < r.keys.size(); ++i) count[{r.tables[i], r.keys[i]}] = r.counts[i];
  CHECK((count[{0, 7}] == 3 && count[{0, 3}] == 2 && count[{0, 9}] == 1));
  CHECK((count[{1, 3}] == 1 && count[{1, 5}] == 1));
  // Occurrences number each key's ids in order.
  CHECK((r.occurrence[0] == std::vector<int32_t>{0, 0, 1, 2, 0, 1}));
  CHECK((r.occurrence[1] == std::vector<int32_t>{0, 0}));
  // Ids of one key share their entry.
  CHECK(r.at[0][0] == r.at[0][2] && r.at[0][0] == r.at[0][3] && r.at[0][1] == r.at[0][5]);
  CHECK(r.at[0][0] != r.at[0][1]);
}

void TestErrors() {
  const std::vector<int64_t> a = {1};
  Route r;
  CHECK(!PlanRoute({{a.data(), 1}}, 0, {1}, &r).empty());
  CHECK(!PlanRoute({{a.data(), 1}}, 2, {1, 2}, &r).empty());
  const int64_t keys[] = {1, 2}, tables[] = {0, 5}, counts[] = {1, 0};
  const int32_t splits[] = {2}, short_splits[] = {1};
  Serve s;
  CHECK(PlanServe({keys, nullptr, tables, 2, splits, 1}, {1, 1, 1, 1, 1, 1}, &s).empty());
  CHECK(!PlanServe({keys, nullptr, tables, 2, splits, 1}, {1, 1}, &s).empty());  // table 5 of 2
  CHECK(!PlanServe({keys, nullptr, tables, 2, short_splits, 1}, {1, 1, 1, 1, 1, 1}, &s).empty());
  CHECK(!PlanServe({keys, counts, tables, 2, splits, 1}, {1, 1, 1, 1, 1, 1}, &s).empty());
}

void TestEmpty() {
  Route r;
  CHECK(PlanRoute({{nullptr, 0}, {nullptr, 0}}, 2, {3, 1}, &r).empty());
  CHECK(r.keys.empty() && r.splits[0] == 0 && r.splits[1] == 0 && r.at[1].empty());
  const int32_t splits[] = {0, 0};
  Serve s;
  CHECK(PlanServe({nullptr, nullptr, nullptr, 0, splits, 2}, {3, 1}, &s).empty());
  CHECK(s.tables.size() == 2 && s.tables[0].lookups.empty() && s.back_splits[1] == 0);
}

// Every rank routes its ids, the all-to-all is done by hand, owners serve and
// send rows back (each entry's row, then how many of its lookups were
// refused: here the first lookup of every key), and each rank reads its ids'
// rows where the plan says.
void TestSimulatedExchange(int size, uint32_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<int32_t> dims = {3, 1, 5};
  std::vector<int32_t> widths;
  for (int d : dims) widths.push_back(d + 1);
  std::vector<std::vector<std::vector<int64_t>>> ids(size);  // rank, table, ids
  std::vector<Route> routes(size);
  for (int rank = 0; rank < size; ++rank) {
    std::vector<IdSpan> spans;
    ids[rank].resize(dims.size());
    for (size_t t = 0; t < dims.size(); ++t) {
      const int n = static_cast<int>(rng() % 40);
      for (int i = 0; i < n; ++i) {
        // Small keys (negatives too) that repeat, and now and then an extreme one.
        const int64_t key = rng() % 50 == 0 ? INT64_MIN + static_cast<int64_t>(rng() % 3)
                                            : static_cast<int64_t>(rng() % 30) - 10;
        ids[rank][t].push_back(key);
      }
      spans.push_back({ids[rank][t].data(), static_cast<int64_t>(ids[rank][t].size())});
    }
    CHECK(PlanRoute(spans, size, widths, &routes[rank]).empty());
  }
  // The all-to-all of entries: owner o receives each rank's part for o, ranks in order.
  std::vector<std::vector<float>> returned(size);
  std::vector<std::map<std::pair<int64_t, int64_t>, int64_t>> looked_up(size);
  for (int owner = 0; owner < size; ++owner) {
    std::vector<int64_t> keys, counts, tables;
    std::vector<int32_t> splits;
    for (int rank = 0; rank < size; ++rank) {
      int64_t begin = 0;
      for (int o = 0; o < owner; ++o) begin += routes[rank].splits[o];
      for (int64_t e = begin; e < begin + routes[rank].splits[owner]; ++e) {
        keys.push_back(routes[rank].keys[e]);
        counts.push_back(routes[rank].counts[e]);
        tables.push_back(routes[rank].tables[e]);
      }
      splits.push_back(routes[rank].splits[owner]);
    }
    Serve s;
    CHECK(PlanServe({keys.data(), counts.data(), tables.data(), static_cast<int64_t>(keys.size()),
                     splits.data(), size},
                    widths, &s)
              .empty());
    // Rows: a key's row per lookup; the first lookup of each key is refused.
    std::vector<float> back;
    int64_t total = 0;
    for (int32_t f : s.back_splits) total += f;
    back.assign(total, -1.0f);
    std::map<std::pair<size_t, int64_t>, int> refused_per_key;
    for (size_t t = 0; t < dims.size(); ++t) {
      const Serve::Table& table = s.tables[t];
      std::vector<bool> refused(table.lookups.size(), false);
      for (size_t l = 0; l < table.lookups.size(); ++l) {
        refused[l] = l == 0 || table.lookups[l] != table.lookups[l - 1];
        looked_up[owner][{static_cast<int64_t>(t), table.lookups[l]}]++;
      }
      for (size_t e = 0; e < table.keys.size(); ++e) {
        CHECK(table.lookups[table.last[e]] == table.keys[e]);
        CHECK(table.last[e] + 1 == static_cast<int32_t>(table.lookups.size()) ||
              table.lookups[table.last[e] + 1] != table.keys[e]);
        int no_row = 0;
        for (int l = table.first[e]; l < table.first[e] + table.count[e]; ++l) {
          CHECK(table.lookups[l] == table.keys[e]);
          no_row += refused[l];
        }
        for (int j = 0; j < dims[t]; ++j)
          back[table.out_at[e] + j] = RowValue(table.keys[e], static_cast<int>(t), j);
        back[table.out_at[e] + dims[t]] = static_cast<float>(no_row);
        refused_per_key[{t, table.keys[e]}] += no_row;
      }
    }
    for (auto& kv : refused_per_key) CHECK(kv.second == 1);  // each key's first lookup, once
    // PackRows writes the same buffer from the lookups' rows and handles.
    std::vector<std::vector<float>> lookup_rows(dims.size());
    std::vector<std::vector<int64_t>> handles(dims.size());
    std::vector<PackTable> pack;
    for (size_t t = 0; t < dims.size(); ++t) {
      const Serve::Table& table = s.tables[t];
      for (size_t l = 0; l < table.lookups.size(); ++l) {
        for (int j = 0; j < dims[t]; ++j)
          lookup_rows[t].push_back(RowValue(table.lookups[l], static_cast<int>(t), j));
        handles[t].push_back(l == 0 || table.lookups[l] != table.lookups[l - 1] ? -1 : 7);
      }
      pack.push_back({lookup_rows[t].data(), static_cast<int64_t>(table.lookups.size()),
                      handles[t].data(), table.last.data(), table.first.data(),
                      table.count.data(), table.out_at.data(),
                      static_cast<int64_t>(table.keys.size()), dims[t], widths[t]});
    }
    std::vector<float> packed(total, -1.0f);
    CHECK(PackRows(pack, total, packed.data()).empty());
    CHECK(packed == back);
    CHECK(!PackRows(pack, total - 1, packed.data()).empty() || total == 0);
    for (float v : back) CHECK(v != -1.0f);  // every float of the buffer written
    // The all-to-all back: rank r's part is back_splits[r] floats, in rank order.
    int64_t at = 0;
    for (int rank = 0; rank < size; ++rank) {
      std::vector<float>& to = returned[rank];
      to.insert(to.end(), back.begin() + at, back.begin() + at + s.back_splits[rank]);
      at += s.back_splits[rank];
      CHECK(s.back_splits[rank] == routes[rank].float_splits[owner]);
    }
  }
  // Each id reads its key's row; a key is looked up as often as all ranks read it.
  std::map<std::pair<int64_t, int64_t>, int64_t> reads;
  for (int rank = 0; rank < size; ++rank) {
    // UnpackRows reads each id's row, and whether it is one of its key's
    // refused lookups (its occurrence below the entry's refused count).
    std::vector<std::vector<float>> rows(dims.size());
    std::vector<std::unique_ptr<bool[]>> no_row;
    std::vector<UnpackTable> unpack;
    for (size_t t = 0; t < dims.size(); ++t) {
      const int64_t n = static_cast<int64_t>(ids[rank][t].size());
      rows[t].resize(n * dims[t]);
      no_row.emplace_back(new bool[n > 0 ? n : 1]);
      unpack.push_back({routes[rank].at[t].data(), routes[rank].occurrence[t].data(), n, dims[t],
                        widths[t], rows[t].data(), no_row.back().get()});
    }
    CHECK(UnpackRows(returned[rank].data(), static_cast<int64_t>(returned[rank].size()), unpack)
              .empty());
    for (size_t t = 0; t < dims.size(); ++t)
      for (size_t i = 0; i < ids[rank][t].size(); ++i) {
        const int32_t at = routes[rank].at[t][i];
        for (int j = 0; j < dims[t]; ++j) CHECK(rows[t][i * dims[t] + j] == returned[rank][at + j]);
        CHECK(no_row[t][i] == (routes[rank].occurrence[t][i] < returned[rank][at + dims[t]]));
      }
    for (size_t t = 0; t < dims.size(); ++t) {
      for (size_t i = 0; i < ids[rank][t].size(); ++i) {
        const int64_t key = ids[rank][t][i];
        const int32_t at = routes[rank].at[t][i];
        for (int j = 0; j < dims[t]; ++j)
          CHECK(returned[rank][at + j] == RowValue(key, static_cast<int>(t), j));
        reads[{static_cast<int64_t>(t), key}]++;
        CHECK(returned[rank][at + dims[t]] <= 1.0f);
      }
    }
  }
  std::map<std::pair<int64_t, int64_t>, int64_t> all_looked_up;
  for (auto& per_owner : looked_up)
    for (auto& [k, n] : per_owner) {
      CHECK(OwnerRank(k.second, size) == static_cast<int>(&per_owner - looked_up.data()));
      all_looked_up[k] += n;
    }
  CHECK(all_looked_up == reads);
}

// Gradients go back into the entries sent, summed per key, flagged present;
// an entry without a gradient stays zero and unflagged.
void TestScatterGradients() {
  const std::vector<int64_t> a = {7, 3, 7, 9}, b = {4};
  Route r;
  CHECK(PlanRoute({{a.data(), 4}, {b.data(), 1}}, 2, {3, 2}, &r).empty());
  const std::vector<int64_t> ga = {7, 3, 7}, gb = {};
  const std::vector<float> rows_a = {1, 2, 10, 20, 100, 200};
  std::vector<float> out;
  CHECK(ScatterGradients(r.keys, r.tables, {3, 2},
                         {{ga.data(), rows_a.data(), 3}, {gb.data(), nullptr, 0}}, &out)
            .empty());
  CHECK(out.size() == 3 * 3 + 2);
  for (int i = 0; i < 4; ++i) {
    const float* row = out.data() + r.at[0][i];
    if (a[i] == 7) CHECK(row[0] == 101 && row[1] == 202 && row[2] == 1);
    if (a[i] == 3) CHECK(row[0] == 10 && row[1] == 20 && row[2] == 1);
    if (a[i] == 9) CHECK(row[0] == 0 && row[1] == 0 && row[2] == 0);
  }
  CHECK(out[r.at[1][0]] == 0 && out[r.at[1][0] + 1] == 0);
  const std::vector<int64_t> stray = {5};
  const std::vector<float> one = {1, 1};
  CHECK(ScatterGradients(r.keys, r.tables, {3, 2},
                         {{ga.data(), rows_a.data(), 3}, {stray.data(), one.data(), 1}}, &out)
            .find("key 5") != std::string::npos);
  CHECK(!ScatterGradients(r.keys, r.tables, {3}, {{ga.data(), rows_a.data(), 3}}, &out).empty());

  // The owner's side (one rank: what it sent is what it receives): the
  // entries a gradient reached, with their summed rows.
  CHECK(ScatterGradients(r.keys, r.tables, {3, 2},
                         {{ga.data(), rows_a.data(), 3}, {gb.data(), nullptr, 0}}, &out)
            .empty());
  const int32_t splits[] = {static_cast<int32_t>(r.keys.size())};
  std::vector<int64_t> tables(r.tables.begin(), r.tables.end());
  Serve s;
  CHECK(PlanServe({r.keys.data(), r.counts.data(), tables.data(),
                   static_cast<int64_t>(r.keys.size()), splits, 1},
                  {3, 2}, &s)
            .empty());
  std::vector<std::vector<int64_t>> keys_out;
  std::vector<std::vector<float>> rows_out;
  CHECK(GatherGradients(out.data(), static_cast<int64_t>(out.size()), {3, 2},
                        {s.tables[0].keys, s.tables[1].keys},
                        {s.tables[0].out_at, s.tables[1].out_at}, &keys_out, &rows_out)
            .empty());
  CHECK(keys_out[0].size() == 2 && keys_out[1].empty());  // 7 and 3; not 9, not 4
  for (size_t i = 0; i < keys_out[0].size(); ++i) {
    const float* row = rows_out[0].data() + 2 * i;
    if (keys_out[0][i] == 7) CHECK(row[0] == 101 && row[1] == 202);
    if (keys_out[0][i] == 3) CHECK(row[0] == 10 && row[1] == 20);
    CHECK(keys_out[0][i] == 7 || keys_out[0][i] == 3);
  }
  CHECK(!GatherGradients(out.data(), 2, {3, 2}, {s.tables[0].keys, s.tables[1].keys},
                         {s.tables[0].out_at, s.tables[1].out_at}, &keys_out, &rows_out)
             .empty());  // positions past what arrived
}

}  // namespace
}  // namespace graphmod

int main() {
  graphmod::TestRouteOrderAndCounts();
  graphmod::TestErrors();
  graphmod::TestEmpty();
  graphmod::TestScatterGradients();
  for (int size = 1; size <= 4; ++size)
    for (uint32_t seed = 0; seed < 20; ++seed) graphmod::TestSimulatedExchange(size, seed);
  return graphmod_test::TestExit("exchange_plan_test");
}

// Microbenchmark: the current ColdIndex (copied in native/) vs the prototype.
//   bench <cold|compact> <N>   (one process per run, so RSS is its own)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "compact_index.h"
#include "native/cold_index.h"

using namespace graphmod;

static uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
static int64_t Key(uint64_t i) { return static_cast<int64_t>(SplitMix(i)); }
static double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static long StatusKb(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, field, n) == 0) v = std::atol(line + n + 1);
  std::fclose(f);
  return v;
}

struct Cold {  // ColdIndex as LogTier uses it (record number in `index`)
  ColdIndex ix;
  size_t peak = 0;
  size_t bytes() const { return ix.bytes(); }
  void Prefetch(int64_t k) const { ix.Prefetch(k); }
  bool Upsert(int64_t k, uint32_t rec) {
    const size_t before = ix.bytes();
    bool added;
    ColdIndex::Slot* s = ix.Upsert(k, &added);
    if (ix.bytes() != before) peak = std::max(peak, before + ix.bytes());  // Rehash: both alive
    s->segment = 1;
    s->index = rec;
    return added;
  }
  bool Find(int64_t k, uint32_t* rec) const {
    const ColdIndex::Slot* s = ix.Find(k);
    if (s == nullptr) return false;
    *rec = s->index;
    return true;
  }
  size_t peak_bytes() const { return std::max(peak, ix.bytes()); }
};
struct Compact {
  CompactIndex ix;
  size_t bytes() const { return ix.bytes(); }
  void Prefetch(int64_t k) const { ix.Prefetch(k); }
  bool Upsert(int64_t k, uint32_t rec) { return ix.Upsert(k, rec, nullptr); }
  bool Find(int64_t k, uint32_t* rec) const { return ix.Find(k, rec); }
  size_t peak_bytes() const { return ix.peak_bytes(); }
};

constexpr size_t kAhead = 8, kBatch = 4096;

template <class Ix>
static double Probe(const Ix& ix, size_t n_keys, uint64_t offset, size_t probes, bool prefetch,
                    size_t* hits) {
  std::vector<int64_t> keys(kBatch);
  uint64_t r = 12345;
  double t = 0;
  uint64_t sum = 0;
  for (size_t done = 0; done < probes; done += kBatch) {
    for (auto& k : keys) k = Key(offset + (r = SplitMix(r)) % n_keys);
    const double t0 = Now();
    if (prefetch)
      for (size_t i = 0; i < kAhead; ++i) ix.Prefetch(keys[i]);
    for (size_t i = 0; i < kBatch; ++i) {
      if (prefetch && i + kAhead < kBatch) ix.Prefetch(keys[i + kAhead]);
      uint32_t rec;
      if (ix.Find(keys[i], &rec)) {
        ++*hits;
        sum += rec;
      }
    }
    t += Now() - t0;
  }
  if (sum == 42) std::printf(" ");
  return t * 1e9 / probes;
}

template <class Ix>
static void Run(const char* name, size_t n) {
  Ix* ix = new Ix;
  const long rss0 = StatusKb("VmRSS:");
  double lo = 1e9, hi = 0;
  const double t0 = Now();
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) ix->Prefetch(Key(i + kAhead));
    ix->Upsert(Key(i), static_cast<uint32_t>(i));
    if (i >= n / 10 && (i & 1023) == 0) {
      const double b = double(ix->bytes()) / (i + 1);
      lo = std::min(lo, b), hi = std::max(hi, b);
    }
  }
  const double insert_ns = (Now() - t0) * 1e9 / n;
  const long rss1 = StatusKb("VmRSS:"), hwm = StatusKb("VmHWM:");
  const size_t probes = 4 << 20;
  size_t hits = 0;
  const double present_pf = Probe(*ix, n, 0, probes, true, &hits);
  const double present = Probe(*ix, n, 0, probes, false, &hits);
  const bool all = hits == 2 * probes;
  hits = 0;
  const double absent_pf = Probe(*ix, n, uint64_t{1} << 40, probes, true, &hits);
  const bool none = hits == 0;
  // Updates of present keys (a re-spill, or compaction's relocation), prefetched.
  const double u0 = Now();
  const size_t updates = std::min<size_t>(n, 4 << 20);
  for (size_t i = 0; i < updates; ++i) {
    if (i + kAhead < updates) ix->Prefetch(Key((i + kAhead) * 7919 % n));
    ix->Upsert(Key(i * 7919 % n), static_cast<uint32_t>(i));
  }
  const double update_ns = (Now() - u0) * 1e9 / updates;
  std::printf(
      "%-8s N=%5.1fM  alloc %5.1f B/key (band %4.1f-%4.1f from N/10)  RSS %5.1f B/key  "
      "peak alloc %5.1f B/key  peak RSS %5.1f B/key | find hit %4.0f ns (pf) %4.0f ns (no pf)  "
      "miss %4.0f ns (pf) | insert %4.0f ns  update %4.0f ns %s\n",
      name, n / 1e6, double(ix->bytes()) / n, lo, hi, (rss1 - rss0) * 1024.0 / n,
      double(ix->peak_bytes()) / n, (hwm - rss0) * 1024.0 / n, present_pf, present, absent_pf,
      insert_ns, update_ns, all && none ? "" : "WRONG");
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const size_t n = static_cast<size_t>(std::atof(argv[2]) * 1e6);
  if (std::string(argv[1]) == "cold") Run<Cold>("cold", n);
  else Run<Compact>(argv[1], n);
  return 0;
}

// The storage seam of a table shard: where a shard's keys and records live,
// and the contract every layout meets. TableShard (table_shard.h) and
// ShardedTable (sharded_table.h) see a shard's rows only through it, so a
// layout is one template argument (table.cc picks it from TableConfig::layout).
//
// Layouts today: IndexedArena (indexed_arena.h: a key index of row numbers
// over records that never move) and RowBuckets (row_buckets.h: records
// inline in hash buckets, one memory miss per key).
//
// A row is named by a 32-bit ref. Refs are stable until the layout moves
// rows, which it does only inside Reserve (the shard calls it before each
// insert, and once before a bulk import): that is the layout's one chance to
// grow. A lookup hands out row handles carrying HandleBits(ref); Resolve
// maps such bits back to the row, also after a move, or says they are stale
// (the row was freed, or moved longer ago than the layout remembers).
//
// The contract (checked at compile time by CheckShardStorage<S>(); every
// layout runs the conformance tests of shard_storage_conformance.h):
//
//   class S {
//    public:
//     explicit S(const RecordLayout& layout);
//     static constexpr uint32_t kNoRow = 0xFFFFFFFF;
//     // The live row of key (h = HashKey(key)), or kNoRow.
//     uint32_t Find(int64_t key, uint64_t h) const;
//     // A fresh row for a key Find just said is absent: its header's key is
//     // set, the rest is the caller's to fill. Never moves a row; any room
//     // it needs beyond Reserve's is found without moving.
//     uint32_t Insert(int64_t key, uint64_t h);
//     // Room for `extra` more keys. May move rows (the only place that
//     // may); returns whether it did, so refs kept elsewhere (the change
//     // log's) are rebuilt. `version` is the table version of the lookups
//     // under way (the one their Apply will stamp): a layout that moves rows
//     // keeps handles of those lookups resolvable.
//     bool Reserve(size_t extra, int64_t version);
//     void Erase(uint32_t ref);  // frees a live row
//     char* Record(uint32_t ref) const;
//     // 48 bits a row handle carries below its shard number; Resolve takes
//     // them back (false: stale). MayOwn: whether such bits can come from
//     // this layout at all (for CheckApply's "not this table" error).
//     uint64_t HandleBits(uint32_t ref) const;
//     bool Resolve(uint64_t bits, uint32_t* ref) const;
//     bool MayOwn(uint64_t bits) const;
//     // The lookup pipeline's two prefetch stages, a key's hash alone in
//     // hand: A runs ~16 keys ahead of the probe, B ~8 keys ahead (A's
//     // lines have arrived and may steer what B fetches). For a training
//     // lookup (LookupKind::kTrain) B also fetches what HandleBits reads
//     // beyond the lines it fetches anyway.
//     void PrefetchA(uint64_t h) const;
//     void PrefetchB(uint64_t h, LookupKind kind) const;
//     void Prefetch(uint32_t ref) const;  // a record, ahead of Record(ref)
//     // What Resolve(bits) reads, ahead of it: takes any 48 bits (stale,
//     // of another epoch, never handed out) and fetches nothing outside
//     // the layout's memory for them.
//     void PrefetchHandle(uint64_t bits) const;
//     // fn(ref, record) for the live rows near hash h, until fn has returned
//     // true (a candidate) 8 times or the neighbourhood is exhausted:
//     // eviction samples its victims there.
//     template <class Fn> void VisitNear(uint64_t h, Fn&& fn) const;
//     // fn(ref, record) for every live row.
//     template <class Fn> void ForEachLive(Fn&& fn) const;
//     // Live rows. Written under the shard's mutex, read unlocked by
//     // EmbeddingTable::size() (a relaxed atomic).
//     size_t size() const;
//     // Frees every row; handles made before turn stale.
//     void Reset();
//     int64_t Bytes() const;  // memory held, for the table's memory_bytes()
//   };
//
// A layout is used by one shard under its mutex, so it needs no locking.
#ifndef GRAPHMOD_NATIVE_SHARD_STORAGE_H_
#define GRAPHMOD_NATIVE_SHARD_STORAGE_H_

#include <cstdint>
#include <type_traits>
#include <utility>

#include "native/row_store.h"

namespace graphmod {

// What a lookup makes of the rows it finds, for the layouts' prefetches:
// their values (a read), or their values and handles (a training lookup).
enum class LookupKind { kRead, kTrain };

namespace shard_storage_detail {
struct Visitor {  // a ForEachLive callback, for the check below
  void operator()(uint32_t, const char*) const {}
};
struct Sampler {  // a VisitNear callback
  bool operator()(uint32_t, const char*) const { return true; }
};
}  // namespace shard_storage_detail

// Fails to compile, naming the missing member, unless S meets the contract.
template <class S>
constexpr bool CheckShardStorage() {
  using C = const S;
  static_assert(std::is_constructible<S, const RecordLayout&>::value,
                "a layout is built from a RecordLayout");
  static_assert(S::kNoRow == 0xFFFFFFFFu, "static constexpr uint32_t kNoRow = 0xFFFFFFFF");
  static_assert(
      std::is_same<decltype(std::declval<C&>().Find(int64_t{}, uint64_t{})), uint32_t>::value,
      "uint32_t Find(int64_t key, uint64_t h) const");
  static_assert(
      std::is_same<decltype(std::declval<S&>().Insert(int64_t{}, uint64_t{})), uint32_t>::value,
      "uint32_t Insert(int64_t key, uint64_t h)");
  static_assert(
      std::is_same<decltype(std::declval<S&>().Reserve(size_t{}, int64_t{})), bool>::value,
      "bool Reserve(size_t extra, int64_t version)");
  static_assert(std::is_same<decltype(std::declval<S&>().Erase(uint32_t{})), void>::value,
                "void Erase(uint32_t ref)");
  static_assert(std::is_same<decltype(std::declval<C&>().Record(uint32_t{})), char*>::value,
                "char* Record(uint32_t ref) const");
  static_assert(
      std::is_same<decltype(std::declval<C&>().HandleBits(uint32_t{})), uint64_t>::value,
      "uint64_t HandleBits(uint32_t ref) const");
  static_assert(std::is_same<decltype(std::declval<C&>().Resolve(uint64_t{},
                                                                 static_cast<uint32_t*>(nullptr))),
                             bool>::value,
                "bool Resolve(uint64_t bits, uint32_t* ref) const");
  static_assert(std::is_same<decltype(std::declval<C&>().MayOwn(uint64_t{})), bool>::value,
                "bool MayOwn(uint64_t bits) const");
  static_assert(std::is_same<decltype(std::declval<C&>().PrefetchA(uint64_t{})), void>::value,
                "void PrefetchA(uint64_t h) const");
  static_assert(
      std::is_same<decltype(std::declval<C&>().PrefetchB(uint64_t{}, LookupKind{})), void>::value,
      "void PrefetchB(uint64_t h, LookupKind kind) const");
  static_assert(
      std::is_same<decltype(std::declval<C&>().PrefetchHandle(uint64_t{})), void>::value,
      "void PrefetchHandle(uint64_t bits) const");
  static_assert(std::is_same<decltype(std::declval<C&>().Prefetch(uint32_t{})), void>::value,
                "void Prefetch(uint32_t ref) const");
  static_assert(std::is_same<decltype(std::declval<C&>().VisitNear(
                                 uint64_t{}, shard_storage_detail::Sampler{})),
                             void>::value,
                "template <class Fn> void VisitNear(uint64_t h, Fn&& fn) const");
  static_assert(std::is_same<decltype(std::declval<C&>().ForEachLive(
                                 shard_storage_detail::Visitor{})),
                             void>::value,
                "template <class Fn> void ForEachLive(Fn&& fn) const");
  static_assert(std::is_same<decltype(std::declval<C&>().size()), size_t>::value,
                "size_t size() const");
  static_assert(std::is_same<decltype(std::declval<S&>().Reset()), void>::value, "void Reset()");
  static_assert(std::is_same<decltype(std::declval<C&>().Bytes()), int64_t>::value,
                "int64_t Bytes() const");
  return true;
}

// A row handle: shard number in bits 48..62 over the layout's 48 bits.
// Negative: no row.
inline int64_t ShardHandle(int64_t shard, uint64_t bits) {
  return (shard << kHandleShardShift) | static_cast<int64_t>(bits);
}
inline uint64_t HandleBitsOf(int64_t handle) {
  return static_cast<uint64_t>(handle) & ((uint64_t{1} << kHandleShardShift) - 1);
}

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_SHARD_STORAGE_H_

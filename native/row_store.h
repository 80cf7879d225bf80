// The record format every layout shares, row handles, and the contract of a
// row store: the arena layout's half that holds records (indexed_arena.h
// pairs it with the key index; shard_storage.h is the contract of a whole
// layout).
//
// A record is [RecordHeader | values | slot rows], `stride` bytes apart; the
// values are one block of the layout's values_type and each of num_slots
// slot rows a block of its slots_type (row_codec.h: float32, or smaller).
// A row store hands out row numbers (32-bit, per shard) for records; the
// key index maps keys to them. A record never moves while its row is live:
// lookups return row handles that optimizers use later in the same step,
// and the index is rebuilt without touching the records.
//
// The contract (checked at compile time by CheckRowStore<Store>(); every
// implementation also runs the conformance tests of row_store_conformance.h):
//
//   class Store {
//    public:
//     explicit Store(const RecordLayout& layout);
//     // A record for `key`: its header's key is set, the rest is the
//     // caller's to fill. Never moves another record.
//     uint32_t Allocate(int64_t key);
//     // The record of a live row. Called per key on the hot path: inline,
//     // no locks (the shard's mutex is held), no virtual call.
//     char* Record(uint32_t row) const;
//     int64_t Key(uint32_t row) const;
//     void Prefetch(uint32_t row) const;  // a hint, ahead of Record(row)
//     // Generations: advanced each time a row is freed, so a handle kept
//     // past its row's removal (and the row's reuse) is recognised as stale.
//     uint8_t Generation(uint32_t row) const;
//     // Whether `row` is live and was when a handle with `generation` was
//     // made (any row number, even one never handed out, is a valid query).
//     bool IsCurrent(uint64_t row, uint8_t generation) const;
//     // A bound above every row number ever handed out; never shrinks (a
//     // handle beyond it cannot come from this store).
//     uint64_t RowBound() const;
//     void Free(uint32_t row);
//     // fn(row, record) for every live row, in row order.
//     template <class Fn> void ForEachLive(Fn&& fn) const;
//     // Frees every row (generations advance: old handles turn stale).
//     void Reset();
//     int64_t Bytes() const;  // memory held, for the table's memory_bytes()
//   };
//
// A store is used by one shard under its mutex, so it needs no locking.
#ifndef GRAPHMOD_NATIVE_ROW_STORE_H_
#define GRAPHMOD_NATIVE_ROW_STORE_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "native/row_codec.h"

namespace graphmod {

struct RecordHeader {
  int64_t key;
  int64_t last_seen;  // the largest `now` of a training lookup of the key
  uint32_t count;     // sightings (saturating)
  uint32_t version;   // table version of the last lookup or update
};
static_assert(sizeof(RecordHeader) == 24, "record header must stay packed");

inline RecordHeader* Header(char* rec) { return reinterpret_cast<RecordHeader*>(rec); }
inline const RecordHeader* Header(const char* rec) {
  return reinterpret_cast<const RecordHeader*>(rec);
}
// The record's values as floats: a float32 layout's only (ValueBlock and
// row_codec.h for any).
inline float* Values(char* rec) { return reinterpret_cast<float*>(rec + sizeof(RecordHeader)); }
inline const float* Values(const char* rec) {
  return reinterpret_cast<const float*>(rec + sizeof(RecordHeader));
}

struct RecordLayout {
  int dim = 0;
  int num_slots = 0;
  StorageType values_type = StorageType::kFloat32;
  StorageType slots_type = StorageType::kFloat32;
  size_t values_bytes = 0;  // the values' block
  size_t slot_bytes = 0;    // one slot row's block
  size_t stride = 0;  // bytes per record, a multiple of 8 (the header's alignment)

  static RecordLayout For(int dim, int num_slots,
                          StorageType values_type = StorageType::kFloat32,
                          StorageType slots_type = StorageType::kFloat32) {
    RecordLayout l{dim, num_slots, values_type, slots_type, RowBytes(values_type, dim),
                   RowBytes(slots_type, dim), 0};
    const size_t bytes = sizeof(RecordHeader) + l.values_bytes + l.slot_bytes * num_slots;
    l.stride = (bytes + 7) & ~size_t{7};
    return l;
  }
  // Every row in float32: records are read and updated in place.
  bool float32() const {
    return values_type == StorageType::kFloat32 && slots_type == StorageType::kFloat32;
  }
  // What a lookup reads of a record: its header and values (the slots
  // wait for the update).
  size_t lookup_bytes() const { return sizeof(RecordHeader) + values_bytes; }
  char* ValueBlock(char* rec) const { return rec + sizeof(RecordHeader); }
  const char* ValueBlock(const char* rec) const { return rec + sizeof(RecordHeader); }
  char* SlotBlocks(char* rec) const { return rec + sizeof(RecordHeader) + values_bytes; }
  const char* SlotBlocks(const char* rec) const {
    return rec + sizeof(RecordHeader) + values_bytes;
  }
};

// Row handle: shard number in bits 48..62, the row's generation in bits
// 40..47 and its row number in the low 40 bits. Negative: no row.
constexpr int kHandleRowBits = 40;
constexpr int kHandleGenerationBits = 8;
constexpr int kHandleShardShift = kHandleRowBits + kHandleGenerationBits;

inline int64_t MakeHandle(int64_t shard, uint8_t generation, uint32_t row) {
  return (shard << kHandleShardShift) | (static_cast<int64_t>(generation) << kHandleRowBits) |
         row;
}
inline uint64_t HandleShard(int64_t handle) {
  return static_cast<uint64_t>(handle) >> kHandleShardShift;
}

namespace row_store_detail {
struct Visitor {  // a ForEachLive callback, for the check below
  void operator()(uint32_t, const char*) const {}
};
}  // namespace row_store_detail

// Fails to compile, naming the missing member, unless Store meets the
// contract above.
template <class Store>
constexpr bool CheckRowStore() {
  using S = const Store;
  static_assert(std::is_constructible<Store, const RecordLayout&>::value,
                "a row store is built from a RecordLayout");
  static_assert(std::is_same<decltype(std::declval<Store&>().Allocate(int64_t{})), uint32_t>::value,
                "uint32_t Allocate(int64_t key)");
  static_assert(std::is_same<decltype(std::declval<S&>().Record(uint32_t{})), char*>::value,
                "char* Record(uint32_t row) const");
  static_assert(std::is_same<decltype(std::declval<S&>().Key(uint32_t{})), int64_t>::value,
                "int64_t Key(uint32_t row) const");
  static_assert(std::is_same<decltype(std::declval<S&>().Prefetch(uint32_t{})), void>::value,
                "void Prefetch(uint32_t row) const");
  static_assert(std::is_same<decltype(std::declval<S&>().Generation(uint32_t{})), uint8_t>::value,
                "uint8_t Generation(uint32_t row) const");
  static_assert(
      std::is_same<decltype(std::declval<S&>().IsCurrent(uint64_t{}, uint8_t{})), bool>::value,
      "bool IsCurrent(uint64_t row, uint8_t generation) const");
  static_assert(std::is_same<decltype(std::declval<S&>().RowBound()), uint64_t>::value,
                "uint64_t RowBound() const");
  static_assert(std::is_same<decltype(std::declval<Store&>().Free(uint32_t{})), void>::value,
                "void Free(uint32_t row)");
  static_assert(std::is_same<decltype(std::declval<S&>().ForEachLive(
                                 row_store_detail::Visitor{})),
                             void>::value,
                "template <class Fn> void ForEachLive(Fn&& fn) const");
  static_assert(std::is_same<decltype(std::declval<Store&>().Reset()), void>::value,
                "void Reset()");
  static_assert(std::is_same<decltype(std::declval<S&>().Bytes()), int64_t>::value,
                "int64_t Bytes() const");
  return true;
}

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_ROW_STORE_H_

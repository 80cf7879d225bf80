// How a record stores a row of d floats (TableConfig::values_type and
// slots_type): as float32, or smaller on request, with arithmetic always in
// float32 (a row is decoded, used or updated, and encoded back).
//
//   float32   4 bytes a value, as is.
//   float16   2 bytes, IEEE half: round to nearest even; finite values beyond
//             +-65504 and infinities store as +-65504 (an optimizer slot
//             that overflowed to infinity would stop its row); NaN stays NaN.
//             Magnitudes below 2^-24 store as zero.
//   bfloat16  2 bytes, the top half of a float32: round to nearest even,
//             float32's range.
//   int8      row-wise: float32 scale and bias, then d one-byte codes
//             (0..255); a value reads code * scale + bias. Encoding takes
//             bias = the row's minimum and scale = (max - min) / 255 and
//             rounds each value to the nearest code: an error of about
//             scale / 2 per value (plus the float rounding of scale and
//             bias), renewed at each update of the row. A row holding a NaN
//             or an infinity stores NaN scale and bias: it reads all NaN.
//
// A block is one row's bytes in that form (RowBytes). Checkpoints and the
// portable export keep blocks as they are; only lookups decode.
#ifndef GRAPHMOD_NATIVE_ROW_CODEC_H_
#define GRAPHMOD_NATIVE_ROW_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace graphmod {

enum class StorageType : uint8_t { kFloat32, kFloat16, kBFloat16, kInt8 };

// An int8 block's scale and bias come first.
constexpr size_t kInt8Params = 2 * sizeof(float);

inline size_t RowBytes(StorageType t, int d) {
  switch (t) {
    case StorageType::kFloat32: return sizeof(float) * d;
    case StorageType::kFloat16:
    case StorageType::kBFloat16: return 2 * static_cast<size_t>(d);
    case StorageType::kInt8: return kInt8Params + d;
  }
  return 0;
}

// "float32", "float16", "bfloat16", "int8" (the names TableSettings takes).
bool ParseStorageType(const std::string& name, StorageType* out);
const char* StorageTypeName(StorageType t);

// Copies a row of d floats inline, in fixed-size blocks the compiler turns
// into vector moves (memcpy of a runtime size, which a plain loop also
// becomes, is a library call per row). Always inlined: called from many
// places, the compiler outlined it, a call per row (a tenth of a lookup).
__attribute__((always_inline)) inline void CopyRow(float* __restrict dst,
                                                   const float* __restrict src, int d) {
  int k = 0;
  for (; k + 8 <= d; k += 8) std::memcpy(dst + k, src + k, 8 * sizeof(float));
  if (k + 4 <= d) {
    std::memcpy(dst + k, src + k, 4 * sizeof(float));
    k += 4;
  }
  for (; k < d; ++k) std::memcpy(dst + k, src + k, sizeof(float));
}

// The conversions of the smaller forms, one row per call.
void DecodeSmall(StorageType t, const char* block, int d, float* out);
void EncodeSmall(StorageType t, const float* row, int d, char* block);

// A block of RowBytes(t, d) bytes to d floats, and back. float32 is a copy,
// inline (the common case costs what it did before there were forms).
__attribute__((always_inline)) inline void DecodeRow(StorageType t, const char* block, int d,
                                                     float* out) {
  if (t == StorageType::kFloat32) {
    CopyRow(out, reinterpret_cast<const float*>(block), d);
  } else {
    DecodeSmall(t, block, d, out);
  }
}
inline void EncodeRow(StorageType t, const float* row, int d, char* block) {
  if (t == StorageType::kFloat32) {
    std::memcpy(block, row, sizeof(float) * d);
  } else {
    EncodeSmall(t, row, d, block);
  }
}

// Rows of d values, n of them, between forms (a checkpoint of another form,
// or float32 given to or asked of a table that stores smaller).
void ConvertRows(StorageType from, const char* in, StorageType to, char* out, int64_t n, int d);

namespace row_codec_detail {
// The portable conversions of one value (F16C, where the CPU has it, must
// give the same bits, NaNs read quiet; row_codec_test checks every half).
uint16_t FloatToHalf(float x);
float HalfToFloat(uint16_t h);
uint16_t FloatToBFloat16(float x);
float BFloat16ToFloat(uint16_t b);
// Whether the float16 conversions use the CPU's F16C instructions.
bool UsesF16C();
void SetUseF16C(bool use);  // tests: the portable path on any CPU
}  // namespace row_codec_detail

}  // namespace graphmod

#endif  // GRAPHMOD_NATIVE_ROW_CODEC_H_

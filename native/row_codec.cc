#include "native/row_codec.h"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace graphmod {

bool ParseStorageType(const std::string& name, StorageType* out) {
  for (StorageType t : {StorageType::kFloat32, StorageType::kFloat16, StorageType::kBFloat16,
                        StorageType::kInt8}) {
    if (name == StorageTypeName(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

const char* StorageTypeName(StorageType t) {
  switch (t) {
    case StorageType::kFloat32: return "float32";
    case StorageType::kFloat16: return "float16";
    case StorageType::kBFloat16: return "bfloat16";
    case StorageType::kInt8: return "int8";
  }
  return "?";
}

namespace row_codec_detail {
namespace {

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float FromBits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

constexpr float kHalfMax = 65504.f;

#if defined(__x86_64__)
// (The F16C paths use 256-bit AVX loads and stores too.)
bool use_f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
#else
bool use_f16c = false;
#endif

}  // namespace

uint16_t FloatToHalf(float x) {
  const uint32_t u = Bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffff;
  if (a > 0x7f800000) return sign | 0x7e00 | ((a >> 13) & 0x3ff);  // NaN, quiet
  if (a >= Bits(kHalfMax)) return sign | 0x7bff;  // saturates (infinities too)
  if (a < 0x38800000) {
    // Below 2^-14 the half is subnormal: its step is 2^-24. Adding 0.5
    // (whose float ulp is 2^-24) rounds |x| to that step, to nearest even,
    // in the FPU; the result's low mantissa bits are the half's.
    return sign | static_cast<uint16_t>(Bits(FromBits(a) + 0.5f) - Bits(0.5f));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits
  // to nearest even (a carry into the exponent is the right result).
  const uint32_t odd = (a >> 13) & 1;
  return sign | static_cast<uint16_t>((a - ((127u - 15u) << 23) + 0xfff + odd) >> 13);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in float
    const float v = static_cast<float>(m) * (1.f / 16777216.f);
    return FromBits(Bits(v) | sign);
  }
  // A NaN reads quiet, as F16C makes it (a signalling NaN's quiet bit set).
  if (e == 31) return FromBits(sign | 0x7f800000 | ((m != 0 ? m | 0x200 : 0) << 13));
  return FromBits(sign | ((e + 127 - 15) << 23) | (m << 13));
}

uint16_t FloatToBFloat16(float x) {
  const uint32_t u = Bits(x);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

float BFloat16ToFloat(uint16_t b) { return FromBits(static_cast<uint32_t>(b) << 16); }

bool UsesF16C() { return use_f16c; }
void SetUseF16C(bool use) {
#if defined(__x86_64__)
  use_f16c = use && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
#else
  (void)use;
#endif
}

}  // namespace row_codec_detail

namespace {

using row_codec_detail::BFloat16ToFloat;
using row_codec_detail::FloatToBFloat16;
using row_codec_detail::FloatToHalf;
using row_codec_detail::HalfToFloat;

#if defined(__x86_64__)
// Eight values at a time with F16C (the CPUs of the last decade have it);
// the tail through the portable conversion, which gives the same bits.
// Blocks may sit at any byte (a slot row after an int8 row): unaligned
// loads and stores, and memcpy for single values.
__attribute__((target("avx,f16c"))) void DecodeHalfF16C(const char* in, int d, float* out) {
  int k = 0;
  for (; k + 8 <= d; k += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * k));
    _mm256_storeu_ps(out + k, _mm256_cvtph_ps(h));
  }
  for (; k < d; ++k) {
    uint16_t h;
    std::memcpy(&h, in + 2 * k, 2);
    out[k] = HalfToFloat(h);
  }
}
__attribute__((target("avx,f16c"))) void EncodeHalfF16C(const float* in, int d, char* out) {
  const __m256 lo = _mm256_set1_ps(-65504.f), hi = _mm256_set1_ps(65504.f);
  int k = 0;
  for (; k + 8 <= d; k += 8) {
    // max/min return their second operand when either is NaN: NaN passes.
    const __m256 v = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_loadu_ps(in + k)));
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * k), h);
  }
  for (; k < d; ++k) {
    const uint16_t h = FloatToHalf(in[k]);
    std::memcpy(out + 2 * k, &h, 2);
  }
}
#endif

void DecodeHalf(const char* block, int d, float* out) {
#if defined(__x86_64__)
  if (row_codec_detail::UsesF16C()) return DecodeHalfF16C(block, d, out);
#endif
  for (int k = 0; k < d; ++k) {
    uint16_t h;
    std::memcpy(&h, block + 2 * k, 2);
    out[k] = HalfToFloat(h);
  }
}

void EncodeHalf(const float* row, int d, char* block) {
#if defined(__x86_64__)
  if (row_codec_detail::UsesF16C()) return EncodeHalfF16C(row, d, block);
#endif
  for (int k = 0; k < d; ++k) {
    const uint16_t h = FloatToHalf(row[k]);
    std::memcpy(block + 2 * k, &h, 2);
  }
}

}  // namespace

void DecodeSmall(StorageType t, const char* block, int d, float* out) {
  switch (t) {
    case StorageType::kFloat32:
      std::memcpy(out, block, sizeof(float) * d);
      return;
    case StorageType::kFloat16:
      DecodeHalf(block, d, out);
      return;
    case StorageType::kBFloat16:
      for (int k = 0; k < d; ++k) {
        uint16_t b;
        std::memcpy(&b, block + 2 * k, 2);
        out[k] = BFloat16ToFloat(b);
      }
      return;
    case StorageType::kInt8: {
      float scale, bias;
      std::memcpy(&scale, block, 4);
      std::memcpy(&bias, block + 4, 4);
      const uint8_t* code = reinterpret_cast<const uint8_t*>(block + kInt8Params);
      // Two roundings (a product, then a sum), as the portable export's
      // Mul and Add make them: a served row reads the same bits.
      for (int k = 0; k < d; ++k) {
        const volatile float scaled = static_cast<float>(code[k]) * scale;
        out[k] = scaled + bias;
      }
      return;
    }
  }
}

void EncodeSmall(StorageType t, const float* row, int d, char* block) {
  switch (t) {
    case StorageType::kFloat32:
      std::memcpy(block, row, sizeof(float) * d);
      return;
    case StorageType::kFloat16:
      EncodeHalf(row, d, block);
      return;
    case StorageType::kBFloat16:
      for (int k = 0; k < d; ++k) {
        const uint16_t b = FloatToBFloat16(row[k]);
        std::memcpy(block + 2 * k, &b, 2);
      }
      return;
    case StorageType::kInt8: {
      // The range in double: a finite row spanning more than float's
      // largest value still gets a finite scale. A row holding a NaN or an
      // infinity stores NaN as its scale and bias, so it reads NaN
      // throughout, as broken as it is (never a silently finite row).
      double lo = 0, hi = 0;
      bool finite = true;
      for (int k = 0; k < d; ++k) {
        finite = finite && std::isfinite(row[k]);
        lo = k == 0 ? row[k] : std::min<double>(lo, row[k]);
        hi = k == 0 ? row[k] : std::max<double>(hi, row[k]);
      }
      const double step = (hi - lo) / 255.0;
      const float scale = finite ? static_cast<float>(step) : std::nanf("");
      const float bias = finite ? static_cast<float>(lo) : std::nanf("");
      std::memcpy(block, &scale, 4);
      std::memcpy(block + 4, &bias, 4);
      uint8_t* code = reinterpret_cast<uint8_t*>(block + kInt8Params);
      for (int k = 0; k < d; ++k) {
        // To the nearest code (>= 0.5: truncation rounds).
        const double q = step > 0 && finite ? (row[k] - lo) / step + 0.5 : 0.0;
        code[k] = static_cast<uint8_t>(std::min(255.0, std::max(0.0, q)));
      }
      return;
    }
  }
}

void ConvertRows(StorageType from, const char* in, StorageType to, char* out, int64_t n, int d) {
  const size_t in_bytes = RowBytes(from, d), out_bytes = RowBytes(to, d);
  if (from == to) {
    std::memcpy(out, in, in_bytes * n);
    return;
  }
  std::vector<float> row(d);
  for (int64_t i = 0; i < n; ++i) {
    DecodeRow(from, in + i * in_bytes, d, row.data());
    EncodeRow(to, row.data(), d, out + i * out_bytes);
  }
}

}  // namespace graphmod

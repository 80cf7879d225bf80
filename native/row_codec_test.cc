// Tests of native/row_codec.h: each form's rounding (to nearest, ties to
// even), range and round trips, every 16-bit pattern where that is all of
// them, and the F16C path against the portable one bit for bit.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "native/row_codec.h"
#include "native/test_check.h"

using graphmod::StorageType;
namespace detail = graphmod::row_codec_detail;

namespace {

float FromBits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

void TestNames() {
  StorageType t;
  for (const char* name : {"float32", "float16", "bfloat16", "int8"}) {
    CHECK(graphmod::ParseStorageType(name, &t));
    CHECK(std::string(graphmod::StorageTypeName(t)) == name);
  }
  CHECK(!graphmod::ParseStorageType("fp16", &t));
  CHECK(!graphmod::ParseStorageType("", &t));
  CHECK(graphmod::RowBytes(StorageType::kFloat32, 16) == 64);
  CHECK(graphmod::RowBytes(StorageType::kFloat16, 16) == 32);
  CHECK(graphmod::RowBytes(StorageType::kBFloat16, 3) == 6);
  CHECK(graphmod::RowBytes(StorageType::kInt8, 16) == 24);
}

void TestHalf() {
  // Every half that is a number reads back as itself.
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = detail::HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(x)) {
      CHECK((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0);
      CHECK(std::isnan(detail::HalfToFloat(detail::FloatToHalf(x))));
      continue;
    }
    if (std::isinf(x)) {
      CHECK(detail::FloatToHalf(x) == ((h & 0x8000) | 0x7bff));  // saturates
      continue;
    }
    CHECK(detail::FloatToHalf(x) == h);
  }
  // Decoding: F16C and the portable path agree on every half, NaNs quiet.
  if (detail::UsesF16C()) {
    std::vector<uint16_t> all(65536);
    for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
    std::vector<float> hw(65536), sw(65536);
    graphmod::DecodeRow(StorageType::kFloat16, reinterpret_cast<const char*>(all.data()), 65536,
                        hw.data());
    detail::SetUseF16C(false);
    graphmod::DecodeRow(StorageType::kFloat16, reinterpret_cast<const char*>(all.data()), 65536,
                        sw.data());
    detail::SetUseF16C(true);
    CHECK(std::memcmp(hw.data(), sw.data(), sizeof(float) * 65536) == 0);
  }
  CHECK(detail::HalfToFloat(0x3c00) == 1.f);
  CHECK(detail::HalfToFloat(0x0001) == std::ldexp(1.f, -24));
  CHECK(detail::HalfToFloat(0x7bff) == 65504.f);
  // Ties go to the even neighbour, normal and subnormal.
  CHECK(detail::FloatToHalf(1.f + std::ldexp(1.f, -11)) == 0x3c00);
  CHECK(detail::FloatToHalf(1.f + 3 * std::ldexp(1.f, -11)) == 0x3c02);
  CHECK(detail::FloatToHalf(std::nextafter(1.f + std::ldexp(1.f, -11), 2.f)) == 0x3c01);
  CHECK(detail::FloatToHalf(std::ldexp(1.f, -25)) == 0x0000);
  CHECK(detail::FloatToHalf(3 * std::ldexp(1.f, -25)) == 0x0002);
  CHECK(detail::FloatToHalf(std::ldexp(1.f, -26)) == 0x0000);
  CHECK(detail::FloatToHalf(-std::ldexp(1.f, -30)) == 0x8000);
  // The largest subnormal rounds up into the smallest normal.
  CHECK(detail::FloatToHalf(std::ldexp(1.f, -14) - std::ldexp(1.f, -26)) == 0x0400);
  // Range: saturation, not infinity.
  CHECK(detail::FloatToHalf(70000.f) == 0x7bff);
  CHECK(detail::FloatToHalf(-1e30f) == 0xfbff);
  CHECK(detail::FloatToHalf(std::numeric_limits<float>::infinity()) == 0x7bff);
  CHECK(detail::FloatToHalf(65519.f) == 0x7bff);
  CHECK(std::isnan(detail::HalfToFloat(detail::FloatToHalf(std::nanf("")))));
  // Nearest, on random floats in range: no other half is closer.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exp(-26, 16);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::ldexp(1.f + (rng() % 1000000) / 1e6f, static_cast<int>(exp(rng)));
    if (x >= 65504.f) continue;
    const uint16_t h = detail::FloatToHalf(x);
    const double err = std::fabs(double{detail::HalfToFloat(h)} - x);
    const double below = std::fabs(double{detail::HalfToFloat(h - (h > 0))} - x);
    const double above = std::fabs(double{detail::HalfToFloat(h + (h < 0x7bff))} - x);
    CHECK(err <= below && err <= above);
  }
}

void TestBFloat16() {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = detail::BFloat16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(x)) {
      CHECK(std::isnan(detail::BFloat16ToFloat(detail::FloatToBFloat16(x))));
      continue;
    }
    CHECK(detail::FloatToBFloat16(x) == b);
  }
  CHECK(detail::FloatToBFloat16(1.f + std::ldexp(1.f, -8)) == 0x3f80);  // tie: even
  CHECK(detail::FloatToBFloat16(1.f + 3 * std::ldexp(1.f, -8)) == 0x3f82);
  CHECK(detail::FloatToBFloat16(std::nextafter(1.f + std::ldexp(1.f, -8), 2.f)) == 0x3f81);
  // A signalling NaN stays a NaN (rounding must not carry it into infinity).
  CHECK(std::isnan(detail::BFloat16ToFloat(detail::FloatToBFloat16(FromBits(0x7f800001)))));
  CHECK(std::isnan(detail::BFloat16ToFloat(detail::FloatToBFloat16(FromBits(0xffffffff)))));
}

// Whole rows of every form: tails (d not a multiple of 8), rows longer
// than the 64-value chunks, F16C against the portable path.
void TestRows() {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 0.3f);
  for (int d : {1, 3, 8, 13, 16, 64, 100, 257}) {
    std::vector<float> row(d), back(d), again(d);
    for (float& v : row) v = normal(rng);
    for (StorageType t : {StorageType::kFloat32, StorageType::kFloat16, StorageType::kBFloat16,
                          StorageType::kInt8}) {
      std::vector<char> block(graphmod::RowBytes(t, d)), block2(block.size());
      graphmod::EncodeRow(t, row.data(), d, block.data());
      graphmod::DecodeRow(t, block.data(), d, back.data());
      // A decoded row encodes to the same block (checkpoints, conversions).
      graphmod::EncodeRow(t, back.data(), d, block2.data());
      if (t != StorageType::kInt8) CHECK(block == block2);
      graphmod::DecodeRow(t, block2.data(), d, again.data());
      float lo = row[0], hi = row[0];
      for (float v : row) lo = std::min(lo, v), hi = std::max(hi, v);
      for (int k = 0; k < d; ++k) {
        const float x = row[k], y = back[k];
        switch (t) {
          case StorageType::kFloat32: CHECK(x == y); break;
          case StorageType::kFloat16:
            CHECK(y == detail::HalfToFloat(detail::FloatToHalf(x)));
            break;
          case StorageType::kBFloat16:
            CHECK(y == detail::BFloat16ToFloat(detail::FloatToBFloat16(x)));
            break;
          case StorageType::kInt8: {
            const float step = (hi - lo) / 255.f;
            CHECK(std::fabs(x - y) <= step * 0.5f + 1e-6f);
            // Re-encoding a decoded row moves no value by more than rounding.
            CHECK(std::fabs(again[k] - y) <= 1e-6f);
            break;
          }
        }
      }
      if (t == StorageType::kInt8) {
        float scale, bias;
        std::memcpy(&scale, block.data(), 4);
        std::memcpy(&bias, block.data() + 4, 4);
        CHECK(bias == lo);
        CHECK(std::fabs(scale * 255.f - (hi - lo)) <= 1e-6f);
      }
    }
    // The F16C path and the portable one give the same bits, both ways.
    if (detail::UsesF16C()) {
      std::vector<float> special = row;
      special[0] = 70000.f;
      if (d > 2) special[2] = -std::numeric_limits<float>::infinity();
      if (d > 1) special[1] = std::ldexp(1.f, -25) * 3;
      std::vector<char> hw(2 * d), sw(2 * d);
      std::vector<float> hw_back(d), sw_back(d);
      graphmod::EncodeRow(StorageType::kFloat16, special.data(), d, hw.data());
      graphmod::DecodeRow(StorageType::kFloat16, hw.data(), d, hw_back.data());
      detail::SetUseF16C(false);
      graphmod::EncodeRow(StorageType::kFloat16, special.data(), d, sw.data());
      graphmod::DecodeRow(StorageType::kFloat16, hw.data(), d, sw_back.data());
      detail::SetUseF16C(true);
      CHECK(hw == sw);
      CHECK(std::memcmp(hw_back.data(), sw_back.data(), 4 * d) == 0);
    }
  }
  // F16C on random bit patterns (every exponent), against the portable path.
  if (detail::UsesF16C()) {
    std::vector<float> x(4096);
    for (int round = 0; round < 64; ++round) {
      for (float& v : x) {
        v = FromBits(static_cast<uint32_t>(rng()));
        if (std::isnan(v)) v = 0.5f;  // NaN payloads may differ; NaN-ness is checked above
      }
      std::vector<char> hw(2 * x.size()), sw(2 * x.size());
      graphmod::EncodeRow(StorageType::kFloat16, x.data(), static_cast<int>(x.size()), hw.data());
      detail::SetUseF16C(false);
      graphmod::EncodeRow(StorageType::kFloat16, x.data(), static_cast<int>(x.size()), sw.data());
      detail::SetUseF16C(true);
      CHECK(hw == sw);
    }
  }
  // int8: a row holding a NaN or an infinity reads NaN throughout (never a
  // silently finite row); a finite row wider than float's largest value
  // still gets a finite scale.
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (int at : {0, 2}) {
      std::vector<float> r = {0.5f, -0.25f, 1.f, 0.f};
      r[at] = bad;
      std::vector<char> b(graphmod::RowBytes(StorageType::kInt8, 4));
      std::vector<float> o(4);
      graphmod::EncodeRow(StorageType::kInt8, r.data(), 4, b.data());
      graphmod::DecodeRow(StorageType::kInt8, b.data(), 4, o.data());
      for (float v : o) CHECK(std::isnan(v));
    }
  }
  {
    std::vector<float> wide = {-3e38f, 3e38f, 0.f}, o(3);
    std::vector<char> b(graphmod::RowBytes(StorageType::kInt8, 3));
    graphmod::EncodeRow(StorageType::kInt8, wide.data(), 3, b.data());
    float scale;
    std::memcpy(&scale, b.data(), 4);
    CHECK(std::isfinite(scale) && scale > 2e36f);
    graphmod::DecodeRow(StorageType::kInt8, b.data(), 3, o.data());
    CHECK(o[0] == -3e38f && std::fabs(o[2]) <= scale);
  }
  // A constant row: scale 0, every value exact.
  std::vector<float> flat(5, 0.25f), out(5);
  std::vector<char> block(graphmod::RowBytes(StorageType::kInt8, 5));
  graphmod::EncodeRow(StorageType::kInt8, flat.data(), 5, block.data());
  graphmod::DecodeRow(StorageType::kInt8, block.data(), 5, out.data());
  CHECK(out == flat);
}

// A block may start at any byte (a slot row after an int8 row of odd dim):
// the same bits at an odd address as at an aligned one.
void TestUnalignedBlocks() {
  const int d = 19;
  std::vector<float> row(d), back(d), aligned_back(d);
  for (int k = 0; k < d; ++k) row[k] = 0.37f * static_cast<float>(k) - 3.1f;
  for (StorageType t : {StorageType::kFloat32, StorageType::kFloat16, StorageType::kBFloat16,
                        StorageType::kInt8}) {
    const size_t bytes = graphmod::RowBytes(t, d);
    std::vector<char> aligned(bytes), odd(bytes + 1);
    graphmod::EncodeRow(t, row.data(), d, aligned.data());
    graphmod::EncodeRow(t, row.data(), d, odd.data() + 1);
    CHECK(std::memcmp(aligned.data(), odd.data() + 1, bytes) == 0);
    graphmod::DecodeRow(t, odd.data() + 1, d, back.data());
    graphmod::DecodeRow(t, aligned.data(), d, aligned_back.data());
    CHECK(back == aligned_back);
  }
}

void TestConvertRows() {
  const int d = 6, n = 3;
  std::vector<float> rows(n * d);
  for (int i = 0; i < n * d; ++i) rows[i] = 0.1f * static_cast<float>(i) - 0.7f;
  std::vector<char> half(n * 2 * d), from_f32(n * 2 * d), back(n * 4 * d);
  graphmod::ConvertRows(StorageType::kFloat32, reinterpret_cast<const char*>(rows.data()),
                        StorageType::kFloat16, half.data(), n, d);
  for (int i = 0; i < n; ++i)
    graphmod::EncodeRow(StorageType::kFloat16, rows.data() + i * d, d, from_f32.data() + i * 2 * d);
  CHECK(half == from_f32);
  graphmod::ConvertRows(StorageType::kFloat16, half.data(), StorageType::kFloat32, back.data(), n,
                        d);
  std::vector<char> again(half.size());
  graphmod::ConvertRows(StorageType::kFloat32, back.data(), StorageType::kFloat16, again.data(), n,
                        d);
  CHECK(again == half);
}

}  // namespace

int main() {
  TestNames();
  TestHalf();
  TestBFloat16();
  TestRows();
  TestUnalignedBlocks();
  TestConvertRows();
  return graphmod_test::TestExit("row_codec_test");
}

// Element types and host-side conversions shared by the CPU reference, the CPU
// backend and the CUDA kernels' host code. Header-only; no dependencies.
//
// Thread-safety: all functions are pure.
#ifndef SOFTMAX_KERNELS_DTYPE_H_
#define SOFTMAX_KERNELS_DTYPE_H_

#include <cstdint>
#include <cstring>

namespace softmax {

// Numbering matches softmax.v1.DType on the wire (0 is "unspecified").
enum class DType : int { kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3 };

inline constexpr int ItemSize(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }
inline const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

inline float BitsToFloat(uint32_t bits) { float f; std::memcpy(&f, &bits, 4); return f; }
inline uint32_t FloatToBits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }

// bfloat16 is the high half of a float32; rounding is to nearest even, NaN stays NaN.
inline float BFloat16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }
inline uint16_t FloatToBFloat16(float f) {
  uint32_t bits = FloatToBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// IEEE binary16 <-> binary32, round to nearest even, subnormals, inf and NaN kept.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return BitsToFloat(sign);
    // Subnormal: value = mantissa * 2^-24.
    float value = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return sign ? -value : value;
  }
  return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}
inline uint16_t FloatToHalf(float f) {
  const uint32_t bits = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;           // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;          // overflow -> inf (>= 65520)
  if (abs < 0x38800000u) {                                // subnormal or zero
    if (abs < 0x33000000u) return sign;                   // < 2^-25 rounds to 0
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;                // 14..24
    uint32_t value = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (value & 1u))) ++value;
    return sign | static_cast<uint16_t>(value);
  }
  uint32_t value = abs - 0x38000000u;                     // rebias 127 -> 15
  value += 0xfffu + ((value >> 13) & 1u);
  return sign | static_cast<uint16_t>(value >> 13);
}

// Loads element i of a little-endian buffer of `dtype` as float.
inline float LoadAsFloat(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kFloat32: { float f; std::memcpy(&f, static_cast<const char*>(data) + 4 * i, 4); return f; }
    case DType::kFloat16: { uint16_t h; std::memcpy(&h, static_cast<const char*>(data) + 2 * i, 2); return HalfToFloat(h); }
    case DType::kBFloat16: { uint16_t h; std::memcpy(&h, static_cast<const char*>(data) + 2 * i, 2); return BFloat16ToFloat(h); }
  }
  return 0.0f;
}
// Stores `value`, rounded to `dtype`, as element i.
inline void StoreFromFloat(void* data, DType dtype, int64_t i, float value) {
  switch (dtype) {
    case DType::kFloat32: std::memcpy(static_cast<char*>(data) + 4 * i, &value, 4); return;
    case DType::kFloat16: { uint16_t h = FloatToHalf(value); std::memcpy(static_cast<char*>(data) + 2 * i, &h, 2); return; }
    case DType::kBFloat16: { uint16_t h = FloatToBFloat16(value); std::memcpy(static_cast<char*>(data) + 2 * i, &h, 2); return; }
  }
}

}  // namespace softmax

#endif  // SOFTMAX_KERNELS_DTYPE_H_

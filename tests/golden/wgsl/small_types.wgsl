fn ember_isnan_f32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn ember_lt_f32(a: f32, b: f32) -> bool { return a < b && !ember_isnan_f32(a) && !ember_isnan_f32(b); }
fn ember_eq_f32(a: f32, b: f32) -> bool { return a == b && !ember_isnan_f32(a) && !ember_isnan_f32(b); }
fn ember_max_f32(a: f32, b: f32) -> f32 { return select(b, a, ember_isnan_f32(a) || (a > b && !ember_isnan_f32(b))); }
fn ember_nonzero_f32(x: f32) -> bool { return x != 0.0f || ember_isnan_f32(x); }
fn ember_unpack_u8(word: u32, index: i32) -> u32 { return (word >> (u32(index & 3) * 8u)) & 0xffu; }
fn ember_unpack_i8(word: u32, index: i32) -> i32 {
  return bitcast<i32>(word << (24u - u32(index & 3) * 8u)) >> 24u;
}
fn ember_unpack_u16(word: u32, index: i32) -> u32 {
  return (word >> (u32(index & 1) * 16u)) & 0xffffu;
}
fn ember_unpack_i16(word: u32, index: i32) -> i32 {
  return bitcast<i32>(word << (16u - u32(index & 1) * 16u)) >> 16u;
}
fn ember_f16_to_f32(bits: u32) -> f32 {
  let sign = (bits & 0x8000u) << 16u;
  let exponent = (bits >> 10u) & 0x1fu;
  let mantissa = bits & 0x3ffu;
  if (exponent == 0x1fu) { return bitcast<f32>(sign | 0x7f800000u | (mantissa << 13u)); }
  if (exponent != 0u) { return bitcast<f32>(sign | ((exponent + 112u) << 23u) | (mantissa << 13u)); }
  if (mantissa == 0u) { return bitcast<f32>(sign); }
  let top = firstLeadingBit(mantissa);  // a subnormal half is mantissa * 2^-24: normalize it
  return bitcast<f32>(sign | ((top + 103u) << 23u) | ((mantissa << (23u - top)) & 0x7fffffu));
}
fn ember_f32_to_f16(value: f32) -> u32 {
  let bits = bitcast<u32>(value);
  let sign = (bits >> 16u) & 0x8000u;
  let magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) { return sign | 0x7e00u | ((magnitude >> 13u) & 0x3ffu); }
  if (magnitude >= 0x477ff000u) { return sign | 0x7c00u; }
  if (magnitude >= 0x38800000u) {  // a normal half: round the mantissa to nearest even, rebias the exponent
    return sign | ((magnitude + 0xfffu + ((magnitude >> 13u) & 1u) - 0x38000000u) >> 13u);
  }
  let exponent = magnitude >> 23u;
  if (exponent < 102u) { return sign; }
  let mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  let shift = 126u - exponent;
  let half = 1u << (shift - 1u);
  let rest = mantissa & ((1u << shift) - 1u);
  let quotient = mantissa >> shift;
  return sign | (quotient + select(0u, 1u, rest > half || (rest == half && (quotient & 1u) == 1u)));
}
fn ember_round_f16(value: f32) -> f32 { return ember_f16_to_f32(ember_f32_to_f16(value)); }
@group(0) @binding(0) var<storage, read_write> data0: array<atomic<u32>>;
@group(0) @binding(1) var<storage, read> data1: array<u32>;
@group(0) @binding(2) var<storage, read> data2: array<u32>;
@compute @workgroup_size(64)
fn small_types_0(@builtin(global_invocation_id) id: vec3<u32>) {
  let gid = i32(id.x);
  if (gid >= 6i) { return; }
  let v0: u32 = ember_unpack_u16(data1[gid >> 1u], gid);
  let v1: f32 = f32(v0);
  let v2: i32 = ember_unpack_i8(data2[gid >> 2u], gid);
  let v3: i32 = (((v2 * 3i) << 24u) >> 24u);
  let v4: f32 = ember_round_f16(f32(v3));
  let v5: f32 = v4;
  let v6: bool = ember_lt_f32(v1, v5);
  let word7 = &data0[gid >> 2u];
  let shift7 = u32(gid & 3) * 8u;
  atomicAnd(word7, ~(0xffu << shift7));
  atomicOr(word7, select(0u, 1u, v6) << shift7);
}

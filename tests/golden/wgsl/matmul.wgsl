var<private> ember_zero: u32;  // 0 at run time, unknown to the compiler (set from id.z)
fn ember_opaque_f32(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) | ember_zero); }
@group(0) @binding(0) var<storage, read_write> data0: array<f32>;
@group(0) @binding(1) var<storage, read> data1: array<f32>;
@group(0) @binding(2) var<storage, read> data2: array<f32>;
@compute @workgroup_size(64)
fn matmul_0(@builtin(global_invocation_id) id: vec3<u32>) {
  ember_zero = id.z;
  let gid = i32(id.x);
  if (gid >= 16i) { return; }
  let v0: i32 = (gid % 2i);
  let v1: i32 = (v0 * 4i);
  let v2: i32 = (gid / 2i);
  let v3: i32 = (v2 * 16i);
  let v4: i32 = (v1 + v3);
  let v5: i32 = (v2 * 66i);
  let v6: i32 = (v5 + 33i);
  let v7: i32 = (v1 + 3i);
  let v8: i32 = (v1 + 2i);
  let v9: i32 = (v1 + 1i);
  var acc10: f32 = ember_opaque_f32(0.0f);
  var acc11: f32 = ember_opaque_f32(0.0f);
  var acc12: f32 = ember_opaque_f32(0.0f);
  var acc13: f32 = ember_opaque_f32(0.0f);
  var acc14: f32 = ember_opaque_f32(0.0f);
  var acc15: f32 = ember_opaque_f32(0.0f);
  var acc16: f32 = ember_opaque_f32(0.0f);
  var acc17: f32 = ember_opaque_f32(0.0f);
  for (var loop1: i32 = 0i; loop1 < 33i; loop1++) {
    let v18: i32 = (loop1 + v6);
    let v19: f32 = data1[v18];
    let v20: i32 = (loop1 * 8i);
    let v21: i32 = (v7 + v20);
    let v22: f32 = data2[v21];
    let v23: f32 = (v19 * v22);
    let v24: i32 = (v8 + v20);
    let v25: f32 = data2[v24];
    let v26: f32 = (v19 * v25);
    let v27: i32 = (v9 + v20);
    let v28: f32 = data2[v27];
    let v29: f32 = (v19 * v28);
    let v30: i32 = (v1 + v20);
    let v31: f32 = data2[v30];
    let v32: f32 = (v19 * v31);
    let v33: i32 = (loop1 + v5);
    let v34: f32 = data1[v33];
    let v35: f32 = (v34 * v22);
    let v36: f32 = (v34 * v25);
    let v37: f32 = (v34 * v28);
    let v38: f32 = (v34 * v31);
    acc10 = (acc10 + v23);
    acc11 = (acc11 + v26);
    acc12 = (acc12 + v29);
    acc13 = (acc13 + v32);
    acc14 = (acc14 + v35);
    acc15 = (acc15 + v36);
    acc16 = (acc16 + v37);
    acc17 = (acc17 + v38);
  }
  data0[v4] = acc17;
  let v40: i32 = (v9 + v3);
  data0[v40] = acc16;
  let v42: i32 = (v8 + v3);
  data0[v42] = acc15;
  let v44: i32 = (v7 + v3);
  data0[v44] = acc14;
  let v46: i32 = (v3 + 8i);
  let v47: i32 = (v1 + v46);
  data0[v47] = acc13;
  let v49: i32 = (v9 + v46);
  data0[v49] = acc12;
  let v51: i32 = (v8 + v46);
  data0[v51] = acc11;
  let v53: i32 = (v7 + v46);
  data0[v53] = acc10;
}

var<private> ember_zero: u32;  // 0 at run time, unknown to the compiler (set from id.z)
fn ember_opaque_f32(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) | ember_zero); }
@group(0) @binding(0) var<storage, read_write> data0: array<f32>;
@group(0) @binding(1) var<storage, read> data1: array<f32>;
@compute @workgroup_size(64)
fn padded_permuted_view_0(@builtin(global_invocation_id) id: vec3<u32>) {
  ember_zero = id.z;
  let gid = i32(id.x);
  if (gid >= 60i) { return; }
  let v0: i32 = (gid % 6i);
  let v1: i32 = (gid / 6i);
  let v2: i32 = (v1 % 2i);
  let v3: i32 = (v2 * 6i);
  let v4: i32 = (gid / 12i);
  let v5: i32 = (v4 * 12i);
  let v6: i32 = (v3 + v5);
  let v7: i32 = (v0 + v6);
  let v8: bool = (0i < v4);
  let v9: bool = (0i < v0);
  let v10: bool = (v8 & v9);
  let v11: bool = (v0 < 4i);
  let v12: bool = (v10 & v11);
  let v13: i32 = (v4 + -1i);
  let v14: i32 = (v0 * 4i);
  let v15: i32 = (v14 + -4i);
  let v16: i32 = (v2 * 12i);
  let v17: i32 = (v15 + v16);
  let v18: i32 = (v13 + v17);
  let v19: f32 = select(0.0f, data1[v18], v12);
  let v20: f32 = select(-1.0f, v19, v12);
  let v21: f32 = (v20 * 2.0f);
  let v22: f32 = ember_opaque_f32(v21 + 1.0f);
  data0[v7] = v22;
}

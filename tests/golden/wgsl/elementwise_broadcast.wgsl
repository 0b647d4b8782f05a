fn ember_isnan_f32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn ember_lt_f32(a: f32, b: f32) -> bool { return a < b && !ember_isnan_f32(a) && !ember_isnan_f32(b); }
fn ember_eq_f32(a: f32, b: f32) -> bool { return a == b && !ember_isnan_f32(a) && !ember_isnan_f32(b); }
fn ember_max_f32(a: f32, b: f32) -> f32 { return select(b, a, ember_isnan_f32(a) || (a > b && !ember_isnan_f32(b))); }
fn ember_nonzero_f32(x: f32) -> bool { return x != 0.0f || ember_isnan_f32(x); }
@group(0) @binding(0) var<storage, read_write> data0: array<f32>;
@group(0) @binding(1) var<storage, read> data1: array<f32>;
@group(0) @binding(2) var<storage, read> data2: array<f32>;
@group(0) @binding(3) var<storage, read> data3: array<f32>;
@group(0) @binding(4) var<storage, read> data4: array<f32>;
@compute @workgroup_size(64)
fn elementwise_broadcast_0(@builtin(global_invocation_id) id: vec3<u32>) {
  let gid = i32(id.x);
  if (gid >= 60i) { return; }
  let v0: i32 = (gid % 4i);
  let v1: i32 = (gid / 4i);
  let v2: i32 = (v1 % 5i);
  let v3: i32 = (v2 * 4i);
  let v4: i32 = (gid / 20i);
  let v5: i32 = (v4 * 20i);
  let v6: i32 = (v3 + v5);
  let v7: i32 = (v0 + v6);
  let v8: i32 = (v4 * 4i);
  let v9: i32 = (v0 + v8);
  let v10: f32 = data1[v9];
  let v11: f32 = data2[v2];
  let v12: f32 = (v10 * v11);
  let v13: f32 = data3[v0];
  let v14: f32 = (v12 + v13);
  let v15: f32 = ember_max_f32(v14, -105.0f);
  let v16: bool = ember_lt_f32(105.0f, v15);
  let v17: f32 = select(v15, 105.0f, v16);
  let v18: f32 = (v17 * 1.4426950216293335f);
  let v19: f32 = trunc(v18);
  let v20: f32 = (v19 * 0.693145751953125f);
  let v21: f32 = (v17 - v20);
  let v22: f32 = (v19 * 1.428606765330187e-06f);
  let v23: f32 = (v21 - v22);
  let v24: f32 = (v23 * 1.4426950216293335f);
  let v25: f32 = exp2(v24);
  let v26: f32 = (v19 * 0.5f);
  let v27: f32 = trunc(v26);
  let v28: f32 = exp2(v27);
  let v29: f32 = (v25 * v28);
  let v30: f32 = (v19 - v27);
  let v31: f32 = exp2(v30);
  let v32: f32 = (v29 * v31);
  let v33: f32 = data4[v2];
  let v34: f32 = ember_max_f32(v32, v33);
  data0[v7] = v34;
}

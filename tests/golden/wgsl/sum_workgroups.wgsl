var<private> ember_zero: u32;  // 0 at run time, unknown to the compiler (set from id.z)
fn ember_opaque_f64(x: f64) -> f64 { return bitcast<f64>(bitcast<u64>(x) | u64(ember_zero)); }
@group(0) @binding(0) var<storage, read_write> data0: array<f64>;
@group(0) @binding(1) var<storage, read> data1: array<f64>;
var<workgroup> ember_shared8: array<f64, 256>;
@compute @workgroup_size(256)
fn sum_workgroups_0(@builtin(global_invocation_id) id: vec3<u32>, @builtin(local_invocation_index) local_index: u32, @builtin(workgroup_id) workgroup: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  ember_zero = id.z;
  let ember_group = i32(workgroup.x + workgroup.y * groups.x);
  if (ember_group >= 3i) { return; }
  let ember_lid = i32(local_index);
  let v0: i32 = (ember_group * 512i);
  let v1: i32 = (ember_lid + v0);
  let v2: f64 = data1[v1];
  let v3: f64 = ember_opaque_f64(ember_opaque_f64(0.0lf) + v2);
  let v4: i32 = (ember_lid + 256i);
  let v5: i32 = (v4 + v0);
  let v6: f64 = data1[v5];
  let v7: f64 = ember_opaque_f64(v3 + v6);
  ember_shared8[ember_lid] = v7;
  workgroupBarrier();
  for (var stride8: i32 = 128i; stride8 > 0i; stride8 = stride8 >> 1u) {
    if (ember_lid < stride8) { ember_shared8[ember_lid] = (ember_shared8[ember_lid] + ember_shared8[ember_lid + stride8]); }
    workgroupBarrier();
  }
  let g9: f64 = ember_shared8[0];
  data0[ember_group] = g9;
}

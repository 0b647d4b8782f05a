@group(0) @binding(0) var<storage, read_write> data0: array<f64>;
@group(0) @binding(1) var<storage, read> data1: array<f64>;
var<workgroup> ember_shared6: array<f64, 256>;
@compute @workgroup_size(256)
fn sum_workgroups_0(@builtin(global_invocation_id) id: vec3<u32>, @builtin(local_invocation_index) local_index: u32, @builtin(workgroup_id) workgroup: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  let ember_group = i32(workgroup.x + workgroup.y * groups.x);
  if (ember_group >= 3i) { return; }
  let ember_lid = i32(local_index);
  let v0: i32 = (ember_group * 512i);
  var acc1: f64 = 0.0lf;
  for (var loop1: i32 = 0i; loop1 < 2i; loop1++) {
    let v2: i32 = (loop1 * 256i);
    let v3: i32 = (v2 + ember_lid);
    let v4: i32 = (v3 + v0);
    let v5: f64 = data1[v4];
    acc1 = (acc1 + v5);
  }
  ember_shared6[ember_lid] = acc1;
  workgroupBarrier();
  for (var stride6: i32 = 128i; stride6 > 0i; stride6 = stride6 >> 1u) {
    if (ember_lid < stride6) { ember_shared6[ember_lid] = (ember_shared6[ember_lid] + ember_shared6[ember_lid + stride6]); }
    workgroupBarrier();
  }
  let g7: f64 = ember_shared6[0];
  data0[ember_group] = g7;
}

var<private> ember_zero: u32;  // 0 at run time, unknown to the compiler (set from id.z)
fn ember_opaque_f32(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) | ember_zero); }
@group(0) @binding(0) var<storage, read_write> data0: array<f32>;
@group(0) @binding(1) var<storage, read> data1: array<f32>;
@compute @workgroup_size(64)
fn reduce_0(@builtin(global_invocation_id) id: vec3<u32>) {
  ember_zero = id.z;
  let gid = i32(id.x);
  if (gid >= 15i) { return; }
  let v0: i32 = (gid % 5i);
  let v1: i32 = (gid / 5i);
  let v2: i32 = (v1 * 85i);
  var acc3: f32 = ember_opaque_f32(0.0f);
  for (var loop1: i32 = 0i; loop1 < 17i; loop1++) {
    let v4: i32 = (loop1 * 5i);
    let v5: i32 = (v4 + v2);
    let v6: i32 = (v0 + v5);
    let v7: f32 = data1[v6];
    acc3 = (acc3 + v7);
  }
  data0[gid] = acc3;
}

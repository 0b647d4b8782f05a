#pragma OPENCL EXTENSION cl_khr_fp64 : enable
__kernel void reduce_0(__global float* restrict data0, __global const float* restrict data1) {
  if (get_global_id(0) >= 15) return;
  int gid = (int)get_global_id(0);
    int v0 = (gid%5);
    int v1 = (gid/5);
    int v2 = (v1*85);
    float acc3 = 0.0f;
    for (int loop1 = 0; loop1 < 17; loop1++) {
      int v4 = (loop1*5);
      int v5 = (v4+v2);
      int v6 = (v0+v5);
      float v7 = data1[v6];
      acc3 += v7;
    }
    data0[gid] = acc3;
}

#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#ifndef EMBER_HALF
#define EMBER_HALF
float ember_half_to_float(ushort value) { return vload_half(0, (const __private half*)&value); }
ushort ember_float_to_half(float value) {
  ushort bits; vstore_half_rte(value, 0, (__private half*)&bits); return bits; }
#endif
__kernel void small_types_0(__global uchar* restrict data0, __global const ushort* restrict data1, __global const char* restrict data2) {
  if (get_global_id(0) >= 6) return;
  int gid = (int)get_global_id(0);
    ushort v0 = data1[gid];
    float v1 = ((float)(v0));
    char v2 = data2[gid];
    char v3 = (v2*((char)3));
    ushort v4 = ember_float_to_half(v3);
    float v5 = ember_half_to_float(v4);
    uchar v6 = (v1<v5);
    data0[gid] = v6;
}

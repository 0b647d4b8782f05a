#pragma OPENCL EXTENSION cl_khr_fp64 : enable
__kernel __attribute__((reqd_work_group_size(256, 1, 1))) void sum_workgroups_0(__global double* restrict data0, __global const double* restrict data1) {
  int ember_lid = (int)get_local_id(0);
  int ember_group = (int)get_group_id(0);
  __local double ember_shared8[256];
    int v0 = (ember_group*512);
    int v1 = (ember_lid+v0);
    double v2 = data1[v1];
    double v3 = (0.0+v2);
    int v4 = (ember_lid+256);
    int v5 = (v4+v0);
    double v6 = data1[v5];
    double v7 = (v3+v6);
    ember_shared8[ember_lid] = v7;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride8 = 128; stride8 > 0; stride8 >>= 1) {
      if (ember_lid < stride8) { ember_shared8[ember_lid] += ember_shared8[ember_lid + stride8]; }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
    double g9 = ember_shared8[0];
    data0[ember_group] = g9;
}

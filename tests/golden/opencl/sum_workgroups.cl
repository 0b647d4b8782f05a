#pragma OPENCL EXTENSION cl_khr_fp64 : enable
__kernel __attribute__((reqd_work_group_size(256, 1, 1))) void sum_workgroups_0(__global double* restrict data0, __global const double* restrict data1) {
  int ember_lid = (int)get_local_id(0);
  int ember_group = (int)get_group_id(0);
  __local double ember_shared6[256];
    int v0 = (ember_group*512);
    double acc1 = 0.0;
    for (int loop1 = 0; loop1 < 2; loop1++) {
      int v2 = (loop1*256);
      int v3 = (v2+ember_lid);
      int v4 = (v3+v0);
      double v5 = data1[v4];
      acc1 += v5;
    }
    ember_shared6[ember_lid] = acc1;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride6 = 128; stride6 > 0; stride6 >>= 1) {
      if (ember_lid < stride6) { ember_shared6[ember_lid] += ember_shared6[ember_lid + stride6]; }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
    double g7 = ember_shared6[0];
    data0[ember_group] = g7;
}

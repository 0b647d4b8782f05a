#pragma OPENCL EXTENSION cl_khr_fp64 : enable
__kernel void padded_permuted_view_0(__global float* restrict data0, __global const float* restrict data1) {
  if (get_global_id(0) >= 60) return;
  int gid = (int)get_global_id(0);
    int v0 = (gid%6);
    int v1 = (gid/6);
    int v2 = (v1%2);
    int v3 = (v2*6);
    int v4 = (gid/12);
    int v5 = (v4*12);
    int v6 = (v3+v5);
    int v7 = (v0+v6);
    uchar v8 = (0<v4);
    uchar v9 = (0<v0);
    uchar v10 = (v8&v9);
    uchar v11 = (v0<4);
    uchar v12 = (v10&v11);
    int v13 = (v4+(-1));
    int v14 = (v0*4);
    int v15 = (v14+(-4));
    int v16 = (v2*12);
    int v17 = (v15+v16);
    int v18 = (v13+v17);
    float v19 = (v12?data1[v18]:0.0f);
    float v20 = (v12?v19:(-1.0f));
    float v21 = (v20*2.0f);
    float v22 = (v21+1.0f);
    data0[v7] = v22;
}

#pragma OPENCL EXTENSION cl_khr_fp64 : enable
__kernel __attribute__((reqd_work_group_size(256, 1, 1))) void softmax_workgroups_0(__global float* restrict data0, __global const float* restrict data1) {
  int ember_lid = (int)get_local_id(0);
  int ember_group = (int)get_group_id(0);
  __local float ember_shared10[256];
  __local float ember_shared43[256];
    int v0 = (ember_group*300);
    int v1 = (ember_lid+v0);
    float v2 = data1[v1];
    int v3 = (ember_lid+256);
    uchar v4 = (v3<300);
    int v5 = (v4?v3:299);
    int v6 = (v5+v0);
    float v7 = data1[v6];
    float v8 = (v4?v7:(-INFINITY));
    float v9 = (((v2)>(v8))|((v2)!=(v2))?(v2):(v8));
    ember_shared10[ember_lid] = v9;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride10 = 128; stride10 > 0; stride10 >>= 1) {
      if (ember_lid < stride10) { ember_shared10[ember_lid] = (((ember_shared10[ember_lid + stride10])>(ember_shared10[ember_lid]))|((ember_shared10[ember_lid + stride10])!=(ember_shared10[ember_lid + stride10]))?(ember_shared10[ember_lid + stride10]):(ember_shared10[ember_lid])); }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
    float g11 = ember_shared10[0];
    float v12 = (v2-g11);
    uchar v13 = (v12<(-105.0f));
    float v14 = (v13?0.0f:v12);
    float v15 = (v14*1.4426950216293335f);
    float v16 = trunc(v15);
    float v17 = (v16*0.693145751953125f);
    float v18 = (v14-v17);
    float v19 = (v16*1.428606765330187e-06f);
    float v20 = (v18-v19);
    float v21 = (v20*1.4426950216293335f);
    float v22 = exp2(v21);
    float v23 = exp2(v16);
    float v24 = (v22*v23);
    float v25 = (v13?0.0f:v24);
    float v26 = (0.0f+v25);
    float v27 = (v7-g11);
    uchar v28 = (v27<(-105.0f));
    float v29 = (v28?0.0f:v27);
    float v30 = (v29*1.4426950216293335f);
    float v31 = trunc(v30);
    float v32 = (v31*0.693145751953125f);
    float v33 = (v29-v32);
    float v34 = (v31*1.428606765330187e-06f);
    float v35 = (v33-v34);
    float v36 = (v35*1.4426950216293335f);
    float v37 = exp2(v36);
    float v38 = exp2(v31);
    float v39 = (v37*v38);
    float v40 = (v28?0.0f:v39);
    float v41 = (v4?v40:0.0f);
    float v42 = (v26+v41);
    ember_shared43[ember_lid] = v42;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride43 = 128; stride43 > 0; stride43 >>= 1) {
      if (ember_lid < stride43) { ember_shared43[ember_lid] += ember_shared43[ember_lid + stride43]; }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
    float g44 = ember_shared43[0];
    float v45 = (v25/g44);
    data0[v1] = v45;
    float v46 = (v40/g44);
    data0[v6] = v46;
}

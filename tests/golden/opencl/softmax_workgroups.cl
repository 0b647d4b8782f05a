#pragma OPENCL EXTENSION cl_khr_fp64 : enable
__kernel __attribute__((reqd_work_group_size(256, 1, 1))) void softmax_workgroups_0(__global float* restrict data0, __global const float* restrict data1) {
  int ember_lid = (int)get_local_id(0);
  int ember_group = (int)get_group_id(0);
  __local float ember_shared9[256];
  __local float ember_shared33[256];
    int v0 = (ember_group*300);
    float acc1 = (-INFINITY);
    for (int loop2 = 0; loop2 < 2; loop2++) {
      int v2 = (loop2*256);
      int v3 = (v2+ember_lid);
      uchar v4 = (v3<300);
      int v5 = (v4?v3:299);
      int v6 = (v5+v0);
      float v7 = data1[v6];
      float v8 = (v4?v7:(-INFINITY));
      acc1 = (((v8)>(acc1))|((v8)!=(v8))?(v8):(acc1));
    }
    ember_shared9[ember_lid] = acc1;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride9 = 128; stride9 > 0; stride9 >>= 1) {
      if (ember_lid < stride9) { ember_shared9[ember_lid] = (((ember_shared9[ember_lid + stride9])>(ember_shared9[ember_lid]))|((ember_shared9[ember_lid + stride9])!=(ember_shared9[ember_lid + stride9]))?(ember_shared9[ember_lid + stride9]):(ember_shared9[ember_lid])); }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
    float g10 = ember_shared9[0];
    float acc11 = 0.0f;
    for (int loop3 = 0; loop3 < 2; loop3++) {
      int v12 = (loop3*256);
      int v13 = (v12+ember_lid);
      uchar v14 = (v13<300);
      int v15 = (v14?v13:299);
      int v16 = (v15+v0);
      float v17 = data1[v16];
      float v18 = (v17-g10);
      uchar v19 = (v18<(-105.0f));
      float v20 = (v19?0.0f:v18);
      float v21 = (v20*1.4426950216293335f);
      float v22 = trunc(v21);
      float v23 = (v22*0.693145751953125f);
      float v24 = (v20-v23);
      float v25 = (v22*1.428606765330187e-06f);
      float v26 = (v24-v25);
      float v27 = (v26*1.4426950216293335f);
      float v28 = exp2(v27);
      float v29 = exp2(v22);
      float v30 = (v28*v29);
      float v31 = (v19?0.0f:v30);
      float v32 = (v14?v31:0.0f);
      acc11 += v32;
    }
    ember_shared33[ember_lid] = acc11;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int stride33 = 128; stride33 > 0; stride33 >>= 1) {
      if (ember_lid < stride33) { ember_shared33[ember_lid] += ember_shared33[ember_lid + stride33]; }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
    float g34 = ember_shared33[0];
    for (int loop1 = 0; loop1 < 2; loop1++) {
      int v35 = (loop1*256);
      int v36 = (v35+ember_lid);
      uchar v37 = (v36<300);
      int v38 = (v37?v36:299);
      int v39 = (v38+v0);
      float v40 = data1[v39];
      float v41 = (v40-g10);
      uchar v42 = (v41<(-105.0f));
      float v43 = (v42?0.0f:v41);
      float v44 = (v43*1.4426950216293335f);
      float v45 = trunc(v44);
      float v46 = (v45*0.693145751953125f);
      float v47 = (v43-v46);
      float v48 = (v45*1.428606765330187e-06f);
      float v49 = (v47-v48);
      float v50 = (v49*1.4426950216293335f);
      float v51 = exp2(v50);
      float v52 = exp2(v45);
      float v53 = (v51*v52);
      float v54 = (v42?0.0f:v53);
      float v55 = (v54/g34);
      data0[v39] = v55;
    }
}

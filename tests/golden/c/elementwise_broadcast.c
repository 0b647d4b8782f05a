#include <math.h>
#include <stdint.h>
#ifndef EMBER_C_PRELUDE
#define EMBER_C_PRELUDE
static inline float ember_bf16_to_float(unsigned short value) {
  union { unsigned int u; float f; } bits; bits.u = ((unsigned int)value) << 16; return bits.f; }
static inline unsigned short ember_float_to_bf16(float value) {
  union { unsigned int u; float f; } bits; bits.f = value;
  if (value != value) return (unsigned short)((bits.u >> 16) | 64);
  return (unsigned short)((bits.u + 0x7FFFu + ((bits.u >> 16) & 1u)) >> 16); }
#endif

void elementwise_broadcast_0(float* restrict data0, const float* restrict data1, const float* restrict data2, const float* restrict data3, const float* restrict data4) {
  for (int gid = 0; gid < 60; gid++) {
    int v0 = (gid%4);
    int v1 = (gid/4);
    int v2 = (v1%5);
    int v3 = (v2*4);
    int v4 = (gid/20);
    int v5 = (v4*20);
    int v6 = (v3+v5);
    int v7 = (v0+v6);
    int v8 = (v4*4);
    int v9 = (v0+v8);
    float v10 = data1[v9];
    float v11 = data2[v2];
    float v12 = (v10*v11);
    float v13 = data3[v0];
    float v14 = (v12+v13);
    unsigned char v15 = (v14<(-105.0f));
    float v16 = (v15?0.0f:v14);
    unsigned char v17 = (105.0f<v16);
    float v18 = (v17?105.0f:v16);
    float v19 = (v18*1.4426950216293335f);
    float v20 = truncf(v19);
    float v21 = (v20*0.693145751953125f);
    float v22 = (v16-v21);
    float v23 = (v20*1.428606765330187e-06f);
    float v24 = (v22-v23);
    float v25 = (v24*1.4426950216293335f);
    float v26 = exp2f(v25);
    float v27 = exp2f(v20);
    float v28 = (v26*v27);
    float v29 = (v15?0.0f:v28);
    float v30 = data4[v2];
    float v31 = (((v29)>(v30))|((v29)!=(v29))?(v29):(v30));
    data0[v7] = v31;
  }
}

#ifndef EMBER_C_PRELUDE
#define EMBER_C_PRELUDE
float sqrtf(float); double sqrt(double); float truncf(float); double trunc(double);
float exp2f(float); double exp2(double); float log2f(float); double log2(double); float sinf(float); double sin(double);
#ifndef NAN
#define NAN (__builtin_nanf(""))
#endif
#ifndef INFINITY
#define INFINITY (__builtin_inff())
#endif
static inline float ember_bf16_to_float(unsigned short value) {
  union { unsigned int u; float f; } bits; bits.u = ((unsigned int)value) << 16; return bits.f; }
static inline unsigned short ember_float_to_bf16(float value) {
  union { unsigned int u; float f; } bits; bits.f = value;
  if (value != value) return (unsigned short)((bits.u >> 16) | 64);
  return (unsigned short)((bits.u + 0x7FFFu + ((bits.u >> 16) & 1u)) >> 16); }
#endif

__attribute__((optimize("tree-loop-if-convert"))) void elementwise_broadcast_0(float* restrict data0, const float* restrict data1, const float* restrict data2, const float* restrict data3, const float* restrict data4) {
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
    float v15 = (((v14)>((-105.0f)))|((v14)!=(v14))?(v14):((-105.0f)));
    unsigned char v16 = (105.0f<v15);
    float v17 = (v16?105.0f:v15);
    float v18 = (v17*1.4426950216293335f);
    float v19 = truncf(v18);
    float v20 = (v19*0.693145751953125f);
    float v21 = (v14-v20);
    float v22 = (v19*1.428606765330187e-06f);
    float v23 = (v21-v22);
    float v24 = (v23*1.4426950216293335f);
    float v25 = exp2f(v24);
    float v26 = exp2f(v19);
    float v27 = (v25*v26);
    float v28 = data4[v2];
    float v29 = (((v27)>(v28))|((v27)!=(v27))?(v27):(v28));
    data0[v7] = v29;
  }
}

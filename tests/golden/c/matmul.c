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

__attribute__((optimize("tree-loop-if-convert"))) void matmul_0(float* restrict data0, const float* restrict data1, const float* restrict data2, const int* restrict ember_warm) {
  #pragma omp parallel for schedule(static) if(parallel: *ember_warm)
  for (int gid = 0; gid < 16; gid++) {
    int v0 = (gid%2);
    int v1 = (v0*4);
    int v2 = (gid/2);
    int v3 = (v2*16);
    int v4 = (v1+v3);
    int v5 = (v2*66);
    int v6 = (v5+33);
    int v7 = (v1+3);
    int v8 = (v1+2);
    int v9 = (v1+1);
    float acc10 = 0.0f;
    float acc11 = 0.0f;
    float acc12 = 0.0f;
    float acc13 = 0.0f;
    float acc14 = 0.0f;
    float acc15 = 0.0f;
    float acc16 = 0.0f;
    float acc17 = 0.0f;
    for (int loop1 = 0; loop1 < 33; loop1++) {
      int v18 = (loop1+v6);
      float v19 = data1[v18];
      int v20 = (loop1*8);
      int v21 = (v7+v20);
      float v22 = data2[v21];
      float v23 = (v19*v22);
      int v24 = (v8+v20);
      float v25 = data2[v24];
      float v26 = (v19*v25);
      int v27 = (v9+v20);
      float v28 = data2[v27];
      float v29 = (v19*v28);
      int v30 = (v1+v20);
      float v31 = data2[v30];
      float v32 = (v19*v31);
      int v33 = (loop1+v5);
      float v34 = data1[v33];
      float v35 = (v34*v22);
      float v36 = (v34*v25);
      float v37 = (v34*v28);
      float v38 = (v34*v31);
      acc10 += v23;
      acc11 += v26;
      acc12 += v29;
      acc13 += v32;
      acc14 += v35;
      acc15 += v36;
      acc16 += v37;
      acc17 += v38;
    }
    data0[v4] = acc17;
    int v39 = (v9+v3);
    data0[v39] = acc16;
    int v40 = (v8+v3);
    data0[v40] = acc15;
    int v41 = (v7+v3);
    data0[v41] = acc14;
    int v42 = (v3+8);
    int v43 = (v1+v42);
    data0[v43] = acc13;
    int v44 = (v9+v42);
    data0[v44] = acc12;
    int v45 = (v8+v42);
    data0[v45] = acc11;
    int v46 = (v7+v42);
    data0[v46] = acc10;
  }
}

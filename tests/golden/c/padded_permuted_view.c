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

void padded_permuted_view_0(float* restrict data0, const float* restrict data1) {
  for (int gid = 0; gid < 60; gid++) {
    int v0 = (gid%6);
    int v1 = (gid/6);
    int v2 = (v1%2);
    int v3 = (v2*6);
    int v4 = (gid/12);
    int v5 = (v4*12);
    int v6 = (v3+v5);
    int v7 = (v0+v6);
    unsigned char v8 = (0<v4);
    unsigned char v9 = (0<v0);
    unsigned char v10 = (v8&v9);
    unsigned char v11 = (v0<4);
    unsigned char v12 = (v10&v11);
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
}

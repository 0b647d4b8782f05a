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

__attribute__((optimize("tree-loop-if-convert"))) void reduce_0(float* restrict data0, const float* restrict data1) {
  for (int gid = 0; gid < 15; gid++) {
    int v0 = (gid%5);
    int v1 = (gid/5);
    int v2 = (v1*85);
    float acc3 = 0.0f;
    for (int loop1 = 0; loop1 < 17; loop1++) {
      int v4 = (loop1*5);
      int v5 = (v4+v2);
      int v6 = (v0+v5);
      float v7 = data1[v6];
      acc3 += v7;
    }
    data0[gid] = acc3;
  }
}

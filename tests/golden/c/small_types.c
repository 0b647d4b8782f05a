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

__attribute__((optimize("tree-loop-if-convert"))) void small_types_0(unsigned char* restrict data0, const unsigned short* restrict data1, const signed char* restrict data2) {
  for (int gid = 0; gid < 6; gid++) {
    unsigned short v0 = data1[gid];
    float v1 = ((float)(v0));
    signed char v2 = data2[gid];
    signed char v3 = (v2*((signed char)3));
    _Float16 v4 = ((_Float16)(v3));
    float v5 = ((float)(v4));
    unsigned char v6 = (v1<v5);
    data0[gid] = v6;
  }
}

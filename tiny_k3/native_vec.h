/* Eight numbers at a time, for the C kernels of the compiled path (tiny_k3/native.py builds each source with this
 * header beside it, and rebuilds when either changes).
 *
 * vec8 is 8 numbers of REAL (float or double: one AVX2 or AVX-512 register) with GCC's vector extensions; the
 * compiler keeps such values in registers and emits one instruction per operation. Loads and stores go through
 * memcpy, so no alignment is assumed. C has no ?: on vectors, hence `select8`; and C's exp is one number per call,
 * hence `exp8` and the functions built on it.
 */
#ifndef TINY_K3_NATIVE_VEC_H
#define TINY_K3_NATIVE_VEC_H

#include <string.h>

#ifndef REAL
#error "build with -DREAL=float or -DREAL=double (tiny_k3/native.py does)"
#endif

typedef REAL vec8 __attribute__((vector_size(8 * sizeof(REAL))));
typedef __typeof__((vec8){0} < (vec8){0}) ivec8;               /* the integers of REAL's width, 8 of them */

static inline vec8 load8(const REAL *p) { vec8 x; memcpy(&x, p, sizeof x); return x; }
static inline void store8(REAL *p, vec8 x) { memcpy(p, &x, sizeof x); }
static inline REAL sum8(vec8 x) { REAL s = 0; for (int j = 0; j < 8; j++) s += x[j]; return s; }
static inline vec8 splat8(REAL x) { return (vec8){0} + x; }

static inline vec8 load_part8(const REAL *p, long count)      /* count < 8 numbers, zeros after */
{
    REAL part[8] = {0};
    memcpy(part, p, count * sizeof(REAL));
    return load8(part);
}

static inline void store_part8(REAL *p, vec8 x, long count)   /* the first count of x's numbers */
{
    REAL part[8];
    store8(part, x);
    memcpy(p, part, count * sizeof(REAL));
}

/* a where mask (a lane of all ones), else b, bit by bit */
static inline vec8 select8(ivec8 mask, vec8 a, vec8 b)
{
    ivec8 ai, bi;
    memcpy(&ai, &a, sizeof a);
    memcpy(&bi, &b, sizeof b);
    ivec8 picked = (ai & mask) | (bi & ~mask);
    vec8 out;
    memcpy(&out, &picked, sizeof out);
    return out;
}

/* e^x = 2^n (1 + p): x = n ln2 + f with n = round(x / ln2), |f| <= ln2/2, and p = e^f - 1 by its Taylor series in
 * Horner form, f (1 + f (1/2! + f (1/3! + ...))), to f^7/7! for float and f^13/13! for double (the next term is under
 * half an ulp), one multiply-add a term. p is accurate relative to itself, so expm1 keeps its digits near 0. 2^n goes
 * straight into the exponent bits. x is clamped to +-LIMIT first, where e^x stays finite (a sigmoid or tanh there is
 * saturated to the last bit). */
#define NATIVE_DOUBLE (sizeof(REAL) == 8)
static inline vec8 exp_parts8(vec8 x, vec8 *two_n)
{
    const REAL LIMIT = NATIVE_DOUBLE ? 700 : 87, LN2 = 0.6931471805599453;
    const REAL ROUND = NATIVE_DOUBLE ? 6755399441055744.0 : 12582912.0;   /* 1.5 * 2^(mantissa bits) */
    vec8 limit = splat8(LIMIT);
    x = select8(x < -limit, -limit, select8(x > limit, limit, x));
    vec8 n = (x * (REAL)1.4426950408889634 + ROUND) - ROUND;  /* round to nearest */
    vec8 f = x - n * LN2;
    static const double INV_FACTORIAL[14] = {1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040,
                                             1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800,
                                             1.0 / 479001600, 1.0 / 6227020800, 1.0 / 87178291200};   /* 1/(i+1)! */
    int last = NATIVE_DOUBLE ? 12 : 6;
    vec8 p = splat8((REAL)INV_FACTORIAL[last]);
    for (int i = last - 1; i >= 0; i--)                        /* one multiply-add per term */
        p = p * f + (REAL)INV_FACTORIAL[i];
    ivec8 bits = (__builtin_convertvector(n, ivec8) + (NATIVE_DOUBLE ? 1023 : 127)) << (NATIVE_DOUBLE ? 52 : 23);
    memcpy(two_n, &bits, sizeof *two_n);
    return p * f;
}

static inline vec8 exp8(vec8 x) { vec8 two_n, p = exp_parts8(x, &two_n); return two_n * p + two_n; }
static inline vec8 expm1_8(vec8 x) { vec8 two_n, p = exp_parts8(x, &two_n); return two_n * p + (two_n - 1); }
static inline vec8 sigmoid8(vec8 x) { return 1 / (1 + exp8(-x)); }
static inline vec8 tanh8(vec8 x) { vec8 e = expm1_8(x + x); return e / (e + 2); }   /* (e^2x - 1) / (e^2x + 1) */

#endif

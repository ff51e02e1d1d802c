/* RMSNorm in plain C, forward and backward (tiny_k3/norm.py `rms_norm`), for the compiled training path.
 *
 * Each row x [D] of x [N, D]:
 *     r = 1 / sqrt(mean(x^2) + eps)            one number per row, kept for the backward          (r [N])
 *     y = x r w                                                                                    (y [N, D])
 * and with a = dy w (the gradient reaching x r),
 *     dx = r (a - x r^2 mean(a x))            the projection that a scale-free x r asks for
 *     dw += dy x r                             summed over the rows (dw [D], accumulated into zeros)
 * In PyTorch this is a chain of six small ops forward and about ten backward, each a pass over [N, D]; here one pass
 * each way. tiny_k3/native.py builds this file; tiny_k3/norm.py wraps it as an autograd Function.
 */
#include <math.h>

#include "native_vec.h"   /* vec8: 8 numbers at a time */

/* Sums over a row are kept as 8 running sums (one vector register): C may not reorder a sum of floats by itself,
 * so a plain loop would add one number at a time. */
static REAL sum_of_squares(long D, const REAL *restrict a)
{
    vec8 acc = {0};
    long c = 0;
    for (; c + 8 <= D; c += 8)
        acc += load8(a + c) * load8(a + c);
    REAL sum = sum8(acc);
    for (; c < D; c++)
        sum += a[c] * a[c];
    return sum;
}

static REAL sum_of_products(long D, const REAL *restrict a, const REAL *restrict b, const REAL *restrict d)
{
    vec8 acc = {0};
    long c = 0;
    for (; c + 8 <= D; c += 8)
        acc += load8(a + c) * load8(b + c) * load8(d + c);
    REAL sum = sum8(acc);
    for (; c < D; c++)
        sum += a[c] * b[c] * d[c];
    return sum;
}

void rms_norm_forward(long N, long D, REAL eps, const REAL *restrict x, const REAL *restrict w, REAL *restrict y,
                      REAL *restrict r)
{
    for (long n = 0; n < N; n++) {
        const REAL *xn = x + n * D;
        REAL rn = 1 / sqrt(sum_of_squares(D, xn) / D + eps);
        r[n] = rn;
        for (long c = 0; c < D; c++)
            y[n * D + c] = xn[c] * rn * w[c];
    }
}

void rms_norm_backward(long N, long D, const REAL *restrict x, const REAL *restrict w, const REAL *restrict r,
                       const REAL *restrict dy, REAL *restrict dx, REAL *restrict dw)
{
    for (long n = 0; n < N; n++) {
        const REAL *xn = x + n * D, *dyn = dy + n * D;
        REAL rn = r[n], shift = rn * rn * sum_of_products(D, dyn, w, xn) / D;
        for (long c = 0; c < D; c++)
            dw[c] += dyn[c] * xn[c] * rn;
        for (long c = 0; c < D; c++)
            dx[n * D + c] = rn * (dyn[c] * w[c] - xn[c] * shift);
    }
}

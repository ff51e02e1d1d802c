/* KDA's short conv, SiLU and q/k norms in plain C, forward and backward (tiny_k3/kda.py `conv_heads`), for the
 * compiled training path.
 *
 * x [B, T, C] holds each token's q | k | v channels (C = 2HK + HV); taps [W, C] the depthwise conv's weights, row
 * W-1 multiplying the current token (tiny_k3/shortconv.py):
 *     m_t = sum_w taps[w] x_{t-W+1+w}          zeros before the first token                  (kept: m [B, T, C])
 *     s = silu(m) = m sigmoid(m)
 *     y = s r on each of the 2H q and k heads of K channels, r = 1 / sqrt(sum over the head of s^2 + 1e-6)
 *                                                                                      (kept: r [B, T, 2H])
 *     y = s on the v channels
 * and back, with dy the gradient of y:
 *     ds = r (dy - y sum over the head of dy y)        the head norm's backward (ds = dy on v)
 *     dm = ds sigmoid(m) (1 + m (1 - sigmoid(m)))      SiLU's
 *     dx_t = sum_w taps[w] dm_{t+W-1-w},   dtaps[w] += sum over (b, t) of dm_t x_{t-W+1+w}
 * Inductor's kernels for this (torch.compile of `conv_heads`) spend ~6 ms a layer of `small` in the backward, in a
 * loop it leaves scalar; here each pass runs along the C channels of one token, a vector at a time.
 * tiny_k3/native.py builds this file; tiny_k3/conv_native.py wraps it as an autograd Function.
 */
#include "native_vec.h"   /* vec8: 8 numbers at a time; exp8, sigmoid8 */

/* y (and m, r) for every token; see the top of the file. C must be a multiple of 8, and K too. */
void kda_conv_forward(long B, long T, long C, long W, long heads, long K, const REAL *restrict x,
                      const REAL *restrict taps, REAL *restrict m, REAL *restrict y, REAL *restrict r)
{
    for (long bt = 0; bt < B * T; bt++) {
        long t = bt % T;
        REAL *mt = m + bt * C, *yt = y + bt * C;
        for (long c = 0; c < C; c += 8) {
            vec8 acc = {0};
            for (long w = 0; w < W; w++) {
                long back = W - 1 - w;                               /* tap w reads the token `back` steps back */
                if (t >= back)
                    acc += load8(taps + w * C + c) * load8(x + (bt - back) * C + c);
            }
            store8(mt + c, acc);
            store8(yt + c, acc * sigmoid8(acc));
        }
        for (long h = 0; h < heads; h++) {
            REAL *yh = yt + h * K;
            vec8 squares = {0};
            for (long c = 0; c < K; c += 8)
                squares += load8(yh + c) * load8(yh + c);
            REAL rh = 1 / __builtin_sqrt(sum8(squares) + (REAL)1e-6);
            r[bt * heads + h] = rh;
            for (long c = 0; c < K; c += 8)
                store8(yh + c, load8(yh + c) * rh);
        }
    }
}

/* dx (written) and dtaps (accumulated into zeros) from dy; dm [B, T, C] is scratch. */
void kda_conv_backward(long B, long T, long C, long W, long heads, long K, const REAL *restrict x,
                       const REAL *restrict taps, const REAL *restrict m, const REAL *restrict y,
                       const REAL *restrict r, const REAL *restrict dy, REAL *restrict dm, REAL *restrict dx,
                       REAL *restrict dtaps)
{
    for (long bt = 0; bt < B * T; bt++) {                      /* dm: back through the head norms and the SiLU */
        const REAL *yt = y + bt * C, *dyt = dy + bt * C, *mt = m + bt * C;
        REAL *dmt = dm + bt * C;
        for (long c = 0; c < C; c += 8)                           /* ds = dy (the v channels keep it) */
            store8(dmt + c, load8(dyt + c));
        for (long h = 0; h < heads; h++) {
            const REAL *yh = yt + h * K, *dyh = dyt + h * K;
            vec8 dot = {0};
            for (long c = 0; c < K; c += 8)
                dot += load8(dyh + c) * load8(yh + c);
            REAL along = sum8(dot), rh = r[bt * heads + h];
            for (long c = 0; c < K; c += 8)
                store8(dmt + h * K + c, rh * (load8(dyh + c) - load8(yh + c) * along));
        }
        for (long c = 0; c < C; c += 8) {
            vec8 mc = load8(mt + c), sg = sigmoid8(mc);
            store8(dmt + c, load8(dmt + c) * sg * (1 + mc * (1 - sg)));
        }
    }
    for (long bt = 0; bt < B * T; bt++) {                      /* through the conv */
        long t = bt % T;
        for (long c = 0; c < C; c += 8) {
            vec8 acc = {0}, dmc = load8(dm + bt * C + c);
            for (long w = 0; w < W; w++) {
                long back = W - 1 - w;
                if (t + back < T)                                    /* output t + back read this token by tap w */
                    acc += load8(taps + w * C + c) * load8(dm + (bt + back) * C + c);
                if (t >= back)                                       /* tap w at this output read x_{t - back} */
                    store8(dtaps + w * C + c, load8(dtaps + w * C + c) + dmc * load8(x + (bt - back) * C + c));
            }
            store8(dx + bt * C + c, acc);
        }
    }
}

/* KDA's recurrence in plain C: `kda_recurrent` (tiny_k3/kda.py, kda.md §1) one token at a time, for inference.
 *
 * Why a loop in C beats the chunked form in PyTorch on one CPU core: per token and head the recurrence is about
 * 8 K V FLOPs (the chunked form at 32-token chunks does about 12 K V), a 64 x 64 state stays in the L1 cache from
 * token to token, and in Python each token would cost a dozen framework calls where here it costs none.
 * tiny_k3/native.py builds this file with the system C compiler, once per REAL:
 *
 *     cc -O3 -march=native -shared -fPIC -std=gnu99 -DREAL=float kda_native.c -o kda_native_float.so
 *
 * Layout (fla, time-major, contiguous): q, k, alpha [B,T,H,K] with alpha = e^g (the decay, taken by the caller
 * in one vectorised pass); v [B,T,H,V]; beta [B,T,H]; S [B,H,K,V] (read as the initial state, left as the final
 * one); o [B,T,H,V] (written). Per token t, for each head:
 *
 *     S' = Diag(alpha_t) S                 decay the key rows
 *     delta = beta_t (v_t - S'^T k_t)      what the write changes: the value less what the memory returns
 *     S = S' + k_t delta^T                 rank-1 write under k_t
 *     o_t = S^T (scale q_t)                the read
 *
 * Two facts make it one pass over S per token. Column j of delta needs only column j of S, so the columns split
 * into independent blocks, each carried through all T tokens with its running sums in registers. And the next
 * token's recall, S'^T k_{t+1} = sum_d alpha_{t+1,d} k_{t+1,d} S[d,:], is a sum over the rows of the S this token
 * writes: it is gathered row by row as each row is written, so S is loaded once and stored once per token.
 */
#include <string.h>

#ifndef REAL
#error "build with -DREAL=float or -DREAL=double (tiny_k3/native.py does)"
#endif

typedef REAL vec __attribute__((vector_size(64)));     /* 64 bytes: one AVX-512 register, two AVX2 ones (gcc, clang) */
#define LANES ((long)(sizeof(vec) / sizeof(REAL)))
#define BLOCK (4 * LANES)                              /* columns per block: four registers per running sum */

static inline vec load(const REAL *p) { vec x; memcpy(&x, p, sizeof x); return x; }   /* (no alignment assumed) */
static inline void store(REAL *p, vec x) { memcpy(p, &x, sizeof x); }

/* One head's inputs: token t's q, k, alpha rows start at (t * H) * K, its v and o rows at (t * H) * V. */
struct head { const REAL *q, *k, *alpha, *v, *beta; REAL *state, *o; long T, H, K, V; REAL scale; };

/* query[d] = scale q_t,d and next[d] = alpha_{t+1,d} k_{t+1,d} (0 after the last token): the row weights of the
 * read and of the next token's recall. */
static void row_weights(const struct head *x, long t, REAL *query, REAL *next)
{
    const REAL *q = x->q + t * x->H * x->K;
    for (long d = 0; d < x->K; d++)
        query[d] = x->scale * q[d];
    if (t + 1 == x->T) {
        memset(next, 0, x->K * sizeof(REAL));
        return;
    }
    const REAL *k = x->k + (t + 1) * x->H * x->K, *a = x->alpha + (t + 1) * x->H * x->K;
    for (long d = 0; d < x->K; d++)
        next[d] = a[d] * k[d];
}

/* Columns [j0, j0 + BLOCK) of one head, through every token, four vectors at a time. */
static void block(const struct head *x, long j0, REAL *query, REAL *next)
{
    long K = x->K, V = x->V, step = x->H;                      /* consecutive tokens of a head lie H rows apart */
    vec recalled[4] = {{0}};
    for (long d = 0; d < K; d++) {                             /* token 0's recall: S'^T k_0 from the initial S */
        REAL weight = x->alpha[d] * x->k[d];
        for (int i = 0; i < 4; i++)
            recalled[i] += weight * load(x->state + d * V + j0 + i * LANES);
    }
    for (long t = 0; t < x->T; t++) {
        const REAL *alpha = x->alpha + t * step * K, *k = x->k + t * step * K, *v = x->v + t * step * V;
        REAL beta = x->beta[t * step];
        row_weights(x, t, query, next);
        vec delta[4], out[4] = {{0}};
        for (int i = 0; i < 4; i++) {                          /* delta = beta_t (v_t - S'^T k_t) */
            delta[i] = beta * (load(v + j0 + i * LANES) - recalled[i]);
            recalled[i] = (vec){0};
        }
        for (long d = 0; d < K; d++) {                         /* S = S' + k_t delta^T, row by row */
            REAL *s = x->state + d * V + j0;
            for (int i = 0; i < 4; i++) {
                vec written = alpha[d] * load(s + i * LANES) + k[d] * delta[i];
                store(s + i * LANES, written);
                out[i] += query[d] * written;                  /* o_t = S^T (scale q_t) */
                recalled[i] += next[d] * written;              /* the next token's S'^T k_{t+1} */
            }
        }
        for (int i = 0; i < 4; i++)
            store(x->o + t * step * V + j0 + i * LANES, out[i]);
    }
}

/* The same for one column j (the columns past the last whole block), one number at a time. */
static void column(const struct head *x, long j, REAL *query, REAL *next)
{
    long K = x->K, V = x->V, step = x->H;
    REAL recalled = 0;
    for (long d = 0; d < K; d++)
        recalled += x->alpha[d] * x->k[d] * x->state[d * V + j];
    for (long t = 0; t < x->T; t++) {
        const REAL *alpha = x->alpha + t * step * K, *k = x->k + t * step * K;
        row_weights(x, t, query, next);
        REAL delta = x->beta[t * step] * (x->v[t * step * V + j] - recalled), out = 0;
        recalled = 0;
        for (long d = 0; d < K; d++) {
            REAL written = alpha[d] * x->state[d * V + j] + k[d] * delta;
            x->state[d * V + j] = written;
            out += query[d] * written;
            recalled += next[d] * written;
        }
        x->o[t * step * V + j] = out;
    }
}

void kda_recurrent(long B, long T, long H, long K, long V,
                   const REAL *q, const REAL *k, const REAL *v, const REAL *alpha, const REAL *beta, REAL scale,
                   REAL *S, REAL *o)
{
    REAL query[K], next[K];
    for (long b = 0; b < B; b++) {
        for (long h = 0; h < H; h++) {
            long first = b * T * H + h;                        /* row of (b, token 0, h) in [B, T, H] */
            struct head x = {q + first * K, k + first * K, alpha + first * K, v + first * V, beta + first,
                             S + (b * H + h) * K * V, o + first * V, T, H, K, V, scale};
            long j = 0;
            for (; j + BLOCK <= V; j += BLOCK)
                block(&x, j, query, next);
            for (; j < V; j++)
                column(&x, j, query, next);
        }
    }
}

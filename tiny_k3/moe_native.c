/* The latent MoE's expert products in plain C, forward and backward (tiny_k3/moe.py `mix_experts`, k3_facts.md §1c).
 *
 * Each routed (token, expert) pair p runs its expert on the token's latent z [l]:
 *     g_p = W1_e z,  u_p = W3_e z              the expert's gate and up products, [m] each   (experts_in)
 *     h_p = glu(g_p, u_p)                        done by the caller in PyTorch (element-wise, vectorised)
 *     y_n += w_p W2_e h_p                        the weighted down product, summed per token     (experts_out)
 * With K3's widths at toy scale (m = 8, l = 16) a pair is a few hundred multiply-adds, so in PyTorch the time goes
 * to sorting, copying and padding pairs into batched products; here the pairs are visited in expert order
 * (`starts[e] .. starts[e+1]` are expert e's pairs, `token[p]` the row of z each belongs to), so each expert's
 * weights stay in the L1 cache while its pairs stream past. tiny_k3/native.py builds this file as it builds
 * kda_native.c; tiny_k3/moe_native.py wraps the counting sort as `expert_order`, the four product functions as two
 * autograd Functions, SiTU-GLU as `SituGLU`, the router's chosen-score backward as `chosen_scores_backward`, and its
 * sigmoid and top-k selection (the last functions here) as `sigmoid_top_k_ids_native` and `top_k_ids_native`.
 *
 * Shapes (all contiguous): z [N, l]; W1, W3 [E, m, l]; W2 [E, l, m] (and each transposed where a loop reads it
 * that way: every inner loop runs along contiguous numbers); g, u, h [P, m] in pair (expert) order; w [P];
 * y [N, l]. Gradients are accumulated into zeroed outputs the caller passes.
 */
#include <stdint.h>   /* index arrays are int64_t: torch.long, whatever the size of a C long */

#include "native_vec.h"

/* The pairs in expert order, stably (a counting sort: one pass to count, one to place): order [P] lists the pairs of
 * expert 0, then of expert 1, ...; starts [E + 1] marks where each expert's run begins. */
void order_by_expert(long P, long E, const int64_t *restrict ids, int64_t *restrict starts, int64_t *restrict order)
{
    for (long e = 0; e <= E; e++)
        starts[e] = 0;
    for (long p = 0; p < P; p++)
        starts[ids[p] + 1]++;
    for (long e = 0; e < E; e++)
        starts[e + 1] += starts[e];
    for (long p = 0; p < P; p++)                              /* starts[e] walks through expert e's run ... */
        order[starts[ids[p]]++] = p;
    for (long e = E; e > 0; e--)                              /* ... and is put back where the run begins */
        starts[e] = starts[e - 1];
    starts[0] = 0;
}

/* Runs of 8 numbers are handled as one vector whose sums stay in registers (vec8, native_vec.h); the numbers past
 * the last whole run, one at a time. */

/* g_p = W1_e z_token[p], u_p = W3_e z_token[p] for every pair. The weights come transposed, W1t, W3t [E, l, m], so
 * that both products are sums of rows, g_p = sum_c z_c W1t[c, :]. */
void experts_in(long E, long m, long l, const int64_t *restrict starts, const int64_t *restrict token,
                const REAL *restrict z, const REAL *restrict W1t, const REAL *restrict W3t,
                REAL *restrict g, REAL *restrict u)
{
    for (long e = 0; e < E; e++) {
        const REAL *w1 = W1t + e * l * m, *w3 = W3t + e * l * m;
        for (long p = starts[e]; p < starts[e + 1]; p++) {
            const REAL *x = z + token[p] * l;
            long i = 0;
            for (; i + 8 <= m; i += 8) {
                vec8 gate = {0}, up = {0};
                for (long c = 0; c < l; c++) {
                    gate += x[c] * load8(w1 + c * m + i);
                    up += x[c] * load8(w3 + c * m + i);
                }
                store8(g + p * m + i, gate);
                store8(u + p * m + i, up);
            }
            for (; i < m; i++) {
                REAL gate = 0, up = 0;
                for (long c = 0; c < l; c++) {
                    gate += x[c] * w1[c * m + i];
                    up += x[c] * w3[c * m + i];
                }
                g[p * m + i] = gate;
                u[p * m + i] = up;
            }
        }
    }
}

/* Backward of experts_in: dz[token] += W1_e^T dg_p + W3_e^T du_p;  dW1_e += dg_p z^T;  dW3_e += du_p z^T
 * (W1, W3 as stored, [E, m, l]: each sum runs along their rows). */
void experts_in_backward(long E, long m, long l, const int64_t *restrict starts, const int64_t *restrict token,
                         const REAL *restrict z, const REAL *restrict W1, const REAL *restrict W3,
                         const REAL *restrict dg, const REAL *restrict du,
                         REAL *restrict dz, REAL *restrict dW1, REAL *restrict dW3)
{
    for (long e = 0; e < E; e++) {
        const REAL *w1 = W1 + e * m * l, *w3 = W3 + e * m * l;
        REAL *dw1 = dW1 + e * m * l, *dw3 = dW3 + e * m * l;
        for (long p = starts[e]; p < starts[e + 1]; p++) {
            const REAL *x = z + token[p] * l, *dgate = dg + p * m, *dup = du + p * m;
            REAL *dx = dz + token[p] * l;
            long c = 0;
            for (; c + 8 <= l; c += 8) {
                vec8 grad = load8(dx + c), input = load8(x + c);
                for (long i = 0; i < m; i++) {
                    grad += dgate[i] * load8(w1 + i * l + c) + dup[i] * load8(w3 + i * l + c);
                    store8(dw1 + i * l + c, load8(dw1 + i * l + c) + dgate[i] * input);
                    store8(dw3 + i * l + c, load8(dw3 + i * l + c) + dup[i] * input);
                }
                store8(dx + c, grad);
            }
            for (; c < l; c++)
                for (long i = 0; i < m; i++) {
                    dx[c] += w1[i * l + c] * dgate[i] + w3[i * l + c] * dup[i];
                    dw1[i * l + c] += dgate[i] * x[c];
                    dw3[i * l + c] += dup[i] * x[c];
                }
        }
    }
}

/* y[token[p]] += w_p W2_e h_p for every pair (y zeroed by the caller); W2t [E, m, l] is W2 transposed, so the
 * product is a sum of rows, W2_e h_p = sum_i h_p,i W2t[i, :]. */
void experts_out(long E, long m, long l, const int64_t *restrict starts, const int64_t *restrict token,
                 const REAL *restrict h, const REAL *restrict W2t, const REAL *restrict w, REAL *restrict y)
{
    for (long e = 0; e < E; e++) {
        const REAL *w2 = W2t + e * m * l;
        for (long p = starts[e]; p < starts[e + 1]; p++) {
            const REAL *hp = h + p * m;
            REAL *out = y + token[p] * l;
            long c = 0;
            for (; c + 8 <= l; c += 8) {
                vec8 sum = {0};
                for (long i = 0; i < m; i++)
                    sum += hp[i] * load8(w2 + i * l + c);
                store8(out + c, load8(out + c) + w[p] * sum);
            }
            for (; c < l; c++) {
                REAL sum = 0;
                for (long i = 0; i < m; i++)
                    sum += hp[i] * w2[i * l + c];
                out[c] += w[p] * sum;
            }
        }
    }
}

/* Backward of experts_out, with dy_p = dy[token[p]] and o_p = W2_e h_p (W2 [E, l, m] and W2t [E, m, l] both given,
 * each read along its rows):
 *     dw_p = dy_p . o_p,   dh_p = w_p W2_e^T dy_p = sum_c w_p dy_p,c W2_e[c, :],   dW2_e[c, :] += w_p dy_p,c h_p. */
void experts_out_backward(long E, long m, long l, const int64_t *restrict starts, const int64_t *restrict token,
                          const REAL *restrict h, const REAL *restrict W2, const REAL *restrict W2t,
                          const REAL *restrict w, const REAL *restrict dy, REAL *restrict dh, REAL *restrict dW2,
                          REAL *restrict dw)
{
    for (long e = 0; e < E; e++) {
        const REAL *w2 = W2 + e * l * m, *w2t = W2t + e * m * l;
        REAL *dw2 = dW2 + e * l * m;
        for (long p = starts[e]; p < starts[e + 1]; p++) {
            const REAL *hp = h + p * m, *d = dy + token[p] * l;
            REAL *dhp = dh + p * m, weight = w[p], dweight = 0;
            long c = 0;                                       /* dw_p = dy_p . (W2_e h_p) */
            for (; c + 8 <= l; c += 8) {
                vec8 o = {0};
                for (long i = 0; i < m; i++)
                    o += hp[i] * load8(w2t + i * l + c);
                dweight += sum8(load8(d + c) * o);
            }
            for (; c < l; c++)
                for (long i = 0; i < m; i++)
                    dweight += d[c] * hp[i] * w2t[i * l + c];
            dw[p] = dweight;
            long i = 0;                                       /* dh_p and dW2_e, along W2's rows */
            for (; i + 8 <= m; i += 8) {
                vec8 grad = {0}, hidden = load8(hp + i);
                for (c = 0; c < l; c++) {
                    REAL scaled = weight * d[c];
                    grad += scaled * load8(w2 + c * m + i);
                    store8(dw2 + c * m + i, load8(dw2 + c * m + i) + scaled * hidden);
                }
                store8(dhp + i, grad);
            }
            for (; i < m; i++) {
                REAL grad = 0;
                for (c = 0; c < l; c++) {
                    REAL scaled = weight * d[c];
                    grad += scaled * w2[c * m + i];
                    dw2[c * m + i] += scaled * hp[i];
                }
                dhp[i] = grad;
            }
        }
    }
}

/* SiTU-GLU (tiny_k3/moe.py `situ_glu`, k3_facts.md §1c) element by element over n numbers, 8 at a time:
 *     h = c A S U      A = tanh(g / bg), S = sigmoid(g), U = tanh(u / bu), c = bg bu
 * and back, from dh:
 *     dg = dh c U (S (1 - A^2) / bg + A S (1 - S)),   du = dh c A S (1 - U^2) / bu
 * (tanh, sigmoid: native_vec.h). The last n % 8 numbers go through one zero-padded vector. */
static inline void situ8(vec8 g, vec8 u, REAL bg, REAL bu, vec8 *A, vec8 *S, vec8 *U)
{
    *A = tanh8(g * ((REAL)1 / bg));
    *S = sigmoid8(g);
    *U = tanh8(u * ((REAL)1 / bu));
}

static inline long whole8(long n) { return n - n % 8; }

void situ_glu_forward(long n, REAL bg, REAL bu, const REAL *restrict g, const REAL *restrict u, REAL *restrict h)
{
    vec8 A, S, U;
    for (long i = 0; i < whole8(n); i += 8) {
        situ8(load8(g + i), load8(u + i), bg, bu, &A, &S, &U);
        store8(h + i, (bg * bu) * A * S * U);
    }
    long i = whole8(n), rest = n - i;
    if (rest) {
        situ8(load_part8(g + i, rest), load_part8(u + i, rest), bg, bu, &A, &S, &U);
        store_part8(h + i, (bg * bu) * A * S * U, rest);
    }
}

static inline void situ_back8(vec8 g, vec8 u, vec8 dh, REAL bg, REAL bu, vec8 *dg, vec8 *du)
{
    vec8 A, S, U, c_dh = (bg * bu) * dh;
    situ8(g, u, bg, bu, &A, &S, &U);
    *dg = c_dh * U * (S * (1 - A * A) * ((REAL)1 / bg) + A * S * (1 - S));
    *du = c_dh * A * S * (1 - U * U) * ((REAL)1 / bu);
}

void situ_glu_backward(long n, REAL bg, REAL bu, const REAL *restrict g, const REAL *restrict u,
                       const REAL *restrict dh, REAL *restrict dg, REAL *restrict du)
{
    vec8 dgi, dui;
    for (long i = 0; i < whole8(n); i += 8) {
        situ_back8(load8(g + i), load8(u + i), load8(dh + i), bg, bu, &dgi, &dui);
        store8(dg + i, dgi);
        store8(du + i, dui);
    }
    long i = whole8(n), rest = n - i;
    if (rest) {
        situ_back8(load_part8(g + i, rest), load_part8(u + i, rest), load_part8(dh + i, rest), bg, bu, &dgi, &dui);
        store_part8(dg + i, dgi, rest);
        store_part8(du + i, dui, rest);
    }
}

/* The router's gradient at its k chosen scores (tiny_k3/moe.py `ChosenScores`): with a = dL/d(logit) [N, k] at the
 * chosen experts ids [N, k] of the logits x W^T,
 *     dx_n = sum_j a_nj W_{ids[n, j]}            (dx [N, D], written)
 *     dW_e += a_nj x_n  for each ids[n, j] = e   (dW [E, D], accumulated into the zeros the caller passes)
 * k rows of W per token instead of all E: a gather and a scatter of rows, each a contiguous run of D. */
void chosen_scores_backward(long N, long D, long k, const int64_t *restrict ids, const REAL *restrict a,
                            const REAL *restrict x, const REAL *restrict w, REAL *restrict dx, REAL *restrict dw)
{
    for (long n = 0; n < N; n++) {
        const REAL *xn = x + n * D;
        REAL *dxn = dx + n * D;
        for (long c = 0; c < D; c++)
            dxn[c] = 0;
        for (long j = 0; j < k; j++) {
            REAL anj = a[n * k + j];
            const REAL *we = w + ids[n * k + j] * D;
            REAL *dwe = dw + ids[n * k + j] * D;
            for (long c = 0; c < D; c++) {
                dxn[c] += anj * we[c];
                dwe[c] += anj * xn[c];
            }
        }
    }
}

/* The router's selection, `topk(scores + bias, k, sorted=True).indices` of each row. The k + 1 largest of a row's
 * E numbers v = s + b are found among the few that reach a floor f, and the floor is checked, not trusted:
 *   1. v and a count of the numbers >= f, in one vectorised pass. Rows of a batch are alike, so f starts at the
 *      previous row's (k+1)-th largest. Where fewer than k + 1 reach it, the guess was too high: it steps down by a
 *      quarter of the previous row's spread (its largest less its (k+1)-th), then the whole spread, then to -inf.
 *      Once k + 1 numbers reach f, the row's k + 1 largest all do.
 *   2. The candidates, v >= f, copied out without a branch from the runs of 8 that hold one.
 *   3. Their order by counting: a candidate's rank is the number of candidates above it (and equal ones before it),
 *      so the k + 1 largest fall into place with no data-dependent branch (the counting is vectorised). Where more
 *      than RANKED reach f (the first row, a row unlike the one before), they are inserted one by one instead.
 * ids [N, k] gets each row's k largest, descending. redo[n] = 1 where the answer may differ from torch's topk: a tie
 * among the k + 1 largest (which of two equal numbers comes first is topk's choice) or a NaN (topk counts it as
 * largest); the caller hands those rows to topk itself. Scratch: `kept`, `kept_ids` of k + 1 numbers, `vals`,
 * `cand`, `cand_ids` of E. */
#define RANKED 96

/* v = row + bias; returns how many v >= floor, and ORs "the row has a NaN" into *has_nan. */
static long values_and_count(long E, REAL *restrict row, const REAL *restrict bias, int sigmoid_first, REAL floor,
                             REAL *restrict v, int *restrict has_nan)
{
    if (sigmoid_first) {                                      /* the row holds logits: make them the scores */
        long c = 0;
        for (; c + 8 <= E; c += 8)
            store8(row + c, sigmoid8(load8(row + c)));
        if (c < E)
            store_part8(row + c, sigmoid8(load_part8(row + c, E - c)), E - c);
    }
    long count = 0;
    int nan = 0;
    for (long j = 0; j < E; j++) {
        REAL x = row[j] + bias[j];
        v[j] = x;
        count += x >= floor;
        nan |= x != x;
    }
    *has_nan |= nan;
    return count;
}

static long count_at_least(long E, const REAL *restrict v, REAL floor)
{
    long count = 0;
    for (long j = 0; j < E; j++)
        count += v[j] >= floor;
    return count;
}

static long candidates(long E, const REAL *restrict v, REAL floor, REAL *restrict cand, int64_t *restrict cand_ids)
{
    long count = 0, j0 = 0;
    vec8 f = {0};
    f += floor;
    for (; j0 + 8 <= E; j0 += 8) {                            /* runs of 8: one vector comparison, ... */
        vec8 x = load8(v + j0);
        __typeof__(x >= f) reach = x >= f;
        uint64_t words[sizeof reach / 8], any = 0;            /* any lane set: the mask read as whole words */
        memcpy(words, &reach, sizeof reach);
        for (unsigned w = 0; w < sizeof reach / 8; w++)
            any |= words[w];
        if (!any)
            continue;
        for (int j = 0; j < 8; j++) {                         /* ... and a copy without a branch where one reaches */
            cand[count] = x[j];
            cand_ids[count] = j0 + j;
            count += reach[j] != 0;
        }
    }
    for (; j0 < E; j0++) {
        cand[count] = v[j0];
        cand_ids[count] = j0;
        count += v[j0] >= floor;
    }
    return count;
}

/* kept[0..k] (descending, ids beside) := the k + 1 largest of cand[0..count) (-inf, id -1 where fewer). */
static void keep_largest(long k, long count, const REAL *restrict cand, const int64_t *restrict cand_ids,
                         REAL *restrict kept, int64_t *restrict kept_ids)
{
    for (long j = 0; j <= k; j++) {
        kept[j] = -__builtin_inf();
        kept_ids[j] = -1;
    }
    if (count <= RANKED) {                                    /* by rank: no data-dependent branch */
        for (long c = 0; c < count; c++) {
            REAL x = cand[c];
            long rank = 0;
            for (long j = 0; j < count; j++)
                rank += (cand[j] > x) | ((cand[j] == x) & (j < c));
            if (rank <= k) {
                kept[rank] = x;
                kept_ids[rank] = cand_ids[c];
            }
        }
        return;
    }
    for (long c = 0; c < count; c++) {                        /* one by one */
        REAL x = cand[c];
        if (!(x > kept[k]))
            continue;
        long at = k;                                          /* insert x, keeping kept[] descending */
        while (at > 0 && kept[at - 1] < x) {
            kept[at] = kept[at - 1];
            kept_ids[at] = kept_ids[at - 1];
            at--;
        }
        kept[at] = x;
        kept_ids[at] = cand_ids[c];
    }
}

static void select_rows(long N, long E, long k, REAL *restrict scores, int sigmoid_first, const REAL *restrict bias,
                        int64_t *restrict ids, unsigned char *restrict redo, REAL *restrict kept,
                        int64_t *restrict kept_ids, REAL *restrict vals, REAL *restrict cand, int64_t *restrict cand_ids)
{
    REAL floor = -__builtin_inf(), spread = 0;
    for (long n = 0; n < N; n++) {
        int has_nan = 0;
        long count = values_and_count(E, scores + n * E, bias, sigmoid_first, floor, vals, &has_nan);
        if (count <= k) {                                     /* too high: step down, then give up the floor */
            REAL lower[2] = {floor - spread / 4, floor - spread};
            floor = -__builtin_inf();
            for (int i = 0; i < 2; i++)
                if (count_at_least(E, vals, lower[i]) > k) {
                    floor = lower[i];
                    break;
                }
        }
        keep_largest(k, candidates(E, vals, floor, cand, cand_ids), cand, cand_ids, kept, kept_ids);
        int tie = 0;
        for (long j = 0; j < k && j + 1 < E; j++)
            tie |= !(kept[j] > kept[j + 1]);
        redo[n] = (unsigned char)(tie | has_nan);
        for (long j = 0; j < k; j++)
            ids[n * k + j] = kept_ids[j];
        if (k < E && kept_ids[k] >= 0) {                      /* the next row's first guess */
            floor = kept[k];
            spread = kept[0] - kept[k];
        }
    }
}

void top_k_rows(long N, long E, long k, REAL *restrict scores, const REAL *restrict bias, int64_t *restrict ids,
                unsigned char *restrict redo, REAL *restrict kept, int64_t *restrict kept_ids, REAL *restrict vals,
                REAL *restrict cand, int64_t *restrict cand_ids)
{
    select_rows(N, E, k, scores, 0, bias, ids, redo, kept, kept_ids, vals, cand, cand_ids);
}

/* top_k_rows on sigmoid(logits): each row of `logits` is turned into its scores in place (sigmoid8, native_vec.h)
 * just before it is scanned, while it is in the cache; the router's training path (one pass instead of two). */
void top_k_sigmoid_rows(long N, long E, long k, REAL *restrict logits, const REAL *restrict bias, int64_t *restrict ids,
                        unsigned char *restrict redo, REAL *restrict kept, int64_t *restrict kept_ids,
                        REAL *restrict vals, REAL *restrict cand, int64_t *restrict cand_ids)
{
    select_rows(N, E, k, logits, 1, bias, ids, redo, kept, kept_ids, vals, cand, cand_ids);
}

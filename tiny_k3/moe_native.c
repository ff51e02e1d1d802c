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
 * autograd Functions, and the router's top-k selection (the last function here) as `top_k_ids_native`.
 *
 * Shapes (all contiguous): z [N, l]; W1, W3 [E, m, l]; W2 [E, l, m] (and each transposed where a loop reads it
 * that way: every inner loop runs along contiguous numbers); g, u, h [P, m] in pair (expert) order; w [P];
 * y [N, l]. Gradients are accumulated into zeroed outputs the caller passes.
 */
#include <stdint.h>   /* index arrays are int64_t: torch.long, whatever the size of a C long */
#include <string.h>

#ifndef REAL
#error "build with -DREAL=float or -DREAL=double (tiny_k3/native.py does)"
#endif

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

/* Runs of 8 numbers are handled as one vector whose sums stay in registers (an AVX2 register of floats); the numbers
 * past the last whole run, one at a time. */
typedef REAL vec8 __attribute__((vector_size(8 * sizeof(REAL))));
static inline vec8 load8(const REAL *p) { vec8 x; memcpy(&x, p, sizeof x); return x; }   /* (no alignment assumed) */
static inline void store8(REAL *p, vec8 x) { memcpy(p, &x, sizeof x); }
static inline REAL sum8(vec8 x) { REAL s = 0; for (int j = 0; j < 8; j++) s += x[j]; return s; }

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

/* The router's selection, `topk(scores + bias, k, sorted=True).indices` of each row. Most of a row's numbers never
 * come near its k + 1 largest, so the row is scanned in blocks of 16 against a floor (one vector comparison per
 * block), and the numbers of a block holding one above the floor are copied out without a branch (each is written,
 * and the count moves on only for those above). Those few candidates are then sorted into the k + 1 largest. The
 * floor comes from the previous row (rows of one batch are alike): its (k+1)-th largest, less the spread of its k + 1
 * largest, so few numbers pass it; where fewer than k + 1 pass, the guess was too high and the row is scanned again
 * with no floor. ids [N, k] gets each row's k
 * largest, descending. redo[n] = 1 where the answer may differ from torch's topk: a tie among the k + 1 largest
 * (which of two equal numbers comes first is topk's choice) or a NaN (topk counts it as largest); the caller hands
 * those rows to topk itself. Scratch: `kept`, `kept_ids` of k + 1 numbers, `cand`, `cand_ids` of E. */
#define SCAN 16
static long candidates(long E, const REAL *restrict row, const REAL *restrict bias, REAL floor,
                       REAL *restrict cand, int64_t *restrict cand_ids, int *restrict has_nan)
{
    long count = 0;
    int nan = 0;
    for (long j0 = 0; j0 < E; j0 += SCAN) {
        long end = j0 + SCAN < E ? j0 + SCAN : E;
        int look = 0;                                         /* an OR of comparisons: one vector pass */
        for (long j = j0; j < end; j++) {
            REAL v = row[j] + bias[j];
            look |= (v > floor) | (v != v);
        }
        if (!look)
            continue;
        for (long j = j0; j < end; j++) {                     /* copy out without a branch */
            REAL v = row[j] + bias[j];
            cand[count] = v;
            cand_ids[count] = j;
            count += v > floor;
            nan |= v != v;
        }
    }
    *has_nan |= nan;
    return count;
}

static void keep_largest(long k, long count, const REAL *restrict cand, const int64_t *restrict cand_ids,
                         REAL *restrict kept, int64_t *restrict kept_ids)
{
    for (long j = 0; j <= k; j++) {
        kept[j] = -__builtin_inf();
        kept_ids[j] = -1;
    }
    for (long c = 0; c < count; c++) {
        REAL v = cand[c];
        if (!(v > kept[k]))
            continue;
        long at = k;                                          /* insert v, keeping kept[] descending */
        while (at > 0 && kept[at - 1] < v) {
            kept[at] = kept[at - 1];
            kept_ids[at] = kept_ids[at - 1];
            at--;
        }
        kept[at] = v;
        kept_ids[at] = cand_ids[c];
    }
}

void top_k_rows(long N, long E, long k, const REAL *restrict scores, const REAL *restrict bias, int64_t *restrict ids,
                unsigned char *restrict redo, REAL *restrict kept, int64_t *restrict kept_ids, REAL *restrict cand,
                int64_t *restrict cand_ids)
{
    REAL floor = -__builtin_inf();
    for (long n = 0; n < N; n++) {
        const REAL *row = scores + n * E;
        int has_nan = 0;
        long count = candidates(E, row, bias, floor, cand, cand_ids, &has_nan);
        if (count <= k && floor > -__builtin_inf())          /* fewer than k + 1 above the floor: no floor */
            count = candidates(E, row, bias, -__builtin_inf(), cand, cand_ids, &has_nan);
        keep_largest(k, count, cand, cand_ids, kept, kept_ids);
        int tie = 0;
        for (long j = 0; j < k && j + 1 < E; j++)
            tie |= !(kept[j] > kept[j + 1]);
        redo[n] = (unsigned char)(tie | has_nan);
        for (long j = 0; j < k; j++)
            ids[n * k + j] = kept_ids[j];
        if (k < E && kept_ids[k] >= 0)                       /* below this row's (k+1)-th by its top's spread: */
            floor = kept[k] - (kept[0] - kept[k]);            /* a floor the next row rarely fails */
    }
}

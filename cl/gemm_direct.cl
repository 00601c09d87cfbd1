/* The GEMMs of the unfused path on CPUs (DIRECT 1; modes and arguments: gemm_common.cl): one
 * work-item a work-group and a register tile, no local memory, no barrier: scores_direct (over
 * the Kᵀ copy of layout.cl), scores_in_place (K read in place) and pv_direct. */

/* The direct kernels' indices: z = b·heads + h (kv head hk), rows from m0, keys (or O columns)
 * from n0 in blocks of NB_, L keys in batch b, Ab the head's rows of A. */
#define DIRECT_INDICES(NB_)                                                                      \
    const int nx_ = (N + (NB_)-1) / (NB_), ny_ = (M + RM - 1) / RM; /* the grid's tiles */       \
    const int z = TILE_Z(nx_, ny_);                                                              \
    const int b = z / heads, h = z % heads, hk = h / group;                                      \
    const int m0 = TILE_Y(nx_, ny_) * RM, n0 = TILE_X(nx_) * (NB_);                              \
    const int L = keys_of_batch(kvlen, b, seq_kv);                                               \
    __global const T_A *Ab = A + a_off + (ulong)b * a_sb + (ulong)h * a_sh

/* acc[i][s] += w·A[row i][k] · bv[s] over a direct kernel's RM x NS register tile (arow: the
 * rows of A, w 1 or O_WEIGHT); a macro, so that acc stays in registers whatever the compiler
 * inlines. */
#define MAD_TILE(acc, arow, k, bv, w)                                                            \
    _Pragma("unroll") for (int i_ = 0; i_ < RM; i_++) {                                          \
        const float a_ = LD_A((arow)[i_], (k)) * (w);                                            \
        _Pragma("unroll") for (int s_ = 0; s_ < NS; s_++)                                        \
            (acc)[i_][s_] = MAD((float16)(a_), (bv)[s_], (acc)[i_][s_]);                         \
    }

#if DT_A != 0
/* acc[i][s] += a16[i][kk] · (16 values of row brow at 16·s) over scores_direct's tile. */
#define MAD_TILE16(acc, a16, kk, brow)                                                           \
    {                                                                                            \
        float16 bv_[NS];                                                                         \
        _Pragma("unroll") for (int s_ = 0; s_ < NS; s_++) bv_[s_] = vload16(0, (brow) + 16 * s_); \
        _Pragma("unroll") for (int i_ = 0; i_ < RM; i_++)                                        \
            _Pragma("unroll") for (int s_ = 0; s_ < NS; s_++)                                    \
                (acc)[i_][s_] = MAD((float16)((a16)[i_][kk]), bv_[s_], (acc)[i_][s_]);           \
    }

/* Elements col..col+15 of a row of A (n elements) as float16, 0 past n. Always inlined: see
 * qk16_row in kv_access.cl for what PoCL 3.1 made of vload_half16 in a called function. */
__attribute__((always_inline)) inline float16 ld16_a(__global const T_A *p, int col, int n)
{
    if (col + 15 < n)
        return LD16_A(p, col);
    float t[16];
    for (int e = 0; e < 16; e++)
        t[e] = col + e < n ? LD_A(p, col + e) : 0.0f;
    return vload16(0, t);
}
#endif

/* The scores x (scaled) of keys n..n+15 into row m of C (Cb, rows c_ss apart): the mask row
 * added (Mb, rows m_ss apart), keys at or past cend -inf (causal, key lengths), nothing past N.
 * Sixteen keys all hidden (n >= cend) are -inf whatever the mask and x; sixteen all before cend
 * take the mask as one vector (element by element, as the tails still do, scores with a finite
 * f32 mask took 10.8 ms instead of 6.2). See docs/measurements.md#store-scores16. */
__attribute__((always_inline)) inline void store_scores16(__global T_OUT *Cb, ulong c_ss,
                                                          __global const T_MASK *Mb, ulong m_ss, int m,
                                                          int n, int N, int cend, int has_mask,
                                                          float16 x)
{
    const int hidden = n >= cend;
    if (n + 15 < N && (n + 15 < cend || hidden)) {
        if (hidden) {
            x = (float16)(NEG_INF);
        } else if (has_mask) {
            /* A -inf mask hides the key even when its score is NaN. */
            const float16 mv = LD16_MASK(Mb, (ulong)m * m_ss + n);
            x = select(x + mv, (float16)(NEG_INF), mv == (float16)(NEG_INF));
        }
#if DT_OUT == 0
        vstore16(x, 0, Cb + (ulong)m * c_ss + n);
#elif DT_OUT == 1
        vstore_half16_rte(x, 0, Cb + (ulong)m * c_ss + n);
#else
        ST_BF16X16(Cb + (ulong)m * c_ss + n, f32_to_bf16_16(x));
#endif
        return;
    }
    float v[16];
    vstore16(x, 0, v);
    for (int e = 0; e < 16 && n + e < N; e++) {
        float y = v[e];
        if (has_mask) {
            /* A -inf mask hides the key even when its score is NaN. */
            const float mv = LD_MASK(Mb, (ulong)m * m_ss + n + e);
            y = mv == NEG_INF ? NEG_INF : y + mv;
        }
        ST_OUT(Cb, (ulong)m * c_ss + n + e, n + e < cend ? y : NEG_INF);
    }
}

/* Scores on CPUs (DIRECT): one work-item per RM x (16·NS) tile, no local memory, no barrier.
 * Q is read in place (its values broadcast from L1), Kᵀ as float16 vectors from the tile's panel
 * (transpose_k with KT_PANEL = 16·NS: head_dim rows of 16·NS keys, one contiguous block, where
 * rows of Kᵀ took a cache line from each of head_dim rows seq_kv floats apart: seq_q 512
 * seq_kv 16384 64.7 ms against 99.7; see docs/measurements.md#scores-direct). The accumulators
 * stay in registers. Rows beyond M and keys beyond N are computed from clamped/padded data and
 * never stored. Grid x = ceil(N / (16·NS)), y = ceil(M / RM), z = batch·heads (work-group
 * 1x1x1). */
#if !KSEL || K_scores_direct
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
scores_direct(GEMM_KERNEL_ARGS(float))
{
    DIRECT_INDICES(16 * NS);
#if KT_PANEL
#if KT && KT_PANEL != 16 * NS /* (transpose_k's builds set KT_PANEL alone) */
#error "scores_direct reads one panel of Kᵀ a tile: KT_PANEL must be 16·NS"
#endif
    __global const float *Bb = B + b_off + (ulong)b * b_sb + (ulong)hk * b_sh + (ulong)n0 * K;
    b_ss = 16 * NS; /* between the rows of a panel */
#else
    __global const float *Bb = B + b_off + (ulong)b * b_sb + (ulong)hk * b_sh + n0;
#endif

    __global const T_A *arow[RM];
#pragma unroll
    for (int i = 0; i < RM; i++)
        arow[i] = Ab + (ulong)min(m0 + i, M - 1) * a_ss;
    float16 acc[RM][NS];
#pragma unroll
    for (int i = 0; i < RM; i++)
#pragma unroll
        for (int s = 0; s < NS; s++)
            acc[i][s] = (float16)(0.0f);
    /* A tile whose keys all its rows hide (causal, key lengths: the last row sees the most) is
     * all -inf: its dot products are skipped, which halves the work of causal scores. */
    const int tile_end = causal_end(causal, min(M, m0 + RM) - 1, seq_q, L);
    const int depth = n0 < tile_end ? K : 0;
#if DT_A == 0
    for (int k = 0; k < depth; k++) {
        float16 bv[NS];
#pragma unroll
        for (int s = 0; s < NS; s++)
            bv[s] = vload16(0, Bb + (ulong)k * b_ss + 16 * s);
        MAD_TILE(acc, arow, k, bv, 1.0f)
    }
#else
    /* f16 and bf16 Q, where the scratch had no room for widen_q's f32 copy (src/scores.c):
     * 16 values of each row converted as one vector into private memory, then broadcast from
     * there, not one at a time at every k (vload_half: a dozen scalar bit operations on PoCL
     * 3.1; f16 scores 6.2 ms against 12.5). See docs/measurements.md#scores-direct. */
    for (int k0 = 0; k0 < depth; k0 += 16) {
        float a16[RM][16];
#pragma unroll
        for (int i = 0; i < RM; i++)
            vstore16(ld16_a(arow[i], k0, K), 0, a16[i]);
        if (k0 + 16 <= depth) {
#pragma unroll
            for (int kk = 0; kk < 16; kk++)
                MAD_TILE16(acc, a16, kk, Bb + (ulong)(k0 + kk) * b_ss)
        } else {
            for (int kk = 0; kk < depth - k0; kk++)
                MAD_TILE16(acc, a16, kk, Bb + (ulong)(k0 + kk) * b_ss)
        }
    }
#endif

    __global T_OUT *Cb = C + c_off + (ulong)b * c_sb + (ulong)h * c_sh;
    __global const T_MASK *Mb = mask + m_off + (ulong)b * m_sb + (ulong)h * m_sh;
    for (int i = 0; i < RM && m0 + i < M; i++) {
        const int m = m0 + i;
        const int cend = causal_end(causal, m, seq_q, L);
        for (int s = 0; s < NS; s++)
            store_scores16(Cb, c_ss, Mb, m_ss, m, n0 + 16 * s, N, cend, has_mask, acc[i][s] * alpha);
    }
}
#endif

#if defined(DP16)
/* Scores on CPUs with K read in place (DIRECT 1 with KT 0, or with few query rows: see
 * src/scores.c): one work-item per RM rows and 256 keys, in chunks of 16 keys through
 * qk16_tile (where QK_TILE_FOR(RM), common.cl) or qk16_row (kv_access.cl). With few rows the Kᵀ
 * copy's write and second read of K cost more than the horizontal sums of in-place dot
 * products. Grid x = ceil(N / 256), y = ceil(M / RM), z = batch·heads (work-group 1x1x1). */
#define SIP_KEYS 256
#if !KSEL || K_scores_in_place
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
scores_in_place(GEMM_KERNEL_ARGS(T_IN))
{
    DIRECT_INDICES(SIP_KEYS);
    __global const T_IN *Bb = B + b_off + (ulong)b * b_sb + (ulong)hk * b_sh;
    const kv_src rows = {0}; /* plain rows (kv_access.cl) */
    qrow q[RM];
#pragma unroll 1
    for (int i = 0; i < RM; i++) {
        __global const T_A *arow = Ab + (ulong)min(m0 + i, M - 1) * a_ss; /* rows past M: not stored */
        for (int d = 0; d < DP16; d++)
            q[i].f[d] = d < K ? LD_A(arow, d) : 0.0f;
    }
    __global T_OUT *Cb = C + c_off + (ulong)b * c_sb + (ulong)h * c_sh;
    __global const T_MASK *Mb = mask + m_off + (ulong)b * m_sb + (ulong)h * m_sh;
    const int n_end = min(N, n0 + SIP_KEYS);
    /* Chunks at or past the last row's end are hidden from every row: -inf, not computed. */
    const int tile_end = causal_end(causal, min(M, m0 + RM) - 1, seq_q, L);
    for (int kc = n0; kc < n_end; kc += 16) {
        float16 s[RM];
        if (kc >= tile_end) {
#pragma unroll 1
            for (int i = 0; i < RM && m0 + i < M; i++)
                store_scores16(Cb, c_ss, Mb, m_ss, m0 + i, kc, N, tile_end, has_mask, (float16)(0.0f));
            continue;
        }
#if QK_TILE_FOR(RM)
#pragma unroll 1
        for (int i0 = 0; i0 < RM; i0 += QT_R)
            qk16_tile(q + i0, Bb, &rows, 0, b_ss, kc, N - 1, K, s + i0);
#else
#pragma unroll 1
        for (int i = 0; i < RM; i++)
            s[i] = qk16_row(q + i, Bb, &rows, 0, b_ss, kc, N - 1, K);
#endif
#pragma unroll 1
        for (int i = 0; i < RM && m0 + i < M; i++) {
            const int m = m0 + i;
            store_scores16(Cb, c_ss, Mb, m_ss, m, kc, N, causal_end(causal, m, seq_q, L), has_mask,
                           s[i] * alpha);
        }
    }
}
#endif
#endif

#if MODE == 1
/* The NS float16 vectors of a V row's columns from vr, ncols of them existing (0 beyond). */
__attribute__((always_inline)) inline void load_v16s(__global const T_IN *vr, int ncols, float16 *bv)
{
#pragma unroll
    for (int s = 0; s < NS; s++)
        bv[s] = 16 * s + 15 < ncols ? LD16_IN(vr, 16 * s) : ld16_tail(vr, 16 * s, ncols);
}

/* P·V on CPUs (P·V DIRECT 1): one work-item per RM rows x 16·NS columns of O over every key its
 * rows see, no local memory, no barrier: V rows read in place as float16 vectors, P's values
 * broadcast, the accumulators in registers. Keys some row of the block hides are checked row by
 * row (IS_HIDDEN, see gemm's MODE 1) so that NaN or Inf in their V never reach O. Rows past M
 * compute on a copy of row M - 1 and are not stored. Grid x = ceil(N / (16·NS)),
 * y = ceil(M / RM), z = batch·heads (work-group 1x1x1).
 * O is summed at full scale, and again at half scale (o_from_half16, common.cl) only where the
 * first sum came out Inf or NaN somewhere in the tile: Inf or NaN in a visible V row (the second
 * sum gives them again), or V rows near ±FLT_MAX that the rounded weights took past it. Halving
 * the weights in the one sum cost a multiply per row and key (unfused 13.5 ms against 11.4).
 * See docs/measurements.md#pv-direct. */
#define PV_DIRECT_SUM(W)                                                                         \
    {                                                                                            \
        _Pragma("unroll") for (int i = 0; i < RM; i++)                                           \
            _Pragma("unroll") for (int s = 0; s < NS; s++) acc[i][s] = (float16)(0.0f);          \
        for (int c0 = 0; c0 < kend; c0 += PV_FOLD) {                                             \
            const int cfull = min(kfull, c0 + PV_FOLD), cend = min(kend, c0 + PV_FOLD);          \
            float16 part[RM][NS];                                                                \
            _Pragma("unroll") for (int i = 0; i < RM; i++)                                       \
                _Pragma("unroll") for (int s = 0; s < NS; s++) part[i][s] = (float16)(0.0f);     \
            int k = c0;                                                                          \
            for (; k < cfull; k++) {                                                             \
                float16 bv[NS];                                                                  \
                load_v16s(Bb + (ulong)k * b_ss, ncols, bv);                                      \
                MAD_TILE(part, arow, k, bv, W)                                                   \
            }                                                                                    \
            /* The rest 16 keys at a time: 16 keys that no row hides (with a mask of finite     \
             * values, all of them) go unchecked, the others key by key (a finite mask: unfused \
             * 16.4 ms against 22.6 when every key was checked). See                            \
             * docs/measurements.md#pv-direct. */                                                \
            while (k < cend) {                                                                   \
                if (k + 16 <= cend) {                                                            \
                    int16 hid = (int16)(0);                                                      \
                    _Pragma("unroll") for (int i = 0; i < RM; i++) hid |= IS_HIDDEN16(LD16_A(arow[i], k)); \
                    if (!any(hid)) {                                                             \
                        for (const int stop = k + 16; k < stop; k++) {                           \
                            float16 bv[NS];                                                      \
                            load_v16s(Bb + (ulong)k * b_ss, ncols, bv);                          \
                            MAD_TILE(part, arow, k, bv, W)                                       \
                        }                                                                        \
                        continue;                                                                \
                    }                                                                            \
                }                                                                                \
                for (const int stop = min(k + 16, cend); k < stop; k++) {                        \
                    float a[RM];                                                                 \
                    int seen = 0;                                                                \
                    _Pragma("unroll") for (int i = 0; i < RM; i++) {                             \
                        a[i] = LD_A(arow[i], k) * (W); /* -0 stays -0 */                         \
                        seen |= !IS_HIDDEN(a[i]);                                                \
                    }                                                                            \
                    if (!seen)                                                                   \
                        continue;                                                                \
                    float16 bv[NS];                                                              \
                    load_v16s(Bb + (ulong)k * b_ss, ncols, bv);                                  \
                    _Pragma("unroll") for (int i = 0; i < RM; i++) if (!IS_HIDDEN(a[i]))         \
                        _Pragma("unroll") for (int s = 0; s < NS; s++)                           \
                            part[i][s] = MAD((float16)(a[i]), bv[s], part[i][s]);                \
                }                                                                                \
            }                                                                                    \
            _Pragma("unroll") for (int i = 0; i < RM; i++)                                       \
                _Pragma("unroll") for (int s = 0; s < NS; s++) acc[i][s] += part[i][s];          \
        }                                                                                        \
    }

#if !KSEL || K_pv_direct
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
pv_direct(GEMM_KERNEL_ARGS(T_IN))
{
    DIRECT_INDICES(16 * NS);
    const int kend = causal_end(causal, min(M, m0 + RM) - 1, seq_q, L);
    const int kfull = min(kend, has_mask ? 0 : causal_end(causal, m0, seq_q, L)); /* all rows see k < kfull */
    __global const T_IN *Bb = B + b_off + (ulong)b * b_sb + (ulong)hk * b_sh + n0;
    __global const T_A *arow[RM];
#pragma unroll
    for (int i = 0; i < RM; i++)
        arow[i] = Ab + (ulong)min(m0 + i, M - 1) * a_ss;
    const int ncols = N - n0; /* columns of this block's V rows that exist */
    float16 acc[RM][NS];
    PV_DIRECT_SUM(1.0f)
    int16 odd = (int16)(0);
#pragma unroll
    for (int i = 0; i < RM; i++)
#pragma unroll
        for (int s = 0; s < NS; s++)
            odd |= isinf(acc[i][s]) | isnan(acc[i][s]);
    if (any(odd)) {
        PV_DIRECT_SUM(O_WEIGHT)
#pragma unroll
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int s = 0; s < NS; s++)
                acc[i][s] = o_from_half16(acc[i][s]);
    }
    __global T_OUT *Cb = C + c_off + (ulong)b * c_sb + (ulong)h * c_sh;
    for (int i = 0; i < RM && m0 + i < M; i++) {
        __global T_OUT *crow = Cb + (ulong)(m0 + i) * c_ss;
#pragma unroll
        for (int s = 0; s < NS; s++) {
            const int n = n0 + 16 * s;
            store4_row(crow, n, acc[i][s].s0123, N);
            store4_row(crow, n + 4, acc[i][s].s4567, N);
            store4_row(crow, n + 8, acc[i][s].s89ab, N);
            store4_row(crow, n + 12, acc[i][s].scdef, N);
        }
    }
}
#endif
#undef PV_DIRECT_SUM
#endif

/* Table-lookup decode attention, CUDA C++ source part 2 of 5 (after lut_common.cuh): what a CTA prepares
before its main loop (the table copies, the rotated query and its tensor-core fragments), and kernel 0,
lut_qprep, which makes the query's fragments once per step. */

// The table's TABLE_COPIES interleaved copies (and the rho table) into shared memory from byte 0
// (CTA_THREADS threads; the caller syncs before the first lookup). The tables are constant once the
// launcher's plan is built.
__device__ __forceinline__ void copy_tables(const unsigned char* __restrict__ tab, const u32* __restrict__ rhotab,
                                            unsigned char* smem, int tid) {
  // the copies of an entry are adjacent: written in 16-byte chunks (the entry repeated), chunk q
  // by thread q mod CTA_THREADS: no bank conflicts, all of a thread's loads in flight at once, and
  // few stores (the 32 KB table of 5-bit TurboQuant: 8 loads and 8 STS.128 per thread)
#if TABLE_COPIES * ENTRY_BYTES >= 16
  constexpr int CHUNKS_PER_ENTRY = TABLE_COPIES * ENTRY_BYTES / 16;
  constexpr int CHUNKS = TABLE_ENTRIES * CHUNKS_PER_ENTRY;
  constexpr int PER_THREAD = (CHUNKS + CTA_THREADS - 1) / CTA_THREADS;
#if LOOKUPS == 1
  uint2 tv[PER_THREAD];
#pragma unroll
  for (int k = 0; k < PER_THREAD; ++k) {
    const int q = tid + k * CTA_THREADS;
    tv[k] = q < CHUNKS ? __ldg((const uint2*)tab + q / CHUNKS_PER_ENTRY) : make_uint2(0u, 0u);
  }
#pragma unroll
  for (int k = 0; k < PER_THREAD; ++k) {
    const int q = tid + k * CTA_THREADS;
    if (q < CHUNKS) ((uint4*)smem)[q] = make_uint4(tv[k].x, tv[k].y, tv[k].x, tv[k].y);
  }
#else
  u32 tv[PER_THREAD];
#pragma unroll
  for (int k = 0; k < PER_THREAD; ++k) {
    const int q = tid + k * CTA_THREADS;
    tv[k] = q < CHUNKS ? __ldg((const u32*)tab + q / CHUNKS_PER_ENTRY) : 0u;
  }
#pragma unroll
  for (int k = 0; k < PER_THREAD; ++k) {
    const int q = tid + k * CTA_THREADS;
    if (q < CHUNKS) ((uint4*)smem)[q] = make_uint4(tv[k], tv[k], tv[k], tv[k]);
  }
#endif
#else  // fewer than 16 bytes of copies per entry: one entry copy per store, consecutive over threads
#if LOOKUPS == 1
  typedef u64 ent_t;
#else
  typedef u32 ent_t;
#endif
  const ent_t* src = (const ent_t*)tab;
  ent_t* dst = (ent_t*)smem;
  constexpr int PER_THREAD = (TABLE_ENTRIES * TABLE_COPIES + CTA_THREADS - 1) / CTA_THREADS;
#pragma unroll 8
  for (int k = 0; k < PER_THREAD; ++k) {
    const int w = tid + k * CTA_THREADS;
    if (w < TABLE_ENTRIES * TABLE_COPIES) dst[w] = __ldg(src + (w >> LOG2_COPIES));
  }
#endif
#if SCALE_BITS
  u32* rdst = (u32*)(smem + SMEM_RHO);
  for (int e = tid; e < (1 << SCALE_BITS) * 32; e += CTA_THREADS) rdst[e] = __ldg(rhotab + (e >> 5));
#endif
}

// The HEADS_PER_KV query rows of (batch, KV head) bh times the rotation's signs, Walsh-Hadamard rotated
// in shared memory: qb [HEADS_PER_KV * HEAD_DIM] fp32 (CTA_THREADS threads; ends with __syncthreads).
__device__ __forceinline__ void rotate_query(const void* __restrict__ q, const float* __restrict__ signs,
                                             int sign_stride, long long bh, int h, float* qb, int tid) {
  constexpr int ROWS = HEADS_PER_KV * HEAD_DIM;
  {
    constexpr int PER_THREAD = (ROWS + CTA_THREADS - 1) / CTA_THREADS;
    float qv[PER_THREAD], sv[PER_THREAD];
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
      const int i = tid + k * CTA_THREADS;
      qv[k] = i < ROWS ? ldq(q, (long long)bh * ROWS + i) : 0.f;
      sv[k] = i < ROWS ? __ldg(signs + h * sign_stride + (i % HEAD_DIM)) : 0.f;
    }
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
      const int i = tid + k * CTA_THREADS;
      if (i < ROWS) qb[i] = qv[k] * sv[k];
    }
  }
  __syncthreads();
  // Walsh-Hadamard butterflies, stages unrolled (constant strides: shifts, no divisions)
#pragma unroll
  for (int lg = 0; (1 << lg) < HEAD_DIM; ++lg) {
    const int len = 1 << lg;
    constexpr int PAIRS_PER_THREAD = (ROWS / 2 + CTA_THREADS - 1) / CTA_THREADS;
#pragma unroll
    for (int kk = 0; kk < PAIRS_PER_THREAD; ++kk) {
      const int i = tid + kk * CTA_THREADS;
      if (i < ROWS / 2) {
        const int g = i / (HEAD_DIM / 2), k = i % (HEAD_DIM / 2);
        const int i0 = g * HEAD_DIM + ((k >> lg) << (lg + 1)) + (k & (len - 1));
        const float x = qb[i0], y = qb[i0 + len];
        qb[i0] = x + y; qb[i0 + len] = x - y;
      }
    }
    __syncthreads();
  }
}

// Thread (r, c)'s B fragment of k-step s from the rotated query qb: group j = c * KEY_KSTEPS + s,
// coordinate GROUP_COORDS j + t in slot t (zero where t >= GROUP_COORDS, past HEAD_DIM, or
// r >= HEADS_PER_KV), times qscale, fp16.
__device__ __forceinline__ uint2 query_frag(const float* qb, int r, int c, int s, float qscale) {
  const int i0 = GROUP_COORDS * (c * KEY_KSTEPS + s);  // the group's first coordinate
  float x[4] = {0.f, 0.f, 0.f, 0.f};
  if (r < HEADS_PER_KV) {
    const float* qr = qb + r * HEAD_DIM;
#pragma unroll
    for (int t = 0; t < GROUP_COORDS; ++t)
      if (i0 + t < HEAD_DIM) x[t] = qr[i0 + t] * qscale;
  }
  return make_uint2(pack_h2(x[0], x[1]), pack_h2(x[2], x[3]));
}

// The sketch row whose product thread c feeds into slot t (x, y, z, w) of QJL k-step s: bit
// s + QJL_KSTEPS * (0, 2, 1, 3)[t] of the thread's run of 5 QJL_KSTEPS sign bits (decode_lut.cu, the
// QJL stage: qjl_scores).
__device__ __forceinline__ int sk_coord(int c, int s, int t) {
  return 4 * QJL_KSTEPS * c + s + QJL_KSTEPS * (t == 0 ? 0 : t == 1 ? 2 : t == 2 ? 1 : 3);
}

// Kernel 0 (config qprep 'launch'): the query fragments of every (batch, KV head), once per step
// rather than once per CTA of lut_split: qfrag [B * Hkv][KEY_KSTEPS + QJL_KSTEPS][32 lanes] (B
// fragment registers 0, 1): the rotated query's KEY_KSTEPS k-steps (CTA y = 0), then (HAS_QJL) the
// QJL_KSTEPS k-steps of its sketch Sq = M q (M^T [heads][HEAD_DIM][HEAD_DIM] fp32, the layout's sketch
// matrix) times qjl_scale, by CTAs y = 1 + c: the 4 QJL_KSTEPS sketch rows of lane column c (sk_coord),
// all heads. Spread over four CTAs, the sketch costs one L2 round trip per CTA; one CTA per (batch, KV
// head) doing all 128 rows took 8-9 us at B = 1 on the H100 (the step's whole fixed cost again).
// Grid (B * Hkv, HAS_QJL ? 5 : 1), CTA_THREADS threads.
extern "C" __global__ void __launch_bounds__(CTA_THREADS) lut_qprep(const LutQprepParams p) {
  pdl_trigger();  // lut_split (PDL) may start its table copies
  const int bh = blockIdx.x, tid = threadIdx.x;
  constexpr int NT = CTA_THREADS;
  constexpr int KSTEPS = KEY_KSTEPS + QJL_KSTEPS;
#if HAS_QJL
  if (blockIdx.y > 0) {
    // rows j0 + jj (jj < R) of M^T's columns, R consecutive lanes per d (coalesced); the warps' PR
    // parts of d summed through shared memory
    constexpr int R = 4 * QJL_KSTEPS;            // the sketch rows of one lane column
    constexpr int PR0 = NT / R;                   // parts of d: a power of two, so that they divide HEAD_DIM
    constexpr int PR = PR0 >= 16 ? 16 : PR0 >= 8 ? 8 : PR0 >= 4 ? 4 : PR0 >= 2 ? 2 : 1;
    constexpr int DR = HEAD_DIM / PR;
    __shared__ __align__(16) float qr[8 * HEAD_DIM];
    __shared__ float part[PR * 8 * R];
    __shared__ float sq[8 * R];
    const int c = blockIdx.y - 1, j0 = c * R;
    for (int i = tid; i < HEADS_PER_KV * HEAD_DIM; i += NT)
      qr[i] = ldq(p.q, (long long)bh * HEADS_PER_KV * HEAD_DIM + i);
    __syncthreads();
    const float* Mh = p.sketch + (long long)(bh % p.Hkv) * p.sketch_stride + j0;
    for (int i = tid; i < PR * R; i += NT) {
      const int jj = i % R, pr = i / R;
      float mv[DR];
#pragma unroll
      for (int dd = 0; dd < DR; ++dd) mv[dd] = __ldg(Mh + (pr * DR + dd) * HEAD_DIM + jj);
      float acc[HEADS_PER_KV];
#pragma unroll
      for (int g = 0; g < HEADS_PER_KV; ++g) {
        acc[g] = 0.f;
#pragma unroll
        for (int dd = 0; dd < DR; ++dd) acc[g] += mv[dd] * qr[g * HEAD_DIM + pr * DR + dd];
      }
#pragma unroll
      for (int g = 0; g < HEADS_PER_KV; ++g) part[(pr * 8 + g) * R + jj] = acc[g];
    }
    __syncthreads();
    for (int i = tid; i < HEADS_PER_KV * R; i += NT) {
      float v = 0.f;
#pragma unroll 8
      for (int pr = 0; pr < PR; ++pr) v += part[pr * 8 * R + i];
      sq[i] = v * p.qjl_scale;
    }
    __syncthreads();
    for (int i = tid; i < QJL_KSTEPS * 8; i += NT) {  // (k-step s, row r) of lane 4 r + c
      const int s = i >> 3, r = i & 7;
      float x[4] = {0.f, 0.f, 0.f, 0.f};
      if (r < HEADS_PER_KV) {
#pragma unroll
        for (int t = 0; t < 4; ++t) x[t] = sq[r * R + sk_coord(c, s, t) - j0];
      }
      p.qfrag[((long long)bh * KSTEPS + KEY_KSTEPS + s) * 32 + 4 * r + c] = make_uint2(pack_h2(x[0], x[1]),
                                                                                     pack_h2(x[2], x[3]));
    }
    return;
  }
#endif
  __shared__ float qb[8 * HEAD_DIM];
  rotate_query(p.q, p.signs, p.sign_stride, bh, bh % p.Hkv, qb, tid);
  for (int i = tid; i < KEY_KSTEPS * 32; i += NT) {
    const int lane = i & 31;
    p.qfrag[(long long)bh * KSTEPS * 32 + i] = query_frag(qb, lane >> 2, lane & 3, i >> 5, p.qscale);
  }
}

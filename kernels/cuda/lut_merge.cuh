/* Table-lookup decode attention, CUDA C++ source part 3 of 5 (after lut_prep.cuh): the merge of the
splits' partial results with the native window, in one softmax. merge_splits is the in-kernel merge
(MERGE_IN_KERNEL: lut_split's last CTA per (batch, KV head)); kernel 2, lut_combine, the separate
launch (the default). */

// Merge of the splits and the native window for all HEADS_PER_KV query heads of one (batch, KV head),
// by the CTA that finished last (CTA_THREADS threads; scratch = the CTA's stage area). The maxima,
// window scores and split weights are computed for all heads at once; each thread then owns
// OUTS_PER_THREAD output coordinates (g, d) and sums the splits' partial outputs (coalesced over (g, d),
// SPLITS_IN_FLIGHT splits of loads in flight) and the window's values.
constexpr int MERGE_OUTS = HEADS_PER_KV * HEAD_DIM;
constexpr int OUTS_PER_THREAD = (MERGE_OUTS + CTA_THREADS - 1) / CTA_THREADS;
constexpr int SPLITS_IN_FLIGHT = OUTS_PER_THREAD >= 4 ? 4 : 16 / OUTS_PER_THREAD;
constexpr int WINDOW_IN_FLIGHT = 8;  // window values in flight per output
__device__ __forceinline__ void merge_splits(
    const void* __restrict__ q, const float* __restrict__ o_part, const float* __restrict__ ml_part,
    const LutWindow win, const LutOutput dst, int S, int b, int h, long long bh, float* scr) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int W = win.tokens;
  const long long skb = win.k_stride[0], skh = win.k_stride[1], skt = win.k_stride[2];
  const long long svb = win.v_stride[0], svh = win.v_stride[1], svt = win.v_stride[2];
  const float sm_log2 = dst.sm_log2;
  float* Mg = scr;                 // [8] running max per head
  float* Al = scr + 8;             // [8] rescale factor of the current window pass
  float* Lw = scr + 16;            // [8] window sum per head
  float* red = scr + 24;           // [NUM_WARPS][8]
  float* qs = red + NUM_WARPS * 8; // [HEADS_PER_KV * HEAD_DIM]
  float* pw = qs + MERGE_OUTS;     // [MERGE_WINDOW_CHUNK][8] window scores, then probabilities
  float* wts = pw + MERGE_WINDOW_CHUNK * 8;  // [MERGE_SPLIT_CHUNK][8] split weights
  const float* ml = ml_part + bh * S * 16;
  const int gt = tid & 7;          // the head this thread's (split, head) pairs belong to
  // output coordinate k of this thread: index i (clamped), its head and coordinate
  auto out_index = [tid](int k) {
    return (tid + k * CTA_THREADS) < MERGE_OUTS ? (tid + k * CTA_THREADS) : MERGE_OUTS - 1;
  };
  auto out_head = [&](int k) { return out_index(k) / HEAD_DIM; };
  auto out_coord = [&](int k) { return out_index(k) % HEAD_DIM; };
  // ---- the largest split max per head -----------------------------------------------------------
  float m = -1e30f;
  if (gt < HEADS_PER_KV)
    for (int i = tid; i < S * 8; i += CTA_THREADS) m = fmaxf(m, __ldcg(ml + 2 * i));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
  if (lane < 8) red[warp * 8 + lane] = m;
  int wl = W;
  if (win.has_lengths) { wl = __ldg(win.lengths + b); wl = wl < W ? wl : W; wl = wl > 0 ? wl : 0; }
  if (wl > 0)
    for (int i = tid; i < MERGE_OUTS; i += CTA_THREADS) qs[i] = ldq(q, bh * HEADS_PER_KV * HEAD_DIM + i);
  __syncthreads();
  if (tid < 8) {
    float M = -1e30f;
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) M = fmaxf(M, red[w * 8 + tid]);
    Mg[tid] = M; Lw[tid] = 0.f;
  }
  float O[OUTS_PER_THREAD];
#pragma unroll
  for (int k = 0; k < OUTS_PER_THREAD; ++k) O[k] = 0.f;
  __syncthreads();
  // ---- native window, MERGE_WINDOW_CHUNK tokens per pass (online rescaling) ---------------------
  for (int c0 = 0; c0 < wl; c0 += MERGE_WINDOW_CHUNK) {
    const int n = wl - c0 < MERGE_WINDOW_CHUNK ? wl - c0 : MERGE_WINDOW_CHUNK;
    for (int t = warp; t < MERGE_WINDOW_CHUNK; t += NUM_WARPS) {
      float kv[HEAD_DIM / 32];
      if (t < n) {
        const long long base = b * skb + h * skh + (long long)(c0 + t) * skt;
#pragma unroll
        for (int e = 0; e < HEAD_DIM / 32; ++e) kv[e] = ldq(win.k, base + lane + 32 * e);
      }
#pragma unroll
      for (int g = 0; g < HEADS_PER_KV; ++g) {
        float a = 0.f;
        if (t < n) {
#pragma unroll
          for (int e = 0; e < HEAD_DIM / 32; ++e) a += qs[g * HEAD_DIM + lane + 32 * e] * kv[e];
        }
#pragma unroll
        for (int k = 16; k > 0; k >>= 1) a += __shfl_xor_sync(0xffffffffu, a, k);
        if (lane == 0) pw[t * 8 + g] = t < n ? a * sm_log2 : -1e30f;
      }
    }
    __syncthreads();
    if (tid < 8) {
      float cm = -1e30f;
      for (int t = 0; t < n; ++t) cm = fmaxf(cm, pw[t * 8 + tid]);
      const float nm = fmaxf(Mg[tid], cm);
      Al[tid] = ex2(Mg[tid] - nm); Mg[tid] = nm;
    }
    __syncthreads();
    for (int i = tid; i < MERGE_WINDOW_CHUNK * 8; i += CTA_THREADS)
      pw[i] = (i >> 3) < n && (i & 7) < HEADS_PER_KV ? ex2(pw[i] - Mg[i & 7]) : 0.f;
    __syncthreads();
    if (tid < 8) {
      float l = Lw[tid] * Al[tid];
      for (int t = 0; t < n; ++t) l += pw[t * 8 + tid];
      Lw[tid] = l;
    }
#pragma unroll
    for (int k = 0; k < OUTS_PER_THREAD; ++k) O[k] *= Al[out_head(k)];
    for (int t0 = 0; t0 < n; t0 += WINDOW_IN_FLIGHT) {
#pragma unroll
      for (int k = 0; k < OUTS_PER_THREAD; ++k) {
        float vv[WINDOW_IN_FLIGHT];
#pragma unroll
        for (int t = 0; t < WINDOW_IN_FLIGHT; ++t)
          vv[t] = t0 + t < n ? ldq(win.v, b * svb + h * svh + (long long)(c0 + t0 + t) * svt + out_coord(k)) : 0.f;
#pragma unroll
        for (int t = 0; t < WINDOW_IN_FLIGHT; ++t) O[k] += pw[(t0 + t) * 8 + out_head(k)] * vv[t];
      }
    }
    __syncthreads();
  }
  // ---- splits: weights for MERGE_SPLIT_CHUNK splits at a time, then every thread sums its coordinates
  const float Mt = Mg[gt];
  float lsum = 0.f;
  const float* op = o_part + bh * S * 8 * HEAD_DIM;
  for (int s0 = 0; s0 < S; s0 += MERGE_SPLIT_CHUNK) {
    const int n = S - s0 < MERGE_SPLIT_CHUNK ? S - s0 : MERGE_SPLIT_CHUNK;
    for (int i = tid; i < MERGE_SPLIT_CHUNK * 8; i += CTA_THREADS) {
      float w = 0.f;
      if ((i >> 3) < n && gt < HEADS_PER_KV) {
        const float* e = ml + ((s0 + (i >> 3)) * 8 + gt) * 2;
        w = ex2(__ldcg(e) - Mt);
        lsum += w * __ldcg(e + 1);
      }
      wts[i] = w;
    }
    __syncthreads();
    int s = 0;
    for (; s + SPLITS_IN_FLIGHT <= n; s += SPLITS_IN_FLIGHT) {
      float ov[SPLITS_IN_FLIGHT][OUTS_PER_THREAD];
#pragma unroll
      for (int u = 0; u < SPLITS_IN_FLIGHT; ++u)
#pragma unroll
        for (int k = 0; k < OUTS_PER_THREAD; ++k)
          ov[u][k] = __ldcg(op + ((long long)(s0 + s + u) * 8 + out_head(k)) * HEAD_DIM + out_coord(k));
#pragma unroll
      for (int u = 0; u < SPLITS_IN_FLIGHT; ++u)
#pragma unroll
        for (int k = 0; k < OUTS_PER_THREAD; ++k) O[k] += wts[(s + u) * 8 + out_head(k)] * ov[u][k];
    }
    for (; s < n; ++s)
#pragma unroll
      for (int k = 0; k < OUTS_PER_THREAD; ++k)
        O[k] += wts[s * 8 + out_head(k)]
                * __ldcg(op + ((long long)(s0 + s) * 8 + out_head(k)) * HEAD_DIM + out_coord(k));
    __syncthreads();
  }
  lsum += __shfl_xor_sync(0xffffffffu, lsum, 8);
  lsum += __shfl_xor_sync(0xffffffffu, lsum, 16);
  if (lane < 8) red[warp * 8 + lane] = lsum;
  __syncthreads();
  if (tid < 8) {
    float l = Lw[tid];
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) l += red[w * 8 + tid];
    Lw[tid] = l;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < OUTS_PER_THREAD; ++k) {
    const int i = tid + k * CTA_THREADS;
    if (i < MERGE_OUTS) {
      const float L = Lw[out_head(k)];
      stq(dst.out, bh * HEADS_PER_KV * HEAD_DIM + i, L > 0.f ? O[k] / L : 0.f);
      if (dst.write_lse && out_coord(k) == 0)
        dst.lse[bh * HEADS_PER_KV + out_head(k)] = L > 0.f ? (Mg[out_head(k)] + lg2(L)) * 0.6931471805599453f
                                                            : __int_as_float(0xff800000);
    }
  }
}

// Kernel 2: one (batch, query head) per CTA, one output coordinate per thread; grid (B * Hq), HEAD_DIM
// threads. Attends the native window and merges the splits in one softmax, writes the output (and the
// natural log-sum-exp). Every loop issues its loads together (constant trip counts or unrolled batches):
// the latency of L2 is paid a few times, not once per split or window token. Launched with programmatic
// dependent launch (config pdl): it starts once every CTA of lut_split has started, attends the window
// meanwhile, and waits for lut_split's partials only then (griddepcontrol.wait).
constexpr int COMBINE_WINDOW_CHUNK = HEAD_DIM / 4;  // window tokens per pass: 4 lanes per token
extern "C" __global__ void __launch_bounds__(HEAD_DIM) lut_combine(const LutCombineParams p) {
  constexpr int WCH = COMBINE_WINDOW_CHUNK;
  __shared__ float qs[HEAD_DIM];
  __shared__ float sw[WCH];
  __shared__ float red[HEAD_DIM / 32];
  __shared__ float wsp[HEAD_DIM], lsp[HEAD_DIM];
  const LutWindow win = p.window;  // (a copy: the struct's address is never taken, see lut_split)
  const int S = p.S, W = win.tokens;
  const long long skb = win.k_stride[0], skh = win.k_stride[1], skt = win.k_stride[2];
  const long long svb = win.v_stride[0], svh = win.v_stride[1], svt = win.v_stride[2];
  const int pid = blockIdx.x, d = threadIdx.x, lane = d & 31, warp = d >> 5;
  const int b = pid / p.Hq, hq = pid % p.Hq, h = hq / HEADS_PER_KV, g = hq % HEADS_PER_KV;
  const long long bh = (long long)b * p.Hkv + h;
  const float* ml = p.ml_part + bh * S * 16;
  // The window part reads only the query and the window, written before the launch chain began:
  // with config pdl this kernel may run it while lut_split still runs, and waits (pdl_wait) only
  // before it reads the splits' partials.
  int wl = W;
  if (win.has_lengths) { wl = __ldg(win.lengths + b); wl = wl < W ? wl : W; }
  if (wl > 0) qs[d] = ldq(p.q, (long long)pid * HEAD_DIM + d);
  __syncthreads();
  float M = -1e30f, Lsum = 0.f, O = 0.f;
  // ---- native window, WCH tokens per pass: 4 lanes per token, HEAD_DIM / 4 coordinates each ------
  for (int c0 = 0; c0 < wl; c0 += WCH) {
    const int n = wl - c0 < WCH ? wl - c0 : WCH;
    const int t = d >> 2, part = d & 3;
    float a = 0.f;
    if (t < n) {
      const long long base = b * skb + h * skh + (long long)(c0 + t) * skt + part * (HEAD_DIM / 4);
#pragma unroll
      for (int e = 0; e < HEAD_DIM / 4; ++e) a += qs[part * (HEAD_DIM / 4) + e] * ldq(win.k, base + e);
    }
    a += __shfl_xor_sync(0xffffffffu, a, 1);
    a += __shfl_xor_sync(0xffffffffu, a, 2);
    if (part == 0 && t < WCH) sw[t] = t < n ? a * p.output.sm_log2 : -1e30f;
    __syncthreads();
    float cmw = -1e30f;
#pragma unroll
    for (int k = 0; k < WCH; ++k) cmw = fmaxf(cmw, sw[k]);
    const float nm = fmaxf(M, cmw), al = ex2(M - nm);
    O *= al; Lsum *= al; M = nm;
    float vv[WCH];
#pragma unroll
    for (int k = 0; k < WCH; ++k) vv[k] = k < n ? ldq(win.v, b * svb + h * svh + (long long)(c0 + k) * svt + d) : 0.f;
#pragma unroll
    for (int k = 0; k < WCH; ++k) {
      const float pk = k < n ? ex2(sw[k] - M) : 0.f;
      Lsum += pk;
      O += pk * vv[k];
    }
    __syncthreads();
  }
  pdl_wait();  // lut_split has finished: its partials are visible (read through L2: __ldcg)
  // ---- the largest split max (splits in parallel), then the window's sums rescaled to it --------
  {
    float cm = -1e30f;
    for (int s = d; s < S; s += HEAD_DIM) cm = fmaxf(cm, __ldcg(ml + (s * 8 + g) * 2));
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, k));
    if (lane == 0) red[warp] = cm;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < HEAD_DIM / 32; ++k) cm = fmaxf(cm, red[k]);
    const float nm = fmaxf(M, cm), al = ex2(M - nm);
    O *= al; Lsum *= al; M = nm;
  }
  // ---- splits: weights in parallel, then every thread sums its coordinate ----------------------
  const float* op = p.o_part + bh * S * 8 * HEAD_DIM + g * HEAD_DIM + d;
  for (int s0 = 0; s0 < S; s0 += HEAD_DIM) {
    const int s = s0 + d;
    wsp[d] = s < S ? ex2(__ldcg(ml + (s * 8 + g) * 2) - M) : 0.f;
    lsp[d] = s < S ? __ldcg(ml + (s * 8 + g) * 2 + 1) : 0.f;
    __syncthreads();
    const int n = S - s0 < HEAD_DIM ? S - s0 : HEAD_DIM;
    int k = 0;
    for (; k + 16 <= n; k += 16) {
      float ov[16];
#pragma unroll
      for (int u = 0; u < 16; ++u) ov[u] = __ldcg(op + (long long)(s0 + k + u) * 8 * HEAD_DIM);
#pragma unroll
      for (int u = 0; u < 16; ++u) { O += wsp[k + u] * ov[u]; Lsum += wsp[k + u] * lsp[k + u]; }
    }
    for (; k < n; ++k) { O += wsp[k] * __ldcg(op + (long long)(s0 + k) * 8 * HEAD_DIM); Lsum += wsp[k] * lsp[k]; }
    __syncthreads();
  }
  stq(p.output.out, (long long)pid * HEAD_DIM + d, Lsum > 0.f ? O / Lsum : 0.f);
  if (p.output.write_lse && d == 0)
    p.output.lse[pid] = Lsum > 0.f ? (M + lg2(Lsum)) * 0.6931471805599453f : __int_as_float(0xff800000);
}

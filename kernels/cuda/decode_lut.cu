/* Table-lookup decode attention: CUDA C++ source, loaded by kernels/cuda/decode_lut.py.

Compiled by NVRTC (CuPy) with a block of #define lines in front, one module per
configuration. Constants: D (head dim, 64 or 128), G (query heads per KV head, <= 8); the keys as
the codec's layout declares them (kernels.fused_layout.CodeGroups: the token's codes row read as NG
group codes of CW bits, group j coding the GW = 3 or 4 rotated coordinates GW j .. GW j + GW - 1;
an OCTOPUS triplet, or 4 TurboQuant scalar codes) and how a group code becomes the 4 fragment
slots (x, y, z, w) (decode_lut.Lookup): NLK = 1: one 8-byte table entry (x, y, z, w) indexed by the
code's low IB bits, where SB > 0 times a half2 factor indexed by the SB bits above them (OCTOPUS's
unfused (u, v) -> direction table and rho table); NLK = 2: two 4-byte entries, (x, y) by the low IB
bits and (z, w) by the next IB (pairs of scalar codes). UB (bytes per token of the key codes; UALN:
UB is a multiple of 16 and KS * CW of 32, so every thread's run of codes starts at a word), VB
(value bits, 2..4; value groups of 32), C (table copies, a power of two <= 32, interleaved so that
lanes hit different banks), NW (warps per CTA), NSTAGE (pipeline stages per warp), MT (16-token
tiles per stage), QT (query / window / output dtype: 0 fp32, 1 fp16, 2 bf16), QJ (1: the keys
carry a QJL residual, m = D sign bits and an fp16 residual norm per token; needs QPREP). The kernel
reads no codec's name: only these.

Kernel 1 lut_split, grid (splits, B * Hkv), NW warps. Each warp owns every NW-th stage of
16 * MT tokens of its CTA's chunk and runs its own pipeline: lanes 0-4 (0-6 with QJ) each copy one
of the NF per-token fields of a stage (norm, key codes, value codes, scales, zeros; with QJ the sign
bits and residual norms; contiguous over tokens) with cp.async.bulk into shared memory, completing on an mbarrier, NSTAGE stages ahead;
each lane keeps its field's source address and advances it by a constant per stage (a stage's
bytes are a multiple of 16, so every field's misalignment is fixed per warp).

Per 16-token tile (lane = 4 * r + c):
  scores  S^T[16 tok x 8 heads] = K[16 x 4 KS] . Qf^T, mma m16n8k16, KS = ceil(NG / 4) k-steps.
          Thread c supplies the slots (2c, 2c+1, 2c+8, 2c+9) = (x, y, z, w) of group
          j = c * KS + s of tokens r and r + 8 (NLK = 1: ONE 8-byte table load gives both A
          registers of a token; NLK = 2: two 4-byte loads, one per register).
          The codes of groups c * KS .. c * KS + KS - 1 are one run of KS * CW bits of the
          token's row: a few word loads and funnel shifts align it once per token, then each
          table offset is one shift and one mask-or (the entry size and the lane's copy folded
          in): the stored code is the table index.
          The query side Qf (rotated once per CTA by a shared-memory Walsh-Hadamard butterfly,
          coordinate GW j + t in slot t of group j, zero where t >= GW or past D) stays in
          2 * KS registers.
  softmax per head in the log2 domain, rescaling the accumulators only when a running max grows;
          P^T goes from the accumulator layout to the B layout of the next product with
          movmatrix.trans (two per tile).
  values  O^T[d x heads] += V^T[16 d x 16 tok] . (P^T * scale). Coordinates are permuted so that
          every m-tile lies in one value group (its scale folds into B) and each thread's A
          registers come from one 4-code chunk per group and token pair: 1024 + code (or
          1024 + 2^VB code) is made exact in fp16 by OR-ing the code into 0x6400 ("magic
          number"), and a second product with A = -1024 removes the offset exactly.
          Zero points: one more product Z^T[group x tok] . P^T per tile.
  QJL residual (QJ = 1; TurboQuant-prod, OCTOPUS-QJL): the score of a token is
          norm * <Qf, K> + rnorm * <Sq, sign>, the second product over the m = D sketch rows
          as KSQ = D / 16 more k-steps into a second accumulator: Sign[16 tok x 16] . Sq^T, the
          A operand +-1 in fp16 made from the stored bits by one shift and one LOP3 per register
          (the bit moved to the fp16 sign, OR 1.0; bit 1 means +1), the B operand (the sketch of
          the query, Sq = M q with M the declared sketch matrix, times the estimator's coefficient)
          made once per step by lut_qprep and kept in shared memory (registers are at the cap).
          Thread c owns the sign bits of its run [4 KSQ c, 4 KSQ (c + 1)) of the token's row (one
          word at D = 128, a half word spread over two at D = 64): k-step s takes the run's bits
          s, s + 2 KSQ (slots x, y: 16 bits apart in the word, so one shift lands both on an fp16
          sign) and s + KSQ, s + 3 KSQ (slots z, w); lut_qprep orders Sq the same way (sk_coord).
The CTA merges its warps and writes unnormalised partial outputs and (max, sum) per head.

Kernel 2 lut_combine, grid (B * Hq), D threads: attends the native window and merges the
splits in one softmax, writes the output (and the natural log-sum-exp). Launched with programmatic
dependent launch (config pdl): it starts once every CTA of lut_split has started, attends the window
meanwhile, and waits for lut_split's partials only then (griddepcontrol.wait).

Kernel 0 lut_qprep (config qprep 'launch'), grid (B * Hkv, QJ ? 5 : 1): the rotated query's fragments once per
step (QPREP = 1), read by lut_split from global memory instead of rotating the query in every CTA;
lut_split, launched after it with PDL, copies the tables while it runs. With QJ it also makes the
fragments of the query's sketch (the QJL stage reads nothing else of the query).

MERGE_IN (config merge 'kernel', opt-in): no second launch; each CTA of lut_split bumps an int32
arrival counter per (batch, KV head) after writing its partials, and the last one (which resets
the counter) runs merge_splits for all G heads. Slower than the combine launch in every row of the
H100 benchmark (docs/decode_lut.md): the merge becomes one CTA's serial tail, and compiling it in
costs the main loop registers (128 against 119).
*/
typedef unsigned int u32;
typedef unsigned long long u64;

#define KS ((NG + 3) / 4)
#define NGRP (D / 32)
#define NMT (D / 16)
#define TOK (16 * MT)
#define TPAD 32
#define XN 4
#define XU UB
#define XV (D * VB / 8)
#define XS (2 * NGRP)
#define SZ(X) (TOK * (X) + TPAD)
#define OFF_N 0
#define OFF_U (OFF_N + SZ(XN))
#define OFF_V (OFF_U + SZ(XU))
#define OFF_S (OFF_V + SZ(XV))
#define OFF_Z (OFF_S + SZ(XS))
#ifndef QJ
#define QJ 0
#endif
#define XQ (D / 8)    /* QJL sign bytes per token (m = D) */
#define XR 2          /* the residual norm, fp16 */
#define OFF_Q (OFF_Z + SZ(XS))
#define OFF_R (OFF_Q + SZ(XQ))
#define STAGE_BYTES (QJ ? OFF_R + SZ(XR) : OFF_Z + SZ(XS))
#define KSQ (QJ ? D / 16 : 0)  /* QJL k-steps */
#define EB (8 / NLK)              /* bytes per table entry */
#define NE (1 << IB)
#if SB
#define RHO_BYTES ((1 << SB) * 32 * 4)
#else
#define RHO_BYTES 0
#endif
#define TAB_BYTES (NE * C * EB)
#define RHO_OFF TAB_BYTES
#define MB_OFF (((RHO_OFF + RHO_BYTES) + 15) / 16 * 16)
#define QB_OFF (MB_OFF + ((NW * NSTAGE * 8 + 15) / 16 * 16))
#ifndef QPREP
#define QPREP 0
#endif
#if QJ && !QPREP
#error "the QJL stage reads the query's sketch from lut_qprep (QPREP = 1)"
#endif
#define SK_OFF (QB_OFF + (QPREP ? 0 : 8 * D * 4))  /* the rotated query, unless lut_qprep made it */
#define ST_OFF (SK_OFF + KSQ * 32 * 8)              /* the sketch's B fragments (QJ) */
#define MCH 32   /* window tokens per pass of the in-kernel merge */
#define SCH 128  /* splits per pass of the in-kernel merge */
#ifndef MERGE_IN
#define MERGE_IN 0
#endif
#if MERGE_IN
#define MSCR_BYTES ((24 + NW * 8 + G * D + MCH * 8 + SCH * 8) * 4)
#else
#define MSCR_BYTES 0
#endif
#define MERGE_BYTES0 (NW * 8 * D * 4 + NW * 64)
#define MERGE_BYTES (MERGE_BYTES0 > MSCR_BYTES ? MERGE_BYTES0 : MSCR_BYTES)
#define STAGE_AREA (NW * NSTAGE * STAGE_BYTES)
#define SMEM_BYTES (ST_OFF + (STAGE_AREA > MERGE_BYTES ? STAGE_AREA : MERGE_BYTES))
#define NWO ((KS * CW + 31) / 32)  /* words of a thread's run of codes */
#define LC (C >= 32 ? 5 : C >= 16 ? 4 : C >= 8 ? 3 : C >= 4 ? 2 : C >= 2 ? 1 : 0)
#define TSH ((NLK == 1 ? 3 : 2) + LC)  /* log2 of the bytes per table entry and its C copies */
#define NF (QJ ? 7 : 5)           /* per-token fields copied per stage */
#define VM ((1u << VB) - 1u)
#define NEG1024 0xE400E400u

extern "C" __constant__ int lut_smem_bytes[4] = {SMEM_BYTES, ST_OFF, STAGE_BYTES, TAB_BYTES};

__device__ __forceinline__ u32 sa(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(u32 a, u32 n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(a), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_expect(u32 a, u32 tx) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(a), "r"(tx) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 a, u32 par) {
  asm volatile("{\n\t.reg .pred P1;\n\tLAB_WAIT:\n\t"
               "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t"
               "@P1 bra DONE;\n\tbra LAB_WAIT;\n\tDONE:\n\t}" :: "r"(a), "r"(par) : "memory");
}
__device__ __forceinline__ void bulk_g2s(u32 dst, u64 src, u32 bytes, u32 mbar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(mbar) : "memory");
}
__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
  u32 r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
  u32 r; asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r;
}
__device__ __forceinline__ u32 trans8(u32 a) {
  u32 r; asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(a)); return r;
}
__device__ __forceinline__ float ex2(float x) {
  float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
}
__device__ __forceinline__ float lg2(float x) {
  float y; asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
}
__device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// Programmatic dependent launch (sm_90). A kernel launched with the PDL attribute may start while
// the kernel before it in the stream still runs: pdl_wait() blocks until that kernel has finished
// and its writes are visible; pdl_trigger() lets the next PDL-launched kernel start. Both are no-ops
// in a kernel launched without the attribute.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
// Bits [o, o + n) of a thread's run of codes (U[0] holds its bits 0-31, ...), shifted left by shl
// and OR-ed with orv (the lane's table copy): one shift (a funnel shift where the field crosses a
// word) and one LOP3 (mask and OR: written as lop3, which the compiler otherwise splits in two for
// some masks). o, n, shl are constants after unrolling; n + shl <= 32.
__device__ __forceinline__ u32 run_bits(const u32* U, int o, int n, int shl, u32 orv) {
  const int wi = o >> 5, sh = o & 31;
  u32 x;
  if (sh + n <= 32) x = sh >= shl ? (U[wi] >> (sh - shl)) : (U[wi] << (shl - sh));
  else x = __funnelshift_r(U[wi], U[wi + 1], sh - shl);
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(x), "r"(((1u << n) - 1u) << shl), "r"(orv));  // (a & b) | c
  return d;
}
// The QJL A operand: the token's +-1 pair (slots at bits 15 and 31 of w << sh) as fp16x2, bit 1 -> +1:
// (~(w << sh) & 0x80008000) | 0x3C003C00, one shift and one LOP3.
__device__ __forceinline__ u32 qjl_pm1(u32 w, int sh) {
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0xAE;" : "=r"(d) : "r"(w << sh), "r"(0x80008000u), "r"(0x3C003C00u));  // (~a & b) | c
  return d;
}
__device__ __forceinline__ float h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ float ldq(const void* p, long long i) {
#if QT == 0
  return ((const float*)p)[i];
#elif QT == 1
  unsigned short h = ((const unsigned short*)p)[i]; float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
#else
  unsigned short h = ((const unsigned short*)p)[i]; return __uint_as_float(((u32)h) << 16);
#endif
}
__device__ __forceinline__ void stq(void* p, long long i, float v) {
#if QT == 0
  ((float*)p)[i] = v;
#elif QT == 1
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v)); ((unsigned short*)p)[i] = h;
#else
  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v)); ((unsigned short*)p)[i] = h;
#endif
}

// One lane per field (lanes < NF): the source address of this warp's next stage (16-byte aligned,
// advanced by NW stages' bytes, a multiple of 16, per issue), the field's end (rounded up to 16)
// and the stage offset. A stage copies TOK tokens + 16 bytes (the misalignment), clamped at the end.
struct Issuer {
  u64 a, end;
  u32 step, full, off;
};

__device__ __forceinline__ void issue_stage(Issuer& is, u32 sdst, u32 mbar, int lane) {
  u32 n = 0;
  if (lane < NF) {
    u64 e = is.a + is.full;
    if (e > is.end) e = is.end;
    n = e > is.a ? (u32)(e - is.a) : 0u;
  }
  const u32 tx = __reduce_add_sync(0xffffffffu, n);
  if (lane == 0) mbar_expect(mbar, tx);
  __syncwarp();
  if (n) bulk_g2s(sdst + is.off, is.a, n, mbar);
  is.a += is.step;
}

// ------------------------------------------------------------------------------------------------
// Merge of the splits and the native window for all G query heads of one (batch, KV head), by the
// CTA that finished last (NW * 32 threads; scratch = the CTA's stage area). The maxima, window
// scores and split weights are computed for all heads at once; each thread then owns NOUT output
// coordinates (g, d) and sums the splits' partial outputs (coalesced over (g, d), SU splits of
// loads in flight) and the window's values.
#define NTH (NW * 32)
#define NOUT ((G * D + NTH - 1) / NTH)
#define SU (NOUT >= 4 ? 4 : 16 / NOUT)
#define VU 8  /* window values in flight per output */
__device__ __forceinline__ void merge_splits(
    const void* __restrict__ q, const float* __restrict__ o_part, const float* __restrict__ ml_part,
    const void* __restrict__ wk, const void* __restrict__ wv, const int* __restrict__ wlens, int has_wlens, int W,
    long long skb, long long skh, long long skt, long long svb, long long svh, long long svt,
    float sm_log2, void* __restrict__ out, float* __restrict__ lse, int write_lse, int S, int b, int h,
    long long bh, float* scr) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float* Mg = scr;                 // [8] running max per head
  float* Al = scr + 8;             // [8] rescale factor of the current window pass
  float* Lw = scr + 16;            // [8] window sum per head
  float* red = scr + 24;           // [NW][8]
  float* qs = red + NW * 8;        // [G * D]
  float* pw = qs + G * D;          // [MCH][8] window scores, then probabilities
  float* wts = pw + MCH * 8;       // [SCH][8] split weights
  const float* ml = ml_part + bh * S * 16;
  const int gt = tid & 7;          // the head this thread's (split, head) pairs belong to
  // ---- the largest split max per head -----------------------------------------------------------
  float m = -1e30f;
  if (gt < G)
    for (int i = tid; i < S * 8; i += NTH) m = fmaxf(m, __ldcg(ml + 2 * i));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
  if (lane < 8) red[warp * 8 + lane] = m;
  int wl = W;
  if (has_wlens) { wl = wlens[b]; wl = wl < W ? wl : W; wl = wl > 0 ? wl : 0; }
  if (wl > 0)
    for (int i = tid; i < G * D; i += NTH) qs[i] = ldq(q, bh * G * D + i);
  __syncthreads();
  if (tid < 8) {
    float M = -1e30f;
#pragma unroll
    for (int w = 0; w < NW; ++w) M = fmaxf(M, red[w * 8 + tid]);
    Mg[tid] = M; Lw[tid] = 0.f;
  }
  float O[NOUT];
#pragma unroll
  for (int k = 0; k < NOUT; ++k) O[k] = 0.f;
#define OI(k) ((tid + (k) * NTH) < G * D ? (tid + (k) * NTH) : G * D - 1)
#define OG(k) (OI(k) / D)
#define OD(k) (OI(k) % D)
  __syncthreads();
  // ---- native window, MCH tokens per pass (online rescaling) -------------------------------------
  for (int c0 = 0; c0 < wl; c0 += MCH) {
    const int n = wl - c0 < MCH ? wl - c0 : MCH;
    for (int t = warp; t < MCH; t += NW) {
      float kv[D / 32];
      if (t < n) {
        const long long base = b * skb + h * skh + (long long)(c0 + t) * skt;
#pragma unroll
        for (int e = 0; e < D / 32; ++e) kv[e] = ldq(wk, base + lane + 32 * e);
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float a = 0.f;
        if (t < n) {
#pragma unroll
          for (int e = 0; e < D / 32; ++e) a += qs[g * D + lane + 32 * e] * kv[e];
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
    for (int i = tid; i < MCH * 8; i += NTH) pw[i] = (i >> 3) < n && (i & 7) < G ? ex2(pw[i] - Mg[i & 7]) : 0.f;
    __syncthreads();
    if (tid < 8) {
      float l = Lw[tid] * Al[tid];
      for (int t = 0; t < n; ++t) l += pw[t * 8 + tid];
      Lw[tid] = l;
    }
#pragma unroll
    for (int k = 0; k < NOUT; ++k) O[k] *= Al[OG(k)];
    for (int t0 = 0; t0 < n; t0 += VU) {
#pragma unroll
      for (int k = 0; k < NOUT; ++k) {
        float vv[VU];
#pragma unroll
        for (int t = 0; t < VU; ++t)
          vv[t] = t0 + t < n ? ldq(wv, b * svb + h * svh + (long long)(c0 + t0 + t) * svt + OD(k)) : 0.f;
#pragma unroll
        for (int t = 0; t < VU; ++t) O[k] += pw[(t0 + t) * 8 + OG(k)] * vv[t];
      }
    }
    __syncthreads();
  }
  // ---- splits: weights for SCH splits at a time, then every thread sums its coordinates ---------
  const float Mt = Mg[gt];
  float lsum = 0.f;
  const float* op = o_part + bh * S * 8 * D;
  for (int s0 = 0; s0 < S; s0 += SCH) {
    const int n = S - s0 < SCH ? S - s0 : SCH;
    for (int i = tid; i < SCH * 8; i += NTH) {
      float w = 0.f;
      if ((i >> 3) < n && gt < G) {
        const float* e = ml + ((s0 + (i >> 3)) * 8 + gt) * 2;
        w = ex2(__ldcg(e) - Mt);
        lsum += w * __ldcg(e + 1);
      }
      wts[i] = w;
    }
    __syncthreads();
    int s = 0;
    for (; s + SU <= n; s += SU) {
      float ov[SU][NOUT];
#pragma unroll
      for (int u = 0; u < SU; ++u)
#pragma unroll
        for (int k = 0; k < NOUT; ++k) ov[u][k] = __ldcg(op + ((long long)(s0 + s + u) * 8 + OG(k)) * D + OD(k));
#pragma unroll
      for (int u = 0; u < SU; ++u)
#pragma unroll
        for (int k = 0; k < NOUT; ++k) O[k] += wts[(s + u) * 8 + OG(k)] * ov[u][k];
    }
    for (; s < n; ++s)
#pragma unroll
      for (int k = 0; k < NOUT; ++k) O[k] += wts[s * 8 + OG(k)] * __ldcg(op + ((long long)(s0 + s) * 8 + OG(k)) * D + OD(k));
    __syncthreads();
  }
  lsum += __shfl_xor_sync(0xffffffffu, lsum, 8);
  lsum += __shfl_xor_sync(0xffffffffu, lsum, 16);
  if (lane < 8) red[warp * 8 + lane] = lsum;
  __syncthreads();
  if (tid < 8) {
    float l = Lw[tid];
#pragma unroll
    for (int w = 0; w < NW; ++w) l += red[w * 8 + tid];
    Lw[tid] = l;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < NOUT; ++k) {
    const int i = tid + k * NTH;
    if (i < G * D) {
      const float L = Lw[OG(k)];
      stq(out, bh * G * D + i, L > 0.f ? O[k] / L : 0.f);
      if (write_lse && OD(k) == 0)
        lse[bh * G + OG(k)] = L > 0.f ? (Mg[OG(k)] + lg2(L)) * 0.6931471805599453f : __int_as_float(0xff800000);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Per-CTA preparation of lut_split (and lut_qprep): the table copies and the rotated query.

// The table's C interleaved copies (and the rho table) into shared memory from byte 0 (NW * 32
// threads; the caller syncs before the first lookup). The tables are constant once the launcher's
// plan is built.
__device__ __forceinline__ void copy_tables(const unsigned char* __restrict__ tab, const u32* __restrict__ rhotab,
                                            unsigned char* smem, int tid) {
  // the C copies of an entry are adjacent: written in 16-byte chunks (the entry repeated), chunk q
  // by thread q mod (NW * 32): no bank conflicts, all of a thread's loads in flight at once, and
  // few stores (the 32 KB table of 4-bit TurboQuant: 8 loads and 8 STS.128 per thread)
#if C * EB >= 16
  constexpr int CPE = C * EB / 16;  // chunks per entry
  constexpr int NCH = NE * CPE;
  constexpr int NTC = (NCH + NW * 32 - 1) / (NW * 32);
#if NLK == 1
  uint2 tv[NTC];
#pragma unroll
  for (int k = 0; k < NTC; ++k) {
    const int q = tid + k * NW * 32;
    tv[k] = q < NCH ? __ldg((const uint2*)tab + q / CPE) : make_uint2(0u, 0u);
  }
#pragma unroll
  for (int k = 0; k < NTC; ++k) {
    const int q = tid + k * NW * 32;
    if (q < NCH) ((uint4*)smem)[q] = make_uint4(tv[k].x, tv[k].y, tv[k].x, tv[k].y);
  }
#else
  u32 tv[NTC];
#pragma unroll
  for (int k = 0; k < NTC; ++k) {
    const int q = tid + k * NW * 32;
    tv[k] = q < NCH ? __ldg((const u32*)tab + q / CPE) : 0u;
  }
#pragma unroll
  for (int k = 0; k < NTC; ++k) {
    const int q = tid + k * NW * 32;
    if (q < NCH) ((uint4*)smem)[q] = make_uint4(tv[k], tv[k], tv[k], tv[k]);
  }
#endif
#else  // fewer than 16 bytes of copies per entry: one entry copy per store, consecutive over threads
#if NLK == 1
  typedef u64 ent_t;
#else
  typedef u32 ent_t;
#endif
  const ent_t* src = (const ent_t*)tab;
  ent_t* dst = (ent_t*)smem;
  constexpr int NTE = (NE * C + NW * 32 - 1) / (NW * 32);
#pragma unroll 8
  for (int k = 0; k < NTE; ++k) {
    const int w = tid + k * NW * 32;
    if (w < NE * C) dst[w] = __ldg(src + (w >> LC));
  }
#endif
#if SB
  u32* rdst = (u32*)(smem + RHO_OFF);
  for (int e = tid; e < (1 << SB) * 32; e += NW * 32) rdst[e] = rhotab[e >> 5];
#endif
}

// The G query rows of (batch, KV head) bh times the rotation's signs, Walsh-Hadamard rotated in
// shared memory: qb [G * D] fp32 (NW * 32 threads; ends with __syncthreads).
__device__ __forceinline__ void rotate_query(const void* __restrict__ q, const float* __restrict__ signs, int sign_stride,
                                             long long bh, int h, float* qb, int tid) {
  {
    constexpr int NQE = (G * D + NW * 32 - 1) / (NW * 32);
    float qv[NQE], sv[NQE];
#pragma unroll
    for (int k = 0; k < NQE; ++k) {
      const int i = tid + k * NW * 32;
      qv[k] = i < G * D ? ldq(q, (long long)bh * G * D + i) : 0.f;
      sv[k] = i < G * D ? signs[h * sign_stride + (i % D)] : 0.f;
    }
#pragma unroll
    for (int k = 0; k < NQE; ++k) {
      const int i = tid + k * NW * 32;
      if (i < G * D) qb[i] = qv[k] * sv[k];
    }
  }
  __syncthreads();
  // Walsh-Hadamard butterflies, stages unrolled (constant strides: shifts, no divisions)
#pragma unroll
  for (int lg = 0; (1 << lg) < D; ++lg) {
    const int len = 1 << lg;
    constexpr int NB = (G * D / 2 + NW * 32 - 1) / (NW * 32);
#pragma unroll
    for (int kk = 0; kk < NB; ++kk) {
      const int i = tid + kk * NW * 32;
      if (i < G * D / 2) {
        const int g = i / (D / 2), k = i % (D / 2);
        const int i0 = g * D + ((k >> lg) << (lg + 1)) + (k & (len - 1));
        const float x = qb[i0], y = qb[i0 + len];
        qb[i0] = x + y; qb[i0 + len] = x - y;
      }
    }
    __syncthreads();
  }
}

// Thread (r, c)'s B fragment of k-step s from the rotated query qb [G * D]: group j = c * KS + s,
// coordinate GW j + t in slot t (zero where t >= GW, past D, or r >= G), times qscale, fp16.
__device__ __forceinline__ uint2 query_frag(const float* qb, int r, int c, int s, float qscale) {
  const int i0 = GW * (c * KS + s);  // the group's first coordinate
  float x[4] = {0.f, 0.f, 0.f, 0.f};
  if (r < G) {
    const float* qr = qb + r * D;
#pragma unroll
    for (int t = 0; t < GW; ++t)
      if (i0 + t < D) x[t] = qr[i0 + t] * qscale;
  }
  return make_uint2(pack_h2(x[0], x[1]), pack_h2(x[2], x[3]));
}

// The sketch row whose product thread c feeds into slot t (x, y, z, w) of QJL k-step s: bit
// s + KSQ * (0, 2, 1, 3)[t] of the thread's run of 4 KSQ sign bits (see the QJL stage above).
__device__ __forceinline__ int sk_coord(int c, int s, int t) {
  return 4 * KSQ * c + s + KSQ * (t == 0 ? 0 : t == 1 ? 2 : t == 2 ? 1 : 3);
}

// Kernel 0 (config qprep 'launch'): the query fragments of every (batch, KV head), once per step
// rather than once per CTA of lut_split: qfrag [B * Hkv][KS + KSQ][32 lanes] (B fragment registers
// 0, 1): the rotated query's KS k-steps (CTA y = 0), then (QJ) the KSQ k-steps of its sketch
// Sq = M q (skm: M^T [heads][D][D] fp32, the layout's sketch matrix, head stride skm_stride) times
// qjscale, by CTAs y = 1 + c: the 4 KSQ sketch rows of lane column c (sk_coord), all heads. Spread
// over four CTAs, the sketch costs one L2 round trip per CTA; one CTA per (batch, KV head) doing
// all 128 rows took 8-9 us at B = 1 on the H100 (the step's whole fixed cost again).
// Grid (B * Hkv, QJ ? 5 : 1), NW * 32 threads.
extern "C" __global__ void __launch_bounds__(NW * 32) lut_qprep(
    const void* __restrict__ q, const float* __restrict__ signs, int sign_stride, int Hkv, float qscale,
    const float* __restrict__ skm, int skm_stride, float qjscale, uint2* __restrict__ qfrag) {
  pdl_trigger();  // lut_split (PDL) may start its table copies
  const int bh = blockIdx.x, tid = threadIdx.x;
  constexpr int NT = NW * 32;
#if QJ
  if (blockIdx.y > 0) {
    // rows j0 + jj (jj < R) of M^T's columns, R consecutive lanes per d (coalesced); the warps' PR
    // parts of d summed through shared memory
    constexpr int R = 4 * KSQ;                  // the sketch rows of one lane column
    constexpr int PR0 = NT / R;                   // parts of d: a power of two, so that they divide D
    constexpr int PR = PR0 >= 16 ? 16 : PR0 >= 8 ? 8 : PR0 >= 4 ? 4 : PR0 >= 2 ? 2 : 1;
    constexpr int DR = D / PR;
    __shared__ __align__(16) float qr[8 * D];
    __shared__ float part[PR * 8 * R];
    __shared__ float sq[8 * R];
    const int c = blockIdx.y - 1, j0 = c * R;
    for (int i = tid; i < G * D; i += NT) qr[i] = ldq(q, (long long)bh * G * D + i);
    __syncthreads();
    const float* Mh = skm + (long long)(bh % Hkv) * skm_stride + j0;
    for (int i = tid; i < PR * R; i += NT) {
      const int jj = i % R, pr = i / R;
      float mv[DR];
#pragma unroll
      for (int dd = 0; dd < DR; ++dd) mv[dd] = __ldg(Mh + (pr * DR + dd) * D + jj);
      float acc[G];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        acc[g] = 0.f;
#pragma unroll
        for (int dd = 0; dd < DR; ++dd) acc[g] += mv[dd] * qr[g * D + pr * DR + dd];
      }
#pragma unroll
      for (int g = 0; g < G; ++g) part[(pr * 8 + g) * R + jj] = acc[g];
    }
    __syncthreads();
    for (int i = tid; i < G * R; i += NT) {
      float v = 0.f;
#pragma unroll 8
      for (int pr = 0; pr < PR; ++pr) v += part[pr * 8 * R + i];
      sq[i] = v * qjscale;
    }
    __syncthreads();
    for (int i = tid; i < KSQ * 8; i += NT) {  // (k-step s, row r) of lane 4 r + c
      const int s = i >> 3, r = i & 7;
      float x[4] = {0.f, 0.f, 0.f, 0.f};
      if (r < G) {
#pragma unroll
        for (int t = 0; t < 4; ++t) x[t] = sq[r * R + sk_coord(c, s, t) - j0];
      }
      qfrag[((long long)bh * (KS + KSQ) + KS + s) * 32 + 4 * r + c] = make_uint2(pack_h2(x[0], x[1]),
                                                                                  pack_h2(x[2], x[3]));
    }
    return;
  }
#endif
  __shared__ float qb[8 * D];
  rotate_query(q, signs, sign_stride, bh, bh % Hkv, qb, tid);
  for (int i = tid; i < KS * 32; i += NT) {
    const int lane = i & 31;
    qfrag[(long long)bh * (KS + KSQ) * 32 + i] = query_frag(qb, lane >> 2, lane & 3, i >> 5, qscale);
  }
}

extern "C" __global__ void __launch_bounds__(NW * 32, MINB) lut_split(
    const void* __restrict__ q, const float* __restrict__ signs, int sign_stride,
    const unsigned char* __restrict__ tab, const u32* __restrict__ rhotab,
    u64 p0, u64 p1, u64 p2, u64 p3, u64 p4, u64 p5, u64 p6, u64 e0, u64 e1, u64 e2, u64 e3, u64 e4,
    u64 e5, u64 e6,
    const int* __restrict__ lens, int has_lens, int T, int Hkv, int tiles_per_cta, int S,
    float qscale, const uint2* __restrict__ qfrag, float* __restrict__ o_part, float* __restrict__ ml_part,
    int merge_in, int* __restrict__ counters, const void* __restrict__ wk, const void* __restrict__ wv,
    const int* __restrict__ wlens, int has_wlens, int W,
    long long skb, long long skh, long long skt, long long svb, long long svh, long long svt,
    float sm_log2, void* __restrict__ out, float* __restrict__ lse, int write_lse, u32 vmagic) {
  // vmagic = 0x64006400 (fp16 1024, 1024), passed at run time so that it stays in a register:
  // (code & mask) | vmagic is then one LOP3 rather than an AND and an OR with two immediates
  extern __shared__ __align__(128) unsigned char smem[];
#if MERGE_IN
  __shared__ int is_last;
#endif
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tid = threadIdx.x;
  const int r = lane >> 2, c = lane & 3;
  const int s_id = blockIdx.x, bh = blockIdx.y;
  const int b = bh / Hkv, h = bh % Hkv;
  int L = T;
  if (has_lens) { L = lens[b]; L = L < T ? L : T; L = L > 0 ? L : 0; }
  const int lo = s_id * tiles_per_cta * TOK;
  int hi = lo + tiles_per_cta * TOK; hi = hi < L ? hi : L;
  const int ntiles = hi > lo ? (hi - lo + TOK - 1) / TOK : 0;
  const int my_tiles = ntiles > warp ? (ntiles - warp + NW - 1) / NW : 0;
  const long long rowbase = (long long)bh * T + lo;

  // the combine launch (PDL) may start its window part now: it reads only the query and the window,
  // written before this chain of launches began
  pdl_trigger();
  // ---- pipeline start: barriers, the issuer lanes, then the first NSTAGE stages of this warp ---
  const u32 mb0 = sa(smem + MB_OFF) + warp * NSTAGE * 8;
  const u32 st0 = sa(smem + ST_OFF) + warp * NSTAGE * STAGE_BYTES;
  unsigned char* const stp = smem + ST_OFF + warp * NSTAGE * STAGE_BYTES;
  Issuer is;
  u32 mis;  // lane k < NF: the misalignment of field k in every stage of this warp
  {  // fields: 0 norm, 1 key codes, 2 value codes, 3 scales, 4 zeros, (QJ) 5 sign bits, 6 residual norm
    const u32 x = lane == 0 ? XN : lane == 1 ? XU : lane == 2 ? XV : lane == 5 ? XQ : lane == 6 ? XR : XS;
    const u64 p = lane == 0 ? p0 : lane == 1 ? p1 : lane == 2 ? p2 : lane == 3 ? p3 : lane == 4 ? p4 : lane == 5 ? p5 : p6;
    is.end = lane == 0 ? e0 : lane == 1 ? e1 : lane == 2 ? e2 : lane == 3 ? e3 : lane == 4 ? e4 : lane == 5 ? e5 : e6;
    is.off = lane == 0 ? OFF_N : lane == 1 ? OFF_U : lane == 2 ? OFF_V : lane == 3 ? OFF_S : lane == 4 ? OFF_Z
           : lane == 5 ? OFF_Q : OFF_R;
    const u64 st = p + (u64)(rowbase + (long long)warp * TOK) * x;
    mis = (u32)st & 15u;
    is.a = st & ~15ull;
    is.step = (u32)(NW * TOK) * x;
    is.full = (u32)TOK * x + 16u;
  }
  const u32 dN = __shfl_sync(0xffffffffu, mis, 0), dU = __shfl_sync(0xffffffffu, mis, 1);
  const u32 dV = __shfl_sync(0xffffffffu, mis, 2), dS = __shfl_sync(0xffffffffu, mis, 3);
  const u32 dZ = __shfl_sync(0xffffffffu, mis, 4);
#if QJ
  const u32 dQ = __shfl_sync(0xffffffffu, mis, 5), dR = __shfl_sync(0xffffffffu, mis, 6);
#endif
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < NSTAGE; ++k) mbar_init(mb0 + 8 * k, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
#if QPREP
  // launched after lut_qprep (with the PDL attribute where config pdl): the table copies (constant
  // since the launcher's plan was built) overlap it; the codes and the query fragments are read once
  // it has finished and its writes are visible
  (void)h;  // (the sign row: lut_qprep applied it)
  copy_tables(tab, rhotab, smem, tid);
  pdl_wait();
  for (int k = 0; k < NSTAGE && k < my_tiles; ++k) issue_stage(is, st0 + k * STAGE_BYTES, mb0 + 8 * k, lane);
  u32 qf0[KS], qf1[KS];
  {
    const uint2* qg = qfrag + (long long)bh * (KS + KSQ) * 32 + lane;
#pragma unroll
    for (int s = 0; s < KS; ++s) { const uint2 v = __ldcg(qg + s * 32); qf0[s] = v.x; qf1[s] = v.y; }
  }
#if QJ  // the sketch's fragments, read from shared memory per k-step (no registers left for them)
  {
    const uint2* sg = qfrag + ((long long)bh * (KS + KSQ) + KS) * 32;
    uint2* sk = (uint2*)(smem + SK_OFF);
    for (int i = tid; i < KSQ * 32; i += NW * 32) sk[i] = __ldcg(sg + i);
  }
#endif
  __syncthreads();  // the table copies
#else
  for (int k = 0; k < NSTAGE && k < my_tiles; ++k) issue_stage(is, st0 + k * STAGE_BYTES, mb0 + 8 * k, lane);
  // ---- table copies and the rotated query, while the first stages' copies are in flight ---------
  copy_tables(tab, rhotab, smem, tid);
  float* qb = (float*)(smem + QB_OFF);
  rotate_query(q, signs, sign_stride, bh, h, qb, tid);  // (its barriers also publish the tables)
  u32 qf0[KS], qf1[KS];
#pragma unroll
  for (int s = 0; s < KS; ++s) { const uint2 v = query_frag(qb, r, c, s, qscale); qf0[s] = v.x; qf1[s] = v.y; }
#endif
  // ---- main loop ------------------------------------------------------------------------------
  float acc[NMT][4], accz[4];
#pragma unroll
  for (int m = 0; m < NMT; ++m) { acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.f; }
  accz[0] = accz[1] = accz[2] = accz[3] = 0.f;
  float m0 = -1e30f, m1 = -1e30f, l0 = 0.f, l1 = 0.f;
  const float NINF = __int_as_float(0xff800000);
  const u32 laneoff = (u32)(lane & (C - 1)) * (u32)EB;
#if VB == 4
  const u32 vsel = (r & 1) ? 0x7632u : 0x5410u;
#elif VB == 2
  const u32 vsel = (u32)(r & 3) * 0x0011u + (u32)(4 + (r & 3)) * 0x1100u;
#endif

  for (int it = 0; it < my_tiles; ++it) {
    const int stg = it % NSTAGE;
    mbar_wait(mb0 + 8 * stg, (u32)((it / NSTAGE) & 1));
    const unsigned char* sb = stp + stg * STAGE_BYTES;
    const int tstage = lo + (warp + it * NW) * TOK;                      // the stage's token 0
#pragma unroll 1
    for (int mt = 0; mt < MT; ++mt) {
      const int tb = 16 * mt;
      if (tstage + tb >= hi) break;
      // ---------------- keys: table lookups per group code, straight into the A registers -----
      float sc[4] = {0.f, 0.f, 0.f, 0.f};
#if QJ
      float sj[4] = {0.f, 0.f, 0.f, 0.f};  // <Sq, sign> of the tile (times qjscale)
      {
        u32 Wq[2];  // per token: this thread's run of sign bits, slot pairs 16 bits apart
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const unsigned char* row = sb + OFF_Q + dQ + (tb + r + 8 * hh) * XQ;
#if D == 128
          Wq[hh] = ((const u32*)row)[c];
#else
          Wq[hh] = __byte_perm((u32)((const unsigned short*)row)[c], 0u, 0x4140u);  // bytes (b0, 0, b1, 0)
#endif
        }
        const uint2* skf = (const uint2*)(smem + SK_OFF) + lane;
#pragma unroll
        for (int s = 0; s < KSQ; ++s) {
          const uint2 bq = skf[s * 32];
          mma(sj, qjl_pm1(Wq[0], 15 - s), qjl_pm1(Wq[1], 15 - s), qjl_pm1(Wq[0], 15 - KSQ - s),
              qjl_pm1(Wq[1], 15 - KSQ - s), bq.x, bq.y);
        }
      }
#endif
      {
        u32 U[2][NWO + 1];  // per token: this thread's run of KS codes, aligned to bit 0
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int tt = tb + r + 8 * hh;
#if UALN
          // rows of a multiple of 16 bytes from a 16-byte aligned field (dU = 0) and runs of whole
          // words: the run is read as it lies, in vector loads where it is 8 or 16 bytes
          const u32* uw = (const u32*)(sb + OFF_U + tt * UB) + c * NWO;
#if NWO == 4
          const uint4 v = *(const uint4*)uw;
          U[hh][0] = v.x; U[hh][1] = v.y; U[hh][2] = v.z; U[hh][3] = v.w;
#elif NWO == 2
          const uint2 v = *(const uint2*)uw;
          U[hh][0] = v.x; U[hh][1] = v.y;
#else
#pragma unroll
          for (int k = 0; k < NWO; ++k) U[hh][k] = uw[k];
#endif
#else
          const u32 ub = (dU + (u32)tt * UB) * 8u + (u32)(c * KS * CW);
          const u32* uw = (const u32*)(sb + OFF_U) + (ub >> 5);
          u32 w[NWO + 1];
#pragma unroll
          for (int k = 0; k <= NWO; ++k) w[k] = uw[k];
#pragma unroll
          for (int k = 0; k < NWO; ++k) U[hh][k] = __funnelshift_r(w[k], w[k + 1], ub & 31);
#endif
          U[hh][NWO] = 0u;
        }
#pragma unroll
        for (int s = 0; s < KS; ++s) {
          u32 a[2][2];
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            // the code is the table index: its byte offset (entry * entry bytes * C) and the
            // lane's copy (NLK = 1: 8-byte entries, one load gives both A registers of the token;
            // the alternative, two tables of 4-byte entries loaded straight into the fragment's
            // registers, saved the register moves but was 0-8 % slower on the H100 for OCTOPUS:
            // docs/decode_lut.md. NLK = 2: the group is two independent halves, one 4-byte load each)
            u32 ex, ey;
#if NLK == 1
            const u32 e_off = run_bits(U[hh], CW * s, IB, TSH, laneoff);
            const uint2 e = *(const uint2*)(smem + e_off);
            ex = e.x; ey = e.y;
#if SB
            const u32 r_off = run_bits(U[hh], CW * s + IB, SB, 7, (u32)lane << 2);  // (rc * 32 + lane) * 4
            const u32 rho = *(const u32*)(smem + RHO_OFF + r_off);
            ex = hmul2(ex, rho); ey = hmul2(ey, rho);
#endif
#else
            ex = *(const u32*)(smem + run_bits(U[hh], CW * s, IB, TSH, laneoff));
            ey = *(const u32*)(smem + run_bits(U[hh], CW * s + IB, IB, TSH, laneoff));
#endif
            a[hh][0] = ex; a[hh][1] = ey;
          }
          mma(sc, a[0][0], a[1][0], a[0][1], a[1][1], qf0[s], qf1[s]);
        }
      }
      // ---------------- scores -> probabilities (log2 domain) -----------------------------------
      const float* nr = (const float*)(sb + OFF_N + dN);
      const int tA = tstage + tb + r, tB = tA + 8;
#if QJ
      const unsigned short* rr = (const unsigned short*)(sb + OFF_R + dR);
      const float rA = h2f(rr[tb + r]), rB = h2f(rr[tb + r + 8]);
      float s0 = tA < hi ? sc[0] * nr[tb + r] + sj[0] * rA : NINF;
      float s1 = tA < hi ? sc[1] * nr[tb + r] + sj[1] * rA : NINF;
      float s2 = tB < hi ? sc[2] * nr[tb + r + 8] + sj[2] * rB : NINF;
      float s3 = tB < hi ? sc[3] * nr[tb + r + 8] + sj[3] * rB : NINF;
#else
      float s0 = tA < hi ? sc[0] * nr[tb + r] : NINF;
      float s1 = tA < hi ? sc[1] * nr[tb + r] : NINF;
      float s2 = tB < hi ? sc[2] * nr[tb + r + 8] : NINF;
      float s3 = tB < hi ? sc[3] * nr[tb + r + 8] : NINF;
#endif
      float mx0 = fmaxf(s0, s2), mx1 = fmaxf(s1, s3);
#pragma unroll
      for (int k = 4; k < 32; k <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, k));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, k));
      }
      if (__any_sync(0xffffffffu, (mx0 > m0) | (mx1 > m1))) {
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        const float al0 = ex2(m0 - n0), al1 = ex2(m1 - n1);
        m0 = n0; m1 = n1; l0 *= al0; l1 *= al1;
#pragma unroll
        for (int m = 0; m < NMT; ++m) { acc[m][0] *= al0; acc[m][1] *= al1; acc[m][2] *= al0; acc[m][3] *= al1; }
        accz[0] *= al0; accz[1] *= al1; accz[2] *= al0; accz[3] *= al1;
      }
      const float p0 = ex2(s0 - m0), p1 = ex2(s1 - m1), p2 = ex2(s2 - m0), p3 = ex2(s3 - m1);
      l0 += p0 + p2; l1 += p1 + p3;
      const u32 pb0 = trans8(pack_h2(p0, p1));  // P^T rows: tokens 2c, 2c+1 of head r
      const u32 pb1 = trans8(pack_h2(p2, p3));  // tokens 2c+8, 2c+9
      // ---------------- values: codes as exact fp16, scales folded into P, zeros by one product --
      {
        const int t0 = tb + 2 * c;  // tokens t0, t0+1, t0+8, t0+9 of the stage
        const unsigned char* vrow = sb + OFF_V + dV;
        const u32* s_a = (const u32*)(sb + OFF_S + dS + (t0) * XS);
        const u32* s_b = (const u32*)(sb + OFF_S + dS + (t0 + 1) * XS);
        const u32* s_c = (const u32*)(sb + OFF_S + dS + (t0 + 8) * XS);
        const u32* s_d = (const u32*)(sb + OFF_S + dS + (t0 + 9) * XS);
        // the last (partial) tile: scales and zeros of tokens past the end are garbage (possibly
        // NaN) and must not meet p = 0; they are zeroed in the stage (the copy is complete)
        if (tstage + tb + 16 > hi) {
          if (lane < 16 && tstage + tb + lane >= hi) {
            u32* sz = (u32*)(sb + OFF_S + dS + (tb + lane) * XS);
            u32* zz = (u32*)(sb + OFF_Z + dZ + (tb + lane) * XS);
#pragma unroll
            for (int k = 0; k < XS / 4; ++k) { sz[k] = 0u; zz[k] = 0u; }
          }
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // before any later bulk copy here
          __syncwarp();
        }
        {  // zero points: rows r < NGRP of Z^T are groups
          u32 za = 0, zb = 0;
          if (r < NGRP) {
            const u32 zsel = (r & 1) ? 0x7632u : 0x5410u;
            const u32* zr = (const u32*)(sb + OFF_Z + dZ);
            za = __byte_perm(zr[(t0) * (XS / 4) + (r >> 1)], zr[(t0 + 1) * (XS / 4) + (r >> 1)], zsel);
            zb = __byte_perm(zr[(t0 + 8) * (XS / 4) + (r >> 1)], zr[(t0 + 9) * (XS / 4) + (r >> 1)], zsel);
          }
          mma(accz, za, 0u, zb, 0u, pb0, pb1);
        }
        const u32 hscale = (u32)(15 + VB) << 10;  // fp16 2^VB in the low half
        const u32 h2v = hscale | (hscale << 16);
#pragma unroll
        for (int gi = 0; gi < NGRP; ++gi) {
          const u32 ssel = (gi & 1) ? 0x7632u : 0x5410u;
          const u32 sab = __byte_perm(s_a[gi >> 1], s_b[gi >> 1], ssel);
          const u32 scd = __byte_perm(s_c[gi >> 1], s_d[gi >> 1], ssel);
          const u32 b1_0 = hmul2(pb0, sab), b1_1 = hmul2(pb1, scd);  // par 1: p * s
          const u32 b0_0 = hmul2(b1_0, h2v), b0_1 = hmul2(b1_1, h2v);  // par 0: p * s * 2^VB
          u32 xa, xb;
#if VB == 3
          {
            const int bit = 96 * gi + 12 * r;
            const int wi = bit >> 5, sh = bit & 31;
            const u32* ra = (const u32*)(vrow + (t0) * XV) + wi;
            const u32* rb = (const u32*)(vrow + (t0 + 1) * XV) + wi;
            const u32* rc2 = (const u32*)(vrow + (t0 + 8) * XV) + wi;
            const u32* rd = (const u32*)(vrow + (t0 + 9) * XV) + wi;
            xa = __byte_perm(__funnelshift_r(ra[0], ra[1], sh), __funnelshift_r(rb[0], rb[1], sh), 0x5410u);
            xb = __byte_perm(__funnelshift_r(rc2[0], rc2[1], sh), __funnelshift_r(rd[0], rd[1], sh), 0x5410u);
          }
#else
          {
            const int wi = (VB == 4) ? (4 * gi + (r >> 1)) : (2 * gi + (r >> 2));
            xa = __byte_perm(((const u32*)(vrow + (t0) * XV))[wi], ((const u32*)(vrow + (t0 + 1) * XV))[wi], vsel);
            xb = __byte_perm(((const u32*)(vrow + (t0 + 8) * XV))[wi], ((const u32*)(vrow + (t0 + 9) * XV))[wi], vsel);
          }
#endif
          const u32 xa2 = xa >> (2 * VB), xb2 = xb >> (2 * VB);
          const u32 M0 = VM | (VM << 16), M1 = M0 << VB;
          float* c0 = acc[2 * gi];
          mma(c0, (xa & M0) | vmagic, (xa2 & M0) | vmagic, (xb & M0) | vmagic, (xb2 & M0) | vmagic, b0_0, b0_1);
          mma(c0, NEG1024, NEG1024, NEG1024, NEG1024, b0_0, b0_1);
          float* c1 = acc[2 * gi + 1];
          mma(c1, (xa & M1) | vmagic, (xa2 & M1) | vmagic, (xb & M1) | vmagic, (xb2 & M1) | vmagic, b1_0, b1_1);
          mma(c1, NEG1024, NEG1024, NEG1024, NEG1024, b1_0, b1_1);
        }
      }
    }
    __syncwarp();
    if (it + NSTAGE < my_tiles) issue_stage(is, st0 + stg * STAGE_BYTES, mb0 + 8 * stg, lane);
  }

  // ---- epilogue: per warp, then across the CTA --------------------------------------------------
#pragma unroll
  for (int k = 4; k < 32; k <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, k);
    l1 += __shfl_xor_sync(0xffffffffu, l1, k);
  }
  __syncthreads();  // every warp is done with its stages: the stage area becomes the merge buffer
  float* ow = (float*)(smem + ST_OFF);      // [NW][8][D]
  float* mlw = ow + NW * 8 * D;             // [NW][8][2]
  const float inv = 1.0f / (float)(1 << VB);
#pragma unroll
  for (int gi = 0; gi < NGRP; ++gi) {
    const float z0 = __shfl_sync(0xffffffffu, accz[0], gi * 4 + c);
    const float z1 = __shfl_sync(0xffffffffu, accz[1], gi * 4 + c);
#pragma unroll
    for (int par = 0; par < 2; ++par) {
      const float* a = acc[2 * gi + par];
      const int d0 = 32 * gi + 4 * r + par, d1 = d0 + 2;
      float* o0 = ow + (warp * 8 + 2 * c) * D;
      float* o1 = o0 + D;
      o0[d0] = a[0] * inv + z0; o1[d0] = a[1] * inv + z1;
      o0[d1] = a[2] * inv + z0; o1[d1] = a[3] * inv + z1;
    }
  }
  if (r == 0) {
    mlw[(warp * 8 + 2 * c) * 2] = m0; mlw[(warp * 8 + 2 * c) * 2 + 1] = l0;
    mlw[(warp * 8 + 2 * c + 1) * 2] = m1; mlw[(warp * 8 + 2 * c + 1) * 2 + 1] = l1;
  }
  __syncthreads();
  const long long part = (long long)bh * S + s_id;
  for (int i = tid; i < G * D; i += NW * 32) {
    const int g = i / D, d = i % D;
    float M = -1e30f;
#pragma unroll
    for (int w = 0; w < NW; ++w) M = fmaxf(M, mlw[(w * 8 + g) * 2]);
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) o += ow[(w * 8 + g) * D + d] * ex2(mlw[(w * 8 + g) * 2] - M);
    o_part[(part * 8 + g) * D + d] = o;
    if (d == 0) {
      float l = 0.f;
#pragma unroll
      for (int w = 0; w < NW; ++w) l += mlw[(w * 8 + g) * 2 + 1] * ex2(mlw[(w * 8 + g) * 2] - M);
      ml_part[(part * 8 + g) * 2] = M;
      ml_part[(part * 8 + g) * 2 + 1] = l;
    }
  }
#if MERGE_IN
  if (!merge_in) return;
  // ---- in-kernel merge: the last CTA of this (batch, KV head) to finish merges every split --------
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const int prev = atomicAdd(counters + bh, 1);
    is_last = prev == S - 1;
    if (prev == S - 1) counters[bh] = 0;  // reset for the next launch (stream order)
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  merge_splits(q, o_part, ml_part, wk, wv, wlens, has_wlens, W, skb, skh, skt, svb, svh, svt, sm_log2, out, lse,
               write_lse, S, b, h, bh, (float*)(smem + ST_OFF));
#endif
}

// ------------------------------------------------------------------------------------------------
#define WCH (D / 4)
extern "C" __global__ void __launch_bounds__(D) lut_combine(
    const void* __restrict__ q, const void* __restrict__ wk, const void* __restrict__ wv,
    const int* __restrict__ wlens, int has_wlens, int W,
    long long skb, long long skh, long long skt, long long svb, long long svh, long long svt,
    const float* __restrict__ o_part, const float* __restrict__ ml_part, int S, int Hq, int Hkv,
    float sm_log2, void* __restrict__ out, float* __restrict__ lse, int write_lse) {
  // one (batch, query head) per CTA, one output coordinate per thread. Every loop issues its
  // loads together (constant trip counts or unrolled batches): the latency of L2 is paid a few
  // times, not once per split or window token.
  __shared__ float qs[D];
  __shared__ float sw[WCH];
  __shared__ float red[D / 32];
  __shared__ float wsp[D], lsp[D];
  const int pid = blockIdx.x, d = threadIdx.x, lane = d & 31, warp = d >> 5;
  const int b = pid / Hq, hq = pid % Hq, h = hq / G, g = hq % G;
  const long long bh = (long long)b * Hkv + h;
  const float* ml = ml_part + bh * S * 16;
  // The window part reads only the query and the window, written before the launch chain began:
  // with config pdl this kernel may run it while lut_split still runs, and waits (pdl_wait) only
  // before it reads the splits' partials.
  int wl = W;
  if (has_wlens) { wl = wlens[b]; wl = wl < W ? wl : W; }
  if (wl > 0) qs[d] = ldq(q, (long long)pid * D + d);
  __syncthreads();
  float M = -1e30f, Lsum = 0.f, O = 0.f;
  // ---- native window, WCH tokens per pass: 4 lanes per token, D / 4 coordinates each ----------
  for (int c0 = 0; c0 < wl; c0 += WCH) {
    const int n = wl - c0 < WCH ? wl - c0 : WCH;
    const int t = d >> 2, part = d & 3;
    float a = 0.f;
    if (t < n) {
      const long long base = b * skb + h * skh + (long long)(c0 + t) * skt + part * (D / 4);
#pragma unroll
      for (int e = 0; e < D / 4; ++e) a += qs[part * (D / 4) + e] * ldq(wk, base + e);
    }
    a += __shfl_xor_sync(0xffffffffu, a, 1);
    a += __shfl_xor_sync(0xffffffffu, a, 2);
    if (part == 0 && t < WCH) sw[t] = t < n ? a * sm_log2 : -1e30f;
    __syncthreads();
    float cmw = -1e30f;
#pragma unroll
    for (int k = 0; k < WCH; ++k) cmw = fmaxf(cmw, sw[k]);
    const float nm = fmaxf(M, cmw), al = ex2(M - nm);
    O *= al; Lsum *= al; M = nm;
    float vv[WCH];
#pragma unroll
    for (int k = 0; k < WCH; ++k) vv[k] = k < n ? ldq(wv, b * svb + h * svh + (long long)(c0 + k) * svt + d) : 0.f;
#pragma unroll
    for (int k = 0; k < WCH; ++k) {
      const float p = k < n ? ex2(sw[k] - M) : 0.f;
      Lsum += p;
      O += p * vv[k];
    }
    __syncthreads();
  }
  pdl_wait();  // lut_split has finished: its partials are visible (read through L2: __ldcg)
  // ---- the largest split max (splits in parallel), then the window's sums rescaled to it --------
  {
    float cm = -1e30f;
    for (int s = d; s < S; s += D) cm = fmaxf(cm, __ldcg(ml + (s * 8 + g) * 2));
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, k));
    if (lane == 0) red[warp] = cm;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < D / 32; ++k) cm = fmaxf(cm, red[k]);
    const float nm = fmaxf(M, cm), al = ex2(M - nm);
    O *= al; Lsum *= al; M = nm;
  }
  // ---- splits: weights in parallel, then every thread sums its coordinate ----------------------
  const float* op = o_part + bh * S * 8 * D + g * D + d;
  for (int s0 = 0; s0 < S; s0 += D) {
    const int s = s0 + d;
    wsp[d] = s < S ? ex2(__ldcg(ml + (s * 8 + g) * 2) - M) : 0.f;
    lsp[d] = s < S ? __ldcg(ml + (s * 8 + g) * 2 + 1) : 0.f;
    __syncthreads();
    const int n = S - s0 < D ? S - s0 : D;
    int k = 0;
    for (; k + 16 <= n; k += 16) {
      float ov[16];
#pragma unroll
      for (int u = 0; u < 16; ++u) ov[u] = __ldcg(op + (long long)(s0 + k + u) * 8 * D);
#pragma unroll
      for (int u = 0; u < 16; ++u) { O += wsp[k + u] * ov[u]; Lsum += wsp[k + u] * lsp[k + u]; }
    }
    for (; k < n; ++k) { O += wsp[k] * __ldcg(op + (long long)(s0 + k) * 8 * D); Lsum += wsp[k] * lsp[k]; }
    __syncthreads();
  }
  stq(out, (long long)pid * D + d, Lsum > 0.f ? O / Lsum : 0.f);
  if (write_lse && d == 0) lse[pid] = Lsum > 0.f ? (M + lg2(Lsum)) * 0.6931471805599453f : __int_as_float(0xff800000);
}

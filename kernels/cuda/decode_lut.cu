/* Table-lookup decode attention, CUDA C++ source part 5 of 5 (after lut_tile.cuh): kernel 1, lut_split,
and the design of the three kernels. The configuration macros, the derived sizes and the parameter
structs are in lut_common.cuh.

The keys are read as the codec's layout declares them (kernels.fused_layout.CodeGroups): the token's
codes row is CODE_GROUPS group codes of GROUP_CODE_BITS bits, group j coding the GROUP_COORDS = 3 or 4
rotated coordinates GROUP_COORDS j .. GROUP_COORDS j + GROUP_COORDS - 1 (an OCTOPUS triplet, or 4
TurboQuant scalar codes), and a group code becomes the 4 fragment slots (x, y, z, w) by LOOKUPS table
loads (decode_lut.Lookup; lut_common.cuh's table says how).

Kernel 1 lut_split, grid (S, B * Hkv), NUM_WARPS warps. Each warp owns every NUM_WARPS-th stage of
STAGE_TOKENS = 16 * TILES_PER_STAGE tokens of its CTA's chunk and runs its own pipeline: lanes 0-4 (0-6
with HAS_QJL) each copy one of the NUM_FIELDS per-token fields of a stage (enum Field: norm, key codes,
value codes, scales, zeros; with HAS_QJL the sign bits and residual norms; contiguous over tokens) with
cp.async.bulk into shared memory, completing on an mbarrier, NUM_STAGES stages ahead; each lane keeps
its field's source address and advances it by a constant per stage (a stage's bytes are a multiple of
16, so every field's misalignment is fixed per warp).

Per 16-token tile (lane = 4 * r + c), one device function per stage (lut_tile.cuh):
  load_code_runs, score_keys
          S^T[16 tok x 8 heads] = K[16 x 4 KEY_KSTEPS] . Qf^T, mma m16n8k16, KEY_KSTEPS = ceil(CODE_GROUPS / 4)
          k-steps. Thread c supplies the slots (2c, 2c+1, 2c+8, 2c+9) = (x, y, z, w) of group
          j = c * KEY_KSTEPS + s of tokens r and r + 8 (LOOKUPS = 1: ONE 8-byte table load gives both A
          registers of a token; LOOKUPS = 2: two 4-byte loads, one per register).
          The codes of groups c * KEY_KSTEPS .. c * KEY_KSTEPS + KEY_KSTEPS - 1 are one run of
          KEY_KSTEPS * GROUP_CODE_BITS bits of the token's row: a few word loads and funnel shifts align
          it once per token (load_code_runs), then each table offset is one shift and one mask-or (the
          entry size and the lane's copy folded in): the stored code is the table index.
          The query side Qf (rotated by a shared-memory Walsh-Hadamard butterfly, once per CTA or once
          per step by lut_qprep; coordinate GROUP_COORDS j + t in slot t of group j, zero where
          t >= GROUP_COORDS or past HEAD_DIM) stays in 2 * KEY_KSTEPS registers.
  qjl_scores (HAS_QJL = 1; TurboQuant-prod, OCTOPUS-QJL): the score of a token is
          norm * <Qf, K> + rnorm * <Sq, sign>, the second product over the m = HEAD_DIM sketch rows
          as QJL_KSTEPS = HEAD_DIM / 16 more k-steps into a second accumulator: Sign[16 tok x 16] . Sq^T,
          the A operand +-1 in fp16 made from the stored bits by one shift and one LOP3 per register
          (the bit moved to the fp16 sign, OR 1.0; bit 1 means +1), the B operand (the sketch of the
          query, Sq = M q with M the declared sketch matrix, times the estimator's coefficient) made
          once per step by lut_qprep and kept in shared memory (registers are at the cap).
          Thread c owns the sign bits of its run [4 QJL_KSTEPS c, 4 QJL_KSTEPS (c + 1)) of the token's
          row (one word at HEAD_DIM = 128, a half word spread over two at 64): k-step s takes the run's
          bits s, s + 2 QJL_KSTEPS (slots x, y: 16 bits apart in the word, so one shift lands both on
          an fp16 sign) and s + QJL_KSTEPS, s + 3 QJL_KSTEPS (slots z, w); lut_qprep orders Sq the same
          way (sk_coord).
  softmax_tile
          per head in the log2 domain, rescaling the accumulators only when a running max grows;
          P^T goes from the accumulator layout to the B layout of the next product with
          movmatrix.trans (two per tile).
  accumulate_values
          O^T[d x heads] += V^T[16 d x 16 tok] . (P^T * scale). Coordinates are permuted so that
          every m-tile lies in one value group (its scale folds into B) and each thread's A
          registers come from one 4-code chunk per group and token pair: 1024 + code (or
          1024 + 2^VALUE_BITS code) is made exact in fp16 by OR-ing the code into 0x6400 ("magic
          number"), and a second product with A = -1024 removes the offset exactly.
          Zero points: one more product Z^T[group x tok] . P^T per tile.
The CTA merges its warps and writes unnormalised partial outputs and (max, sum) per head
(write_partials).

Kernel 2 lut_combine (lut_merge.cuh), grid (B * Hq), HEAD_DIM threads: attends the native window and
merges the splits in one softmax, writes the output (and the natural log-sum-exp). Launched with
programmatic dependent launch (config pdl): it starts once every CTA of lut_split has started, attends
the window meanwhile, and waits for lut_split's partials only then (griddepcontrol.wait).

Kernel 0 lut_qprep (lut_prep.cuh; config qprep 'launch'), grid (B * Hkv, HAS_QJL ? 5 : 1): the rotated
query's fragments once per step (QUERY_PREP = 1), read by lut_split from global memory instead of
rotating the query in every CTA; lut_split, launched after it with PDL, copies the tables while it
runs. With HAS_QJL it also makes the fragments of the query's sketch (the QJL stage reads nothing else
of the query).

MERGE_IN_KERNEL (config merge 'kernel', opt-in): no second launch; each CTA of lut_split bumps an int32
arrival counter per (batch, KV head) after writing its partials, and the last one (which resets the
counter) runs merge_splits for all HEADS_PER_KV heads. Slower than the combine launch in every row of
the H100 benchmark (docs/decode_lut.md): the merge becomes one CTA's serial tail, and compiling it in
costs the main loop registers (128 against 119).
*/

// ---- the copy pipeline -----------------------------------------------------------------------------
// One lane per field (lanes < NUM_FIELDS): the source address of this warp's next stage (16-byte
// aligned, advanced by NUM_WARPS stages' bytes, a multiple of 16, per issue), the field's end (rounded
// up to 16) and the stage offset. A stage copies STAGE_TOKENS tokens + 16 bytes (the misalignment),
// clamped at the end.
struct Issuer {
  u64 a, end;
  u32 step, full, off;
};

// Entry `lane` of a per-field array of the parameters (lanes past the fields take the last): selects of
// its entries, each a load at a constant offset (taken by value: a reference would take the struct's
// address, see lut_split).
__device__ __forceinline__ u64 lane_field(const u64 v0, const u64 v1, const u64 v2, const u64 v3, const u64 v4,
                                          const u64 v5, const u64 v6, int lane) {
  return lane == 0 ? v0 : lane == 1 ? v1 : lane == 2 ? v2 : lane == 3 ? v3 : lane == 4 ? v4 : lane == 5 ? v5 : v6;
}

// Lane k's issuer of field k (enum Field: its address of token 0 `a` and its end) for this warp's stages
// from prefix row rowbase + warp * STAGE_TOKENS. Returns the field's misalignment, fixed in every stage.
__device__ __forceinline__ u32 start_issuer(Issuer& is, u64 a, u64 end, int lane, long long rowbase, int warp) {
  const u32 x = lane == 0 ? NORM_BYTES : lane == 1 ? KEY_ROW_BYTES : lane == 2 ? VALUE_ROW_BYTES
              : lane == 5 ? SIGN_ROW_BYTES : lane == 6 ? RNORM_BYTES : SCALE_ROW_BYTES;
  is.end = end;
  is.off = lane == 0 ? OFF_NORM : lane == 1 ? OFF_KEYS : lane == 2 ? OFF_VALUES : lane == 3 ? OFF_SCALES
         : lane == 4 ? OFF_ZEROS : lane == 5 ? OFF_SIGNS : OFF_RNORM;
  const u64 st = a + (u64)(rowbase + (long long)warp * STAGE_TOKENS) * x;
  is.a = st & ~15ull;
  is.step = (u32)(NUM_WARPS * STAGE_TOKENS) * x;
  is.full = (u32)STAGE_TOKENS * x + 16u;
  return (u32)st & 15u;
}

__device__ __forceinline__ void issue_stage(Issuer& is, u32 sdst, u32 mbar, int lane) {
  u32 n = 0;
  if (lane < NUM_FIELDS) {
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


// ---- after the main loop -------------------------------------------------------------------------
// The CTA's partial result of split s_id: the warps' outputs and (max, sum) merged through shared
// memory (the stage area) into o_part / ml_part.
__device__ __forceinline__ void write_partials(float* __restrict__ o_part, float* __restrict__ ml_part, int S,
                                               float (&acc)[OUT_MTILES][4], const float (&accz)[4], Softmax st,
                                               unsigned char* smem, int bh, int s_id, int warp, int r, int c,
                                               int tid) {
#pragma unroll
  for (int k = 4; k < 32; k <<= 1) {
    st.l0 += __shfl_xor_sync(0xffffffffu, st.l0, k);
    st.l1 += __shfl_xor_sync(0xffffffffu, st.l1, k);
  }
  __syncthreads();  // every warp is done with its stages: the stage area becomes the merge buffer
  float* ow = (float*)(smem + SMEM_STAGES);     // [NUM_WARPS][8][HEAD_DIM]
  float* mlw = ow + NUM_WARPS * 8 * HEAD_DIM;   // [NUM_WARPS][8][2]
  const float inv = 1.0f / (float)(1 << VALUE_BITS);
#pragma unroll
  for (int gi = 0; gi < VALUE_GROUPS; ++gi) {
    const float z0 = __shfl_sync(0xffffffffu, accz[0], gi * 4 + c);
    const float z1 = __shfl_sync(0xffffffffu, accz[1], gi * 4 + c);
#pragma unroll
    for (int par = 0; par < 2; ++par) {
      const float* a = acc[2 * gi + par];
      const int d0 = 32 * gi + 4 * r + par, d1 = d0 + 2;
      float* o0 = ow + (warp * 8 + 2 * c) * HEAD_DIM;
      float* o1 = o0 + HEAD_DIM;
      o0[d0] = a[0] * inv + z0; o1[d0] = a[1] * inv + z1;
      o0[d1] = a[2] * inv + z0; o1[d1] = a[3] * inv + z1;
    }
  }
  if (r == 0) {
    mlw[(warp * 8 + 2 * c) * 2] = st.m0; mlw[(warp * 8 + 2 * c) * 2 + 1] = st.l0;
    mlw[(warp * 8 + 2 * c + 1) * 2] = st.m1; mlw[(warp * 8 + 2 * c + 1) * 2 + 1] = st.l1;
  }
  __syncthreads();
  const long long part = (long long)bh * S + s_id;
  for (int i = tid; i < HEADS_PER_KV * HEAD_DIM; i += CTA_THREADS) {
    const int g = i / HEAD_DIM, d = i % HEAD_DIM;
    float M = -1e30f;
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) M = fmaxf(M, mlw[(w * 8 + g) * 2]);
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) o += ow[(w * 8 + g) * HEAD_DIM + d] * ex2(mlw[(w * 8 + g) * 2] - M);
    o_part[(part * 8 + g) * HEAD_DIM + d] = o;
    if (d == 0) {
      float l = 0.f;
#pragma unroll
      for (int w = 0; w < NUM_WARPS; ++w) l += mlw[(w * 8 + g) * 2 + 1] * ex2(mlw[(w * 8 + g) * 2] - M);
      ml_part[(part * 8 + g) * 2] = M;
      ml_part[(part * 8 + g) * 2 + 1] = l;
    }
  }
}

// Each field's misalignment in this warp's stages (bytes, < 16; the rows start that far into the
// field's area), shared from the lane that issues it.
struct FieldShift {
  u32 norm, keys, values, scales, zeros, signs, rnorm;
};

// ---- kernel 1 ------------------------------------------------------------------------------------
// The parameter struct is read field by field and its address is never taken (no reference to it is
// passed on): every field is then a parameter-space load, hoisted and kept as a kernel argument is.
extern "C" __global__ void __launch_bounds__(CTA_THREADS, MIN_BLOCKS)
lut_split(const LutSplitParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
#if MERGE_IN_KERNEL
  __shared__ int is_last;
#endif
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tid = threadIdx.x;
  const int r = lane >> 2, c = lane & 3;
  const int s_id = blockIdx.x, bh = blockIdx.y;
  const int b = bh / p.Hkv, h = bh % p.Hkv;
  int L = p.T;
  if (p.has_lengths) { L = __ldg(p.lengths + b); L = L < p.T ? L : p.T; L = L > 0 ? L : 0; }
  const int lo = s_id * p.tiles_per_cta * STAGE_TOKENS;
  int hi = lo + p.tiles_per_cta * STAGE_TOKENS; hi = hi < L ? hi : L;
  const int ntiles = hi > lo ? (hi - lo + STAGE_TOKENS - 1) / STAGE_TOKENS : 0;
  const int my_tiles = ntiles > warp ? (ntiles - warp + NUM_WARPS - 1) / NUM_WARPS : 0;
  const long long rowbase = (long long)bh * p.T + lo;

  // the combine launch (PDL) may start its window part now: it reads only the query and the window,
  // written before this chain of launches began
  pdl_trigger();
  // ---- pipeline start: barriers, the issuer lanes, then the first NUM_STAGES stages of this warp --
  const u32 mb0 = sa(smem + SMEM_BARRIERS) + warp * NUM_STAGES * 8;
  const u32 st0 = sa(smem + SMEM_STAGES) + warp * NUM_STAGES * STAGE_BYTES;
  unsigned char* const stp = smem + SMEM_STAGES + warp * NUM_STAGES * STAGE_BYTES;
  Issuer is;
  const u64 field = lane_field(p.field[0], p.field[1], p.field[2], p.field[3], p.field[4], p.field[5], p.field[6],
                              lane);
  const u64 field_end = lane_field(p.field_end[0], p.field_end[1], p.field_end[2], p.field_end[3], p.field_end[4],
                                  p.field_end[5], p.field_end[6], lane);
  const u32 mis = start_issuer(is, field, field_end, lane, rowbase, warp);  // lane k < NUM_FIELDS: field k's shift
  FieldShift sh;
  sh.norm = __shfl_sync(0xffffffffu, mis, FIELD_NORM);
  sh.keys = __shfl_sync(0xffffffffu, mis, FIELD_KEYS);
  sh.values = __shfl_sync(0xffffffffu, mis, FIELD_VALUES);
  sh.scales = __shfl_sync(0xffffffffu, mis, FIELD_SCALES);
  sh.zeros = __shfl_sync(0xffffffffu, mis, FIELD_ZEROS);
#if HAS_QJL
  sh.signs = __shfl_sync(0xffffffffu, mis, FIELD_SIGNS);
  sh.rnorm = __shfl_sync(0xffffffffu, mis, FIELD_RNORM);
#else
  sh.signs = sh.rnorm = 0u;
#endif
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < NUM_STAGES; ++k) mbar_init(mb0 + 8 * k, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  u32 qf0[KEY_KSTEPS], qf1[KEY_KSTEPS];  // the query's B fragments per k-step
#if QUERY_PREP
  // launched after lut_qprep (with the PDL attribute where config pdl): the table copies (constant
  // since the launcher's plan was built) overlap it; the codes and the query fragments are read once
  // it has finished and its writes are visible
  (void)h;  // (the sign row: lut_qprep applied it)
  copy_tables(p.table, p.rho, smem, tid);
  pdl_wait();
  for (int k = 0; k < NUM_STAGES && k < my_tiles; ++k) issue_stage(is, st0 + k * STAGE_BYTES, mb0 + 8 * k, lane);
  {
    const uint2* qg = p.qfrag + (long long)bh * (KEY_KSTEPS + QJL_KSTEPS) * 32 + lane;
#pragma unroll
    for (int s = 0; s < KEY_KSTEPS; ++s) { const uint2 v = __ldcg(qg + s * 32); qf0[s] = v.x; qf1[s] = v.y; }
  }
#if HAS_QJL  // the sketch's fragments, read from shared memory per k-step (no registers left for them)
  {
    const uint2* sg = p.qfrag + ((long long)bh * (KEY_KSTEPS + QJL_KSTEPS) + KEY_KSTEPS) * 32;
    uint2* sk = (uint2*)(smem + SMEM_SKETCH);
    for (int i = tid; i < QJL_KSTEPS * 32; i += CTA_THREADS) sk[i] = __ldcg(sg + i);
  }
#endif
  __syncthreads();  // the table copies
#else
  for (int k = 0; k < NUM_STAGES && k < my_tiles; ++k) issue_stage(is, st0 + k * STAGE_BYTES, mb0 + 8 * k, lane);
  // ---- table copies and the rotated query, while the first stages' copies are in flight ---------
  copy_tables(p.table, p.rho, smem, tid);
  float* qb = (float*)(smem + SMEM_QUERY);
  rotate_query(p.q, p.signs, p.sign_stride, bh, h, qb, tid);  // (its barriers also publish the tables)
#pragma unroll
  for (int s = 0; s < KEY_KSTEPS; ++s) {
    const uint2 v = query_frag(qb, r, c, s, p.qscale);
    qf0[s] = v.x; qf1[s] = v.y;
  }
#endif
  // ---- main loop ------------------------------------------------------------------------------
  float acc[OUT_MTILES][4], accz[4];
#pragma unroll
  for (int m = 0; m < OUT_MTILES; ++m) { acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.f; }
  accz[0] = accz[1] = accz[2] = accz[3] = 0.f;
  Softmax st = {-1e30f, -1e30f, 0.f, 0.f};
  const u32 laneoff = (u32)(lane & (TABLE_COPIES - 1)) * (u32)ENTRY_BYTES;  // the lane's table copy
  const u32 vsel = value_select(r);

  for (int it = 0; it < my_tiles; ++it) {
    const int stg = it % NUM_STAGES;
    mbar_wait(mb0 + 8 * stg, (u32)((it / NUM_STAGES) & 1));
    const unsigned char* sb = stp + stg * STAGE_BYTES;
    const int tstage = lo + (warp + it * NUM_WARPS) * STAGE_TOKENS;  // the stage's token 0
#pragma unroll 1
    for (int mt = 0; mt < TILES_PER_STAGE; ++mt) {
      const int tb = 16 * mt;
      if (tstage + tb >= hi) break;
      float sc[4] = {0.f, 0.f, 0.f, 0.f};
      float sj[4] = {0.f, 0.f, 0.f, 0.f};  // <Sq, sign> of the tile (times qjl_scale), HAS_QJL
#if HAS_QJL
      qjl_scores(sj, sb + OFF_SIGNS + sh.signs, tb, r, c, lane, smem);
#endif
      {
        u32 U[2][RUN_WORDS + 1];  // per token: this thread's run of KEY_KSTEPS codes, aligned to bit 0
        load_code_runs(U, sb + OFF_KEYS, sh.keys, tb, r, c);
        score_keys(sc, U, smem, laneoff, lane, qf0, qf1);
      }
      const uint2 pb = softmax_tile(st, acc, accz, sc, sj, (const float*)(sb + OFF_NORM + sh.norm),
                                    (const unsigned short*)(sb + OFF_RNORM + sh.rnorm), tb, r, tstage + tb + r, hi);
      accumulate_values(acc, accz, sb + OFF_VALUES + sh.values, sb + OFF_SCALES + sh.scales, sb + OFF_ZEROS + sh.zeros,
                        tb, tstage, hi, lane, r, c, pb, vsel, p.vmagic);
    }
    __syncwarp();
    if (it + NUM_STAGES < my_tiles) issue_stage(is, st0 + stg * STAGE_BYTES, mb0 + 8 * stg, lane);
  }

  // ---- epilogue: per warp, then across the CTA --------------------------------------------------
  write_partials(p.o_part, p.ml_part, p.S, acc, accz, st, smem, bh, s_id, warp, r, c, tid);
#if MERGE_IN_KERNEL
  if (!p.merge_in) return;
  // ---- in-kernel merge: the last CTA of this (batch, KV head) to finish merges every split --------
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const int prev = atomicAdd(p.counters + bh, 1);
    is_last = prev == p.S - 1;
    if (prev == p.S - 1) p.counters[bh] = 0;  // reset for the next launch (stream order)
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  merge_splits(p.q, p.o_part, p.ml_part, p.window, p.output, p.S, b, h, bh, (float*)(smem + SMEM_STAGES));
#endif
}

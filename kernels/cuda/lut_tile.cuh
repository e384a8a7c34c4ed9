/* Table-lookup decode attention, CUDA C++ source part 4 of 5 (after lut_merge.cuh): the stages of
lut_split's main loop on one 16-token tile of a stage, one device function each (decode_lut.cu's
header describes what each computes). */

// ---- the stages of one 16-token tile ------------------------------------------------------------
// The tile is rows tb .. tb + 15 of the stage; thread (r, c) works on tokens tb + r and tb + r + 8. Each
// function takes the stage's rows of the fields it reads (the kernel adds the field's offset in the stage
// and its misalignment: done here, that pointer arithmetic cost the main loop 9 registers and ~3 % at
// 32k tokens on the H200, the callee being simplified before it is inlined).

// HAS_QJL: sj += <Sq, sign> of the tile's tokens (times the estimator's coefficient), Sq's fragments
// from shared memory (lut_qprep's).
__device__ __forceinline__ void qjl_scores(float (&sj)[4], const unsigned char* signs, int tb, int r, int c, int lane,
                                           const unsigned char* smem) {
  u32 Wq[2];  // per token: this thread's run of sign bits, slot pairs 16 bits apart
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const unsigned char* row = signs + (tb + r + 8 * hh) * SIGN_ROW_BYTES;
#if HEAD_DIM == 128
    Wq[hh] = ((const u32*)row)[c];
#else
    Wq[hh] = __byte_perm((u32)((const unsigned short*)row)[c], 0u, 0x4140u);  // bytes (b0, 0, b1, 0)
#endif
  }
  const uint2* skf = (const uint2*)(smem + SMEM_SKETCH) + lane;
#pragma unroll
  for (int s = 0; s < QJL_KSTEPS; ++s) {
    const uint2 bq = skf[s * 32];
    mma(sj, qjl_pm1(Wq[0], 15 - s), qjl_pm1(Wq[1], 15 - s), qjl_pm1(Wq[0], 15 - QJL_KSTEPS - s),
        qjl_pm1(Wq[1], 15 - QJL_KSTEPS - s), bq.x, bq.y);
  }
}

// U[hh] = this thread's run of KEY_KSTEPS group codes of token tb + r + 8 hh, aligned to bit 0 (keys: the
// stage's key codes area, the rows `shift` bytes into it).
__device__ __forceinline__ void load_code_runs(u32 (&U)[2][RUN_WORDS + 1], const unsigned char* keys, u32 shift,
                                               int tb, int r, int c) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int tt = tb + r + 8 * hh;
#if KEY_ROWS_ALIGNED
    // rows of a multiple of 16 bytes from a 16-byte aligned field (shift = 0) and runs of whole
    // words: the run is read as it lies, in vector loads where it is 8 or 16 bytes
    const u32* uw = (const u32*)(keys + tt * KEY_ROW_BYTES) + c * RUN_WORDS;
#if RUN_WORDS == 4
    const uint4 v = *(const uint4*)uw;
    U[hh][0] = v.x; U[hh][1] = v.y; U[hh][2] = v.z; U[hh][3] = v.w;
#elif RUN_WORDS == 2
    const uint2 v = *(const uint2*)uw;
    U[hh][0] = v.x; U[hh][1] = v.y;
#else
#pragma unroll
    for (int k = 0; k < RUN_WORDS; ++k) U[hh][k] = uw[k];
#endif
#else
    const u32 ub = (shift + (u32)tt * KEY_ROW_BYTES) * 8u + (u32)(c * KEY_KSTEPS * GROUP_CODE_BITS);
    const u32* uw = (const u32*)keys + (ub >> 5);
    u32 w[RUN_WORDS + 1];
#pragma unroll
    for (int k = 0; k <= RUN_WORDS; ++k) w[k] = uw[k];
#pragma unroll
    for (int k = 0; k < RUN_WORDS; ++k) U[hh][k] = __funnelshift_r(w[k], w[k + 1], ub & 31);
#endif
    U[hh][RUN_WORDS] = 0u;
  }
}

// sc += the tile's key scores S^T (before the norms): per k-step, each token's group code looked up in
// the table straight into the A registers, one mma with the query's fragments (qf0, qf1).
__device__ __forceinline__ void score_keys(float (&sc)[4], const u32 (&U)[2][RUN_WORDS + 1], const unsigned char* smem,
                                           u32 laneoff, int lane, const u32 (&qf0)[KEY_KSTEPS],
                                           const u32 (&qf1)[KEY_KSTEPS]) {
#pragma unroll
  for (int s = 0; s < KEY_KSTEPS; ++s) {
    u32 a[2][2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      // the code is the table index: its byte offset (entry * entry bytes * copies) and the
      // lane's copy (LOOKUPS = 1: 8-byte entries, one load gives both A registers of the token;
      // the alternative, two tables of 4-byte entries loaded straight into the fragment's
      // registers, saved the register moves but was 0-8 % slower on the H100 for OCTOPUS:
      // docs/decode_lut.md. LOOKUPS = 2: the group is two independent halves, one 4-byte load each)
      u32 ex, ey;
#if LOOKUPS == 1
      const u32 e_off = run_bits(U[hh], GROUP_CODE_BITS * s, INDEX_BITS, ENTRY_SHIFT, laneoff);
      const uint2 e = *(const uint2*)(smem + e_off);
      ex = e.x; ey = e.y;
#if SCALE_BITS
      // (rc * 32 + lane) * 4: the lane's copy of rho entry rc
      const u32 r_off = run_bits(U[hh], GROUP_CODE_BITS * s + INDEX_BITS, SCALE_BITS, 7, (u32)lane << 2);
      const u32 rho = *(const u32*)(smem + SMEM_RHO + r_off);
      ex = hmul2(ex, rho); ey = hmul2(ey, rho);
#endif
#else
      ex = *(const u32*)(smem + run_bits(U[hh], GROUP_CODE_BITS * s, INDEX_BITS, ENTRY_SHIFT, laneoff));
      ey = *(const u32*)(smem + run_bits(U[hh], GROUP_CODE_BITS * s + INDEX_BITS, INDEX_BITS, ENTRY_SHIFT, laneoff));
#endif
      a[hh][0] = ex; a[hh][1] = ey;
    }
    mma(sc, a[0][0], a[1][0], a[0][1], a[1][1], qf0[s], qf1[s]);
  }
}

// The running softmax state of a thread's two heads (2c, 2c + 1) and its accumulators.
struct Softmax {
  float m0, m1, l0, l1;
};

// Scores -> probabilities (log2 domain): the norms (and the QJL term) applied, tokens at or past hi
// masked, the running maxima raised and the accumulators rescaled where they grow. Returns P^T's two
// B registers (tokens 2c, 2c+1 and 2c+8, 2c+9 of head r), fp16.
__device__ __forceinline__ uint2 softmax_tile(Softmax& st, float (&acc)[OUT_MTILES][4], float (&accz)[4],
                                              const float (&sc)[4], const float (&sj)[4], const float* nr,
                                              const unsigned short* rr, int tb, int r, int tA, int hi) {
  const float NINF = __int_as_float(0xff800000);
  const int tB = tA + 8;
#if HAS_QJL
  const float rA = h2f(rr[tb + r]), rB = h2f(rr[tb + r + 8]);
  float s0 = tA < hi ? sc[0] * nr[tb + r] + sj[0] * rA : NINF;
  float s1 = tA < hi ? sc[1] * nr[tb + r] + sj[1] * rA : NINF;
  float s2 = tB < hi ? sc[2] * nr[tb + r + 8] + sj[2] * rB : NINF;
  float s3 = tB < hi ? sc[3] * nr[tb + r + 8] + sj[3] * rB : NINF;
#else
  (void)sj; (void)rr;
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
  if (__any_sync(0xffffffffu, (mx0 > st.m0) | (mx1 > st.m1))) {
    const float n0 = fmaxf(st.m0, mx0), n1 = fmaxf(st.m1, mx1);
    const float al0 = ex2(st.m0 - n0), al1 = ex2(st.m1 - n1);
    st.m0 = n0; st.m1 = n1; st.l0 *= al0; st.l1 *= al1;
#pragma unroll
    for (int m = 0; m < OUT_MTILES; ++m) { acc[m][0] *= al0; acc[m][1] *= al1; acc[m][2] *= al0; acc[m][3] *= al1; }
    accz[0] *= al0; accz[1] *= al1; accz[2] *= al0; accz[3] *= al1;
  }
  const float p0 = ex2(s0 - st.m0), p1 = ex2(s1 - st.m1), p2 = ex2(s2 - st.m0), p3 = ex2(s3 - st.m1);
  st.l0 += p0 + p2; st.l1 += p1 + p3;
  const u32 pb0 = trans8(pack_h2(p0, p1));  // P^T rows: tokens 2c, 2c+1 of head r
  const u32 pb1 = trans8(pack_h2(p2, p3));  // tokens 2c+8, 2c+9
  return make_uint2(pb0, pb1);
}

// The __byte_perm selector that puts thread row r's value codes of two tokens in one register
// (VALUE_BITS 4 and 2; 3 bits funnel-shift instead).
__device__ __forceinline__ u32 value_select(int r) {
#if VALUE_BITS == 4
  return (r & 1) ? 0x7632u : 0x5410u;
#elif VALUE_BITS == 2
  return (u32)(r & 3) * 0x0011u + (u32)(4 + (r & 3)) * 0x1100u;
#else
  (void)r;
  return 0u;
#endif
}

// acc += V^T . (P^T * scale), accz += Z^T . P^T: values as exact fp16 codes, scales folded into P,
// zeros by one product (the tile's tokens tstage + tb .., prefix end hi).
__device__ __forceinline__ void accumulate_values(float (&acc)[OUT_MTILES][4], float (&accz)[4],
                                                  const unsigned char* vrow, const unsigned char* scales,
                                                  const unsigned char* zeros, int tb, int tstage, int hi, int lane,
                                                  int r, int c, uint2 pb, u32 vsel, u32 vmagic) {
  const u32 pb0 = pb.x, pb1 = pb.y;
  const int t0 = tb + 2 * c;  // tokens t0, t0+1, t0+8, t0+9 of the stage
  const u32* s_a = (const u32*)(scales + (t0) * SCALE_ROW_BYTES);
  const u32* s_b = (const u32*)(scales + (t0 + 1) * SCALE_ROW_BYTES);
  const u32* s_c = (const u32*)(scales + (t0 + 8) * SCALE_ROW_BYTES);
  const u32* s_d = (const u32*)(scales + (t0 + 9) * SCALE_ROW_BYTES);
  // the last (partial) tile: scales and zeros of tokens past the end are garbage (possibly
  // NaN) and must not meet p = 0; they are zeroed in the stage (the copy is complete)
  if (tstage + tb + 16 > hi) {
    if (lane < 16 && tstage + tb + lane >= hi) {
      u32* sz = (u32*)(scales + (tb + lane) * SCALE_ROW_BYTES);
      u32* zz = (u32*)(zeros + (tb + lane) * SCALE_ROW_BYTES);
#pragma unroll
      for (int k = 0; k < SCALE_ROW_BYTES / 4; ++k) { sz[k] = 0u; zz[k] = 0u; }
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // before any later bulk copy here
    __syncwarp();
  }
  {  // zero points: rows r < VALUE_GROUPS of Z^T are groups
    u32 za = 0, zb = 0;
    if (r < VALUE_GROUPS) {
      const u32 zsel = (r & 1) ? 0x7632u : 0x5410u;
      const u32* zr = (const u32*)zeros;
      constexpr int ZW = SCALE_ROW_BYTES / 4;  // words per token
      za = __byte_perm(zr[(t0) * ZW + (r >> 1)], zr[(t0 + 1) * ZW + (r >> 1)], zsel);
      zb = __byte_perm(zr[(t0 + 8) * ZW + (r >> 1)], zr[(t0 + 9) * ZW + (r >> 1)], zsel);
    }
    mma(accz, za, 0u, zb, 0u, pb0, pb1);
  }
  const u32 hscale = (u32)(15 + VALUE_BITS) << 10;  // fp16 2^VALUE_BITS in the low half
  const u32 h2v = hscale | (hscale << 16);
#pragma unroll
  for (int gi = 0; gi < VALUE_GROUPS; ++gi) {
    const u32 ssel = (gi & 1) ? 0x7632u : 0x5410u;
    const u32 sab = __byte_perm(s_a[gi >> 1], s_b[gi >> 1], ssel);
    const u32 scd = __byte_perm(s_c[gi >> 1], s_d[gi >> 1], ssel);
    const u32 b1_0 = hmul2(pb0, sab), b1_1 = hmul2(pb1, scd);  // par 1: p * s
    const u32 b0_0 = hmul2(b1_0, h2v), b0_1 = hmul2(b1_1, h2v);  // par 0: p * s * 2^VALUE_BITS
    u32 xa, xb;
#if VALUE_BITS == 3
    {
      const int bit = 96 * gi + 12 * r;
      const int wi = bit >> 5, shf = bit & 31;
      const u32* ra = (const u32*)(vrow + (t0) * VALUE_ROW_BYTES) + wi;
      const u32* rb = (const u32*)(vrow + (t0 + 1) * VALUE_ROW_BYTES) + wi;
      const u32* rc2 = (const u32*)(vrow + (t0 + 8) * VALUE_ROW_BYTES) + wi;
      const u32* rd = (const u32*)(vrow + (t0 + 9) * VALUE_ROW_BYTES) + wi;
      xa = __byte_perm(__funnelshift_r(ra[0], ra[1], shf), __funnelshift_r(rb[0], rb[1], shf), 0x5410u);
      xb = __byte_perm(__funnelshift_r(rc2[0], rc2[1], shf), __funnelshift_r(rd[0], rd[1], shf), 0x5410u);
    }
    (void)vsel;
#else
    {
      const int wi = (VALUE_BITS == 4) ? (4 * gi + (r >> 1)) : (2 * gi + (r >> 2));
      xa = __byte_perm(((const u32*)(vrow + (t0) * VALUE_ROW_BYTES))[wi],
                       ((const u32*)(vrow + (t0 + 1) * VALUE_ROW_BYTES))[wi], vsel);
      xb = __byte_perm(((const u32*)(vrow + (t0 + 8) * VALUE_ROW_BYTES))[wi],
                       ((const u32*)(vrow + (t0 + 9) * VALUE_ROW_BYTES))[wi], vsel);
    }
#endif
    const u32 xa2 = xa >> (2 * VALUE_BITS), xb2 = xb >> (2 * VALUE_BITS);
    const u32 M0 = VALUE_MASK | (VALUE_MASK << 16), M1 = M0 << VALUE_BITS;
    float* c0 = acc[2 * gi];
    mma(c0, (xa & M0) | vmagic, (xa2 & M0) | vmagic, (xb & M0) | vmagic, (xb2 & M0) | vmagic, b0_0, b0_1);
    mma(c0, FP16X2_MINUS_1024, FP16X2_MINUS_1024, FP16X2_MINUS_1024, FP16X2_MINUS_1024, b0_0, b0_1);
    float* c1 = acc[2 * gi + 1];
    mma(c1, (xa & M1) | vmagic, (xa2 & M1) | vmagic, (xb & M1) | vmagic, (xb2 & M1) | vmagic, b1_0, b1_1);
    mma(c1, FP16X2_MINUS_1024, FP16X2_MINUS_1024, FP16X2_MINUS_1024, FP16X2_MINUS_1024, b1_0, b1_1);
  }
}

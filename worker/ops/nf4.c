/* nf4 — see nf4.h. */
#include "nf4.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

/* NF4: the 16 quantiles of QLoRA's NormalFloat4 (Dettmers et al. 2023, appendix E), in fp32. */
const float nf4_code[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
    0.7229568362236023f, 1.0f};

/* The 8-bit dynamic map (Dettmers 2015, "8-bit approximations for parallelism"): a sign, a run of
 * zero bits giving the decimal exponent, and a linear fraction; sorted ascending. Its fp32 bits,
 * as the format fixes them (tests/integration/nf4_bnb.sh compares them with bitsandbytes'). */
static const uint32_t dynamic_bits[256] = {
  0xbf7e3333, 0xbf7a999a, 0xbf770000, 0xbf736666, 0xbf6fcccd, 0xbf6c3333, 0xbf68999a, 0xbf650000,
  0xbf616666, 0xbf5dcccd, 0xbf5a3333, 0xbf56999a, 0xbf530000, 0xbf4f6666, 0xbf4bcccd, 0xbf483333,
  0xbf44999a, 0xbf410000, 0xbf3d6666, 0xbf39cccd, 0xbf363334, 0xbf32999a, 0xbf2f0000, 0xbf2b6666,
  0xbf27cccd, 0xbf243334, 0xbf20999a, 0xbf1d0000, 0xbf196666, 0xbf15cccd, 0xbf123334, 0xbf0e999a,
  0xbf0b0000, 0xbf076666, 0xbf03cccc, 0xbf003333, 0xbef93332, 0xbef20000, 0xbeeacccc, 0xbee3999a,
  0xbedc6666, 0xbed53333, 0xbece0000, 0xbec6cccc, 0xbebf999a, 0xbeb86666, 0xbeb13333, 0xbeaa0000,
  0xbea2cccc, 0xbe9b999a, 0xbe946666, 0xbe8d3334, 0xbe860000, 0xbe7d9999, 0xbe6f3333, 0xbe60cccd,
  0xbe526666, 0xbe440000, 0xbe35999a, 0xbe273333, 0xbe18cccd, 0xbe0a6666, 0xbdf80000, 0xbddb3334,
  0xbdc9eb85, 0xbdc428f7, 0xbdbe6667, 0xbdb8a3d7, 0xbdb2e148, 0xbdad1eb8, 0xbda75c2a, 0xbda1999a,
  0xbd9bd70a, 0xbd96147b, 0xbd9051eb, 0xbd8a8f5d, 0xbd84cccd, 0xbd7e147b, 0xbd728f5d, 0xbd670a3d,
  0xbd5b851f, 0xbd500000, 0xbd447ae1, 0xbd38f5c3, 0xbd2d70a3, 0xbd21eb85, 0xbd166667, 0xbd0ae148,
  0xbcfeb852, 0xbce7ae15, 0xbcd0a3d7, 0xbcb9999a, 0xbca28f5d, 0xbc8b851f, 0xbc68f5c3, 0xbc3ae148,
  0xbc1f3b64, 0xbc160418, 0xbc0ccccd, 0xbc039581, 0xbbf4bc6a, 0xbbe24dd3, 0xbbcfdf3b, 0xbbbd70a4,
  0xbbab020d, 0xbb989374, 0xbb8624dd, 0xbb676c8a, 0xbb428f5c, 0xbb1db22d, 0xbaf1a9fc, 0xbaa7ef9d,
  0xba7765ff, 0xba59e83e, 0xba3c6a80, 0xba1eecc1, 0xba016f01, 0xb9c7e283, 0xb98ce705, 0xb923d70b,
  0xb8ba1f4b, 0xb88aefb3, 0xb8378034, 0xb7b24206, 0xb70205ff, 0xb65a1a94, 0xb513a3b7, 0x00000000,
  0x3513a3b7, 0x365a1a94, 0x370205ff, 0x37b24206, 0x38378034, 0x388aefb3, 0x38ba1f4b, 0x3923d70b,
  0x398ce705, 0x39c7e283, 0x3a016f01, 0x3a1eecc1, 0x3a3c6a80, 0x3a59e83e, 0x3a7765ff, 0x3aa7ef9d,
  0x3af1a9fc, 0x3b1db22d, 0x3b428f5c, 0x3b676c8a, 0x3b8624dd, 0x3b989374, 0x3bab020d, 0x3bbd70a4,
  0x3bcfdf3b, 0x3be24dd3, 0x3bf4bc6a, 0x3c039581, 0x3c0ccccd, 0x3c160418, 0x3c1f3b64, 0x3c3ae148,
  0x3c68f5c3, 0x3c8b851f, 0x3ca28f5d, 0x3cb9999a, 0x3cd0a3d7, 0x3ce7ae15, 0x3cfeb852, 0x3d0ae148,
  0x3d166667, 0x3d21eb85, 0x3d2d70a3, 0x3d38f5c3, 0x3d447ae1, 0x3d500000, 0x3d5b851f, 0x3d670a3d,
  0x3d728f5d, 0x3d7e147b, 0x3d84cccd, 0x3d8a8f5d, 0x3d9051eb, 0x3d96147b, 0x3d9bd70a, 0x3da1999a,
  0x3da75c2a, 0x3dad1eb8, 0x3db2e148, 0x3db8a3d7, 0x3dbe6667, 0x3dc428f7, 0x3dc9eb85, 0x3ddb3334,
  0x3df80000, 0x3e0a6666, 0x3e18cccd, 0x3e273333, 0x3e35999a, 0x3e440000, 0x3e526666, 0x3e60cccd,
  0x3e6f3333, 0x3e7d9999, 0x3e860000, 0x3e8d3334, 0x3e946666, 0x3e9b999a, 0x3ea2cccc, 0x3eaa0000,
  0x3eb13333, 0x3eb86666, 0x3ebf999a, 0x3ec6cccc, 0x3ece0000, 0x3ed53333, 0x3edc6666, 0x3ee3999a,
  0x3eeacccc, 0x3ef20000, 0x3ef93332, 0x3f003333, 0x3f03cccc, 0x3f076666, 0x3f0b0000, 0x3f0e999a,
  0x3f123334, 0x3f15cccd, 0x3f196666, 0x3f1d0000, 0x3f20999a, 0x3f243334, 0x3f27cccd, 0x3f2b6666,
  0x3f2f0000, 0x3f32999a, 0x3f363334, 0x3f39cccd, 0x3f3d6666, 0x3f410000, 0x3f44999a, 0x3f483333,
  0x3f4bcccd, 0x3f4f6666, 0x3f530000, 0x3f56999a, 0x3f5a3333, 0x3f5dcccd, 0x3f616666, 0x3f650000,
  0x3f68999a, 0x3f6c3333, 0x3f6fcccd, 0x3f736666, 0x3f770000, 0x3f7a999a, 0x3f7e3333, 0x3f800000,
};

float nf4_dynamic(int i) {
  float f;
  memcpy(&f, &dynamic_bits[i & 255], sizeof f);
  return f;
}

/* The index of the nearest of the N ascending values CODE to X: the number of midpoints between
 * neighbours that lie below X (a value on a midpoint takes the lower neighbour), found by bisection. */
static int nearest(const float *code, int n, float x) {
  int lo = 0, hi = n - 1;   /* the answer is in [lo, hi] */
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    float bound = (code[mid] + code[mid + 1]) / 2.0f;   /* fp32, as the format's reference computes it */
    if (bound < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* x·(1/scale), clamped to [-1, 1]; the reciprocal in fp32, a zero scale taken as 1e-38. */
static float scaled(float x, float scale) {
  float inv = 1.0f / fmaxf(scale, 1e-38f);
  float v = x * inv;
  return v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
}

int nf4_quantize(const float *x, int64_t n, nf4_tensor *t) {
  if (n <= 0 || n % NF4_BLOCK) return -1;
  int64_t nb = nf4_blocks(n), ng = nf4_groups(n);
  float *absmax = malloc((size_t)nb * sizeof *absmax);
  if (!absmax) return -2;
  float dyn[256];
  for (int i = 0; i < 256; i++) dyn[i] = nf4_dynamic(i);
  t->n = n;
  double sum = 0;
  for (int64_t b = 0; b < nb; b++) {   /* the first quantization: NF4 codes against each block's absmax */
    const float *xb = x + b * NF4_BLOCK;
    float amax = 0;
    for (int i = 0; i < NF4_BLOCK; i++) amax = fmaxf(amax, fabsf(xb[i]));
    for (int i = 0; i < NF4_BLOCK; i += 2) {
      int hi = nearest(nf4_code, 16, scaled(xb[i], amax)), lo = nearest(nf4_code, 16, scaled(xb[i + 1], amax));
      t->codes[(b * NF4_BLOCK + i) / 2] = (uint8_t)(hi << 4 | lo);
    }
    absmax[b] = amax;
    sum += amax;
  }
  /* the second: the scales less their mean (their sum in double, rounded, divided in fp32; torch's
   * fp32 mean, which bitsandbytes takes, sums in its own vectorized order and may be 1 ulp away), in
   * groups of 256, each against its largest magnitude on the dynamic map */
  t->offset = (float)sum / (float)nb;
  for (int64_t b = 0; b < nb; b++) absmax[b] -= t->offset;
  for (int64_t g = 0; g < ng; g++) {
    int64_t b0 = g * NF4_ABSMAX_BLOCK, b1 = b0 + NF4_ABSMAX_BLOCK < nb ? b0 + NF4_ABSMAX_BLOCK : nb;
    float amax = 0;
    for (int64_t b = b0; b < b1; b++) amax = fmaxf(amax, fabsf(absmax[b]));
    t->absmax2[g] = amax;
    for (int64_t b = b0; b < b1; b++) t->absmax_q[b] = (uint8_t)nearest(dyn, 256, scaled(absmax[b], amax));
  }
  free(absmax);
  return 0;
}

void nf4_absmax(const nf4_tensor *t, float *absmax) {
  int64_t nb = nf4_blocks(t->n);
  for (int64_t b = 0; b < nb; b++)
    absmax[b] = nf4_dynamic(t->absmax_q[b]) * t->absmax2[b / NF4_ABSMAX_BLOCK] + t->offset;
}

/* Block B's 64 values in fp32 into OUT, its scale SCALE. */
static void block_values(const nf4_tensor *t, int64_t b, float scale, float *out) {
  const uint8_t *c = t->codes + b * (NF4_BLOCK / 2);
  for (int i = 0; i < NF4_BLOCK / 2; i++) {
    out[2 * i] = nf4_value(nf4_code, c[i] >> 4, scale);
    out[2 * i + 1] = nf4_value(nf4_code, c[i] & 15, scale);
  }
}

void nf4_dequantize(const nf4_tensor *t, float *out) {
  int64_t nb = nf4_blocks(t->n);
  for (int64_t b = 0; b < nb; b++)
    block_values(t, b, nf4_dynamic(t->absmax_q[b]) * t->absmax2[b / NF4_ABSMAX_BLOCK] + t->offset, out + b * NF4_BLOCK);
}

void nf4_dequantize_bf16(const nf4_tensor *t, uint16_t *out) {
  int64_t nb = nf4_blocks(t->n);
  float v[NF4_BLOCK];
  for (int64_t b = 0; b < nb; b++) {
    block_values(t, b, nf4_dynamic(t->absmax_q[b]) * t->absmax2[b / NF4_ABSMAX_BLOCK] + t->offset, v);
    for (int i = 0; i < NF4_BLOCK; i++) out[b * NF4_BLOCK + i] = f32_to_bf16(v[i]);
  }
}

int nf4_record_write(const float *x, int64_t n, uint8_t *rec) {
  if (n <= 0 || n % NF4_BLOCK) return -1;
  int64_t ng = nf4_groups(n);
  nf4_tensor t = {.codes = rec, .absmax_q = rec + n / 2, .absmax2 = malloc((size_t)ng * sizeof(float))};
  if (!t.absmax2) return -2;
  int rc = nf4_quantize(x, n, &t);
  uint8_t *a2 = rec + n / 2 + nf4_blocks(n);
  memcpy(a2, t.absmax2, (size_t)ng * sizeof(float));
  memcpy(a2 + 4 * ng, &t.offset, sizeof(float));
  free(t.absmax2);
  return rc;
}

void nf4_record_dequantize_bf16(const uint8_t *rec, int64_t n, uint16_t *out) {
  int64_t nb = nf4_blocks(n), ng = nf4_groups(n);
  const uint8_t *aq = rec + n / 2, *a2 = aq + nb;
  nf4_tensor t = {.n = n, .codes = (uint8_t *)(uintptr_t)rec, .absmax_q = (uint8_t *)(uintptr_t)aq};
  float v[NF4_BLOCK];
  memcpy(&t.offset, a2 + 4 * ng, sizeof(float));
  for (int64_t g = 0; g < ng; g++) {   /* group by group: its scale read once, unaligned */
    float s2;
    memcpy(&s2, a2 + 4 * g, sizeof s2);
    int64_t b1 = (g + 1) * NF4_ABSMAX_BLOCK < nb ? (g + 1) * NF4_ABSMAX_BLOCK : nb;
    for (int64_t b = g * NF4_ABSMAX_BLOCK; b < b1; b++) {
      block_values(&t, b, nf4_dynamic(aq[b]) * s2 + t.offset, v);
      for (int i = 0; i < NF4_BLOCK; i++) out[b * NF4_BLOCK + i] = f32_to_bf16(v[i]);
    }
  }
}

/* ops_cuda_cudnn — opening libcudnn and building the causal SDPA graphs (ops_cuda_cudnn.h). The
 * plans, the cache and the calls are in ops_cuda_cudnn_run.c. Any thread; no shared state here. */
#define _GNU_SOURCE
#include "ops_cuda_cudnn.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "envknob.h"
#include "fsutil.h"

/* ---- the library ---- */

static int bind_api(ops_cudnn_api *a, void *dl) {
#define SYM(field, name)                      \
  do {                                        \
    *(void **)(&a->field) = dlsym(dl, name);  \
    if (!a->field) return 0;                  \
  } while (0)
  SYM(GetVersion, "cudnnGetVersion");
  SYM(GetErrorString, "cudnnGetErrorString");
  SYM(Create, "cudnnCreate");
  SYM(Destroy, "cudnnDestroy");
  SYM(SetStream, "cudnnSetStream");
  SYM(CreateDescriptor, "cudnnBackendCreateDescriptor");
  SYM(DestroyDescriptor, "cudnnBackendDestroyDescriptor");
  SYM(SetAttribute, "cudnnBackendSetAttribute");
  SYM(GetAttribute, "cudnnBackendGetAttribute");
  SYM(Finalize, "cudnnBackendFinalize");
  SYM(Execute, "cudnnBackendExecute");
#undef SYM
  return 1;
}

/* Tries one name or path; appends what happened to tried[] when it does not do. */
static int try_open(ops_cudnn_api *a, const char *name, char *tried, size_t ntried) {
  void *dl = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  size_t k = strlen(tried);
  if (!dl) {
    if (k < ntried) snprintf(tried + k, ntried - k, "%s%s", k ? ", " : "", name);
    return 0;
  }
  if (!bind_api(a, dl)) {
    if (k < ntried) snprintf(tried + k, ntried - k, "%s%s (no backend API)", k ? ", " : "", name);
    dlclose(dl);
    return 0;
  }
  a->dl = dl;
  snprintf(a->path, sizeof a->path, "%s", name);
  return 1;
}

/* Whether PATH, found by searching, is where only root or this user could have put it: its directory
 * and every one above it, and the file itself, belong to root or this user and no one else can write
 * them. Else the reason is appended to TRIED. */
static int trusted(const char *path, char *tried, size_t ntried) {
  int dirfd = -1, fd = -1;
  const char *name = NULL;
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash && slash > dir) *slash = '\0';
  fsdp_status rc = fsutil_parent_open(path, FSUTIL_TRUSTED_LINKS, &dirfd, &name);
  if (rc == FSDP_OK) rc = fsutil_check_private(dirfd, dir);
  if (rc == FSDP_OK) rc = fsutil_check_parents(dirfd, dir);
  if (rc == FSDP_OK) {
    fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    rc = fd < 0 ? fsdp_set_error(FSDP_ERR_IO, "%s: cannot open", path) : fsutil_check_private(fd, path);
  }
  if (fd >= 0) close(fd);
  if (dirfd >= 0) close(dirfd);
  size_t k = strlen(tried);
  if (rc != FSDP_OK && k < ntried) snprintf(tried + k, ntried - k, "%s%s (not trusted: %s)", k ? ", " : "", path, fsdp_last_error());
  return rc == FSDP_OK;
}

/* PyTorch's wheel (nvidia-cudnn-cu*): site-packages/nvidia/cudnn/lib under the usual prefixes. */
int ops_cudnn_find_wheel(char *found, size_t n, char *tried, size_t ntried) {
  static const char *const roots[] = {"VIRTUAL_ENV", "CONDA_PREFIX"};
  static const char *const fixed[] = {"/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
                                      "/usr/lib/python3*/dist-packages", "/usr/lib/python3*/site-packages"};
  char pat[768];
  const char *home = getenv("HOME");
  for (int i = 0; i < 2 + 1 + 4; i++) {
    if (i < 2) {
      const char *r = getenv(roots[i]);
      if (!r || !*r) continue;
      snprintf(pat, sizeof pat, "%s/lib/python3*/site-packages", r);
    } else if (i == 2) {
      if (!home || !*home) continue;
      snprintf(pat, sizeof pat, "%s/.local/lib/python3*/site-packages", home);
    } else {
      snprintf(pat, sizeof pat, "%s", fixed[i - 3]);
    }
    size_t k = strlen(pat);
    snprintf(pat + k, sizeof pat - k, "/nvidia/cudnn/lib/libcudnn.so.9");
    glob_t gl;
    if (glob(pat, 0, NULL, &gl) != 0) continue;
    int ok = 0;
    for (size_t j = 0; j < gl.gl_pathc && !ok; j++)
      if ((ok = trusted(gl.gl_pathv[j], tried, ntried))) snprintf(found, n, "%s", gl.gl_pathv[j]);
    globfree(&gl);
    if (ok) return 1;
  }
  size_t k = strlen(tried);
  if (k < ntried) snprintf(tried + k, ntried - k, "%sno trusted PyTorch nvidia/cudnn/lib in any site-packages", k ? ", " : "");
  return 0;
}

fsdp_status ops_cudnn_open(ops_cudnn_api *a) {
  memset(a, 0, sizeof *a);
  char tried[1024] = "", wheel[PATH_MAX];
  const char *env = envknob_get(ENV_CUDNN_LIB);
  int ok = 0;
  if (env) {
    ok = try_open(a, env, tried, sizeof tried);
    if (!ok)
      return fsdp_set_error(FSDP_ERR_NOTFOUND, "FSDP_CUDNN_LIB=%s does not open, or has no cuDNN backend API", env);
  }
  if (!ok) ok = try_open(a, "libcudnn.so.9", tried, sizeof tried) || try_open(a, "libcudnn_graph.so.9", tried, sizeof tried) ||
                (ops_cudnn_find_wheel(wheel, sizeof wheel, tried, sizeof tried) && try_open(a, wheel, tried, sizeof tried));
  if (!ok) return fsdp_set_error(FSDP_ERR_NOTFOUND, "no libcudnn found (tried %s; set FSDP_CUDNN_LIB)", tried);
  a->version = a->GetVersion();
  if (a->version < 90000) {
    fsdp_status rc = fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s is cuDNN %zu; the fused attention needs cuDNN 9",
                                    a->path, a->version);
    ops_cudnn_close(a);
    return rc;
  }
  return FSDP_OK;
}

void ops_cudnn_close(ops_cudnn_api *a) {
  if (a->dl) dlclose(a->dl);
  memset(a, 0, sizeof *a);
}

/* ---- the graph: a builder whose first failure sticks (every later call is skipped) ---- */

typedef struct gb {
  ops_cudnn_sdpa *g;
  fsdp_status rc;
  int64_t uid; /* the next virtual tensor's id */
} gb;

static int gb_fail(gb *b, cudnnStatus_t s, const char *what) {
  if (s == CUDNN_STATUS_SUCCESS) return 0;
  b->rc = fsdp_set_error(FSDP_ERR_UNSUPPORTED, "cuDNN refused %s: %s (status %d)", what,
                         b->g->api->GetErrorString(s), (int)s);
  return 1;
}

static cudnnBackendDescriptor_t gb_new(gb *b, cudnnBackendDescriptorType_t type, const char *what) {
  cudnnBackendDescriptor_t d = NULL;
  if (b->rc != FSDP_OK) return NULL;
  if (b->g->ndesc == OPS_CUDNN_MAX_DESC) {
    b->rc = fsdp_set_error(FSDP_ERR_INTERNAL, "cuDNN graph: more than %d descriptors", OPS_CUDNN_MAX_DESC);
    return NULL;
  }
  if (gb_fail(b, b->g->api->CreateDescriptor(type, &d), what)) return NULL;
  b->g->desc[b->g->ndesc++] = d;
  return d;
}

static void gb_set(gb *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t n, const void *v, const char *what) {
  if (b->rc == FSDP_OK) gb_fail(b, b->g->api->SetAttribute(d, name, type, n, v), what);
}

static void gb_fin(gb *b, cudnnBackendDescriptor_t d, const char *what) {
  if (b->rc == FSDP_OK) gb_fail(b, b->g->api->Finalize(d), what);
}

enum { T_VIRTUAL = 1, T_BY_VALUE = 2 };

/* A tensor of 4 dimensions; uid 0 takes the next virtual id. */
static cudnnBackendDescriptor_t tensor(gb *b, int64_t uid, cudnnDataType_t dt, const int64_t dim[4],
                                       const int64_t str[4], int flags) {
  cudnnBackendDescriptor_t t = gb_new(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "a tensor descriptor");
  const int64_t id = uid ? uid : b->uid++, align = 16;
  const bool virt = (flags & T_VIRTUAL) != 0, byval = (flags & T_BY_VALUE) != 0;
  gb_set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "a tensor's data type");
  gb_set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, "a tensor's dimensions");
  gb_set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str, "a tensor's strides");
  gb_set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id, "a tensor's id");
  gb_set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "a tensor's alignment");
  if (virt) gb_set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "a virtual tensor");
  if (byval) gb_set(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval, "a by-value scalar");
  gb_fin(b, t, "a tensor descriptor (finalize)");
  return t;
}

/* One operation of the graph: a descriptor of `type` whose attributes name[i] are the descriptors
 * d[i] (NULL: not set), finalized and appended. `what` names it in a refusal. */
static void operation(gb *b, cudnnBackendDescriptorType_t type, int n, const cudnnBackendAttributeName_t *name,
                      const cudnnBackendDescriptor_t *d, const char *what) {
  cudnnBackendDescriptor_t op = gb_new(b, type, what);
  for (int i = 0; i < n; i++)
    if (d[i]) gb_set(b, op, name[i], CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d[i], what);
  gb_fin(b, op, what);
  if (b->rc != FSDP_OK) return;
  if (b->g->nops == OPS_CUDNN_MAX_OPS) {
    b->rc = fsdp_set_error(FSDP_ERR_INTERNAL, "cuDNN graph: more than %d operations", OPS_CUDNN_MAX_OPS);
    return;
  }
  b->g->ops[b->g->nops++] = op;
}

/* The configuration of an operation: a descriptor of `type` with n one-element attributes, finalized. */
typedef struct attr {
  cudnnBackendAttributeName_t name;
  cudnnBackendAttributeType_t type;
  const void *v;
} attr;

static cudnnBackendDescriptor_t config(gb *b, cudnnBackendDescriptorType_t type, int n, const attr *at,
                                       const char *what) {
  cudnnBackendDescriptor_t d = gb_new(b, type, what);
  for (int i = 0; i < n; i++) gb_set(b, d, at[i].name, at[i].type, 1, at[i].v, what);
  gb_fin(b, d, what);
  return d;
}

/* y = mode(x[, b][, t]); prec is the math precision; axis ≥ 0 for GEN_INDEX. Returns y. */
static cudnnBackendDescriptor_t pw(gb *b, cudnnPointwiseMode_t mode, cudnnDataType_t prec, cudnnBackendDescriptor_t x,
                                   cudnnBackendDescriptor_t bb, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                                   int64_t axis) {
  const attr at[] = {{CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode},
                     {CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &prec},
                     {CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis}};
  cudnnBackendDescriptor_t d = config(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, axis >= 0 ? 3 : 2, at, "a pointwise mode");
  static const cudnnBackendAttributeName_t names[] = {
      CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
      CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_ATTR_OPERATION_POINTWISE_YDESC};
  const cudnnBackendDescriptor_t descs[] = {d, x, bb, t, y};
  operation(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, 5, names, descs, "a pointwise operation");
  return y;
}

/* c = a·b over the last two dimensions (batched over the first two, broadcast where 1 divides) */
static cudnnBackendDescriptor_t matmul(gb *b, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bm,
                                       cudnnBackendDescriptor_t c) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const attr at[] = {{CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32}};
  cudnnBackendDescriptor_t d = config(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, 1, at, "a matmul descriptor");
  static const cudnnBackendAttributeName_t names[] = {
      CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_ATTR_OPERATION_MATMUL_CDESC,
      CUDNN_ATTR_OPERATION_MATMUL_DESC};
  const cudnnBackendDescriptor_t descs[] = {a, bm, c, d};
  operation(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, 4, names, descs, "a matmul operation");
  return c;
}

/* y = x reduced (max or sum) over the dimensions where y is 1 (or grouped where y divides x) */
static cudnnBackendDescriptor_t reduce(gb *b, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                                       cudnnBackendDescriptor_t y) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const attr at[] = {{CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &how},
                     {CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32}};
  cudnnBackendDescriptor_t d = config(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, 2, at, "a reduction descriptor");
  static const cudnnBackendAttributeName_t names[] = {
      CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_ATTR_OPERATION_REDUCTION_DESC};
  const cudnnBackendDescriptor_t descs[] = {x, y, d};
  operation(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, 3, names, descs, "a reduction operation");
  return y;
}

/* y: the same elements as x seen through other dimensions and strides (a transpose) */
static cudnnBackendDescriptor_t reshape(gb *b, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  static const cudnnBackendAttributeName_t names[] = {CUDNN_ATTR_OPERATION_RESHAPE_XDESC,
                                                      CUDNN_ATTR_OPERATION_RESHAPE_YDESC};
  const cudnnBackendDescriptor_t descs[] = {x, y};
  operation(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, 2, names, descs, "a reshape operation");
  return y;
}

/* The shapes of one graph, and the virtual tensors every graph has. */
typedef struct shp {
  int64_t B, T, NH, NKV, hs, C3, C;
  int window; /* the sliding window W (0: none) */
} shp;

static cudnnBackendDescriptor_t scores(gb *b, const shp *s, cudnnDataType_t dt) {   /* (B,NH,T,T) */
  const int64_t d[4] = {s->B, s->NH, s->T, s->T}, st[4] = {s->NH * s->T * s->T, s->T * s->T, s->T, 1};
  return tensor(b, 0, dt, d, st, T_VIRTUAL);
}

static cudnnBackendDescriptor_t scores_t(gb *b, const shp *s, cudnnDataType_t dt) { /* its transpose */
  const int64_t d[4] = {s->B, s->NH, s->T, s->T}, st[4] = {s->NH * s->T * s->T, s->T * s->T, 1, s->T};
  return tensor(b, 0, dt, d, st, T_VIRTUAL);
}

static cudnnBackendDescriptor_t rows(gb *b, const shp *s, int64_t uid) {   /* (B,NH,T,1) fp32 */
  const int64_t d[4] = {s->B, s->NH, s->T, 1}, st[4] = {s->NH * s->T, s->T, 1, 1};
  return tensor(b, uid, CUDNN_DATA_FLOAT, d, st, uid ? 0 : T_VIRTUAL);
}

static cudnnBackendDescriptor_t scalar(gb *b, int64_t uid) {
  const int64_t one[4] = {1, 1, 1, 1};
  return tensor(b, uid, CUDNN_DATA_FLOAT, one, one, T_BY_VALUE);
}

/* Heads of the packed (B,T,C3) qkv or dqkv (n heads), or of a (B,T,C) output: (B,n,T,hs); with
 * transposed != 0 the last two dimensions swap (Kᵀ, Vᵀ). */
static cudnnBackendDescriptor_t heads(gb *b, const shp *s, int64_t uid, int64_t n, int64_t row, int transposed) {
  int64_t d[4] = {s->B, n, s->T, s->hs}, st[4] = {s->T * row, s->hs, row, 1};
  if (transposed) {
    d[2] = s->hs, d[3] = s->T;
    st[2] = 1, st[3] = row;
  }
  return tensor(b, uid, CUDNN_DATA_BFLOAT16, d, st, uid ? 0 : T_VIRTUAL);
}

/* x with every score above the diagonal (column > row) replaced by −∞; with a window W, also every
 * score left of the band (column + W ≤ row: docmask's t − W < s kept), as cudnn-frontend lowers
 * its sliding window (a diagonal band's left bound): column + W by a by-value scalar, a comparison
 * with the row, a second select. */
static cudnnBackendDescriptor_t causal(gb *b, const shp *s, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t neginf) {
  const int64_t d[4] = {s->B, s->NH, s->T, s->T}, st[4] = {s->NH * s->T * s->T, s->T * s->T, s->T, 1};
  cudnnBackendDescriptor_t row = pw(b, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL,
                                    tensor(b, 0, CUDNN_DATA_INT32, d, st, T_VIRTUAL), 2);
  cudnnBackendDescriptor_t col = pw(b, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL,
                                    tensor(b, 0, CUDNN_DATA_INT32, d, st, T_VIRTUAL), 3);
  cudnnBackendDescriptor_t keep = pw(b, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL,
                                     tensor(b, 0, CUDNN_DATA_BOOLEAN, d, st, T_VIRTUAL), -1);
  x = pw(b, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neginf, keep, scores(b, s, CUDNN_DATA_FLOAT), -1);
  if (s->window <= 0) return x;
  cudnnBackendDescriptor_t colw = pw(b, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, col, scalar(b, OPS_CUDNN_WINDOW), NULL,
                                     tensor(b, 0, CUDNN_DATA_FLOAT, d, st, T_VIRTUAL), -1);
  cudnnBackendDescriptor_t band = pw(b, CUDNN_POINTWISE_CMP_GT, CUDNN_DATA_BOOLEAN, colw, row, NULL,
                                     tensor(b, 0, CUDNN_DATA_BOOLEAN, d, st, T_VIRTUAL), -1);
  return pw(b, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neginf, band, scores(b, s, CUDNN_DATA_FLOAT), -1);
}

#define F32 CUDNN_DATA_FLOAT
#define BF16 CUDNN_DATA_BFLOAT16

/* S = scale·Q·Kᵀ, masked; then the softmax with its statistics, P·V. */
static void sdpa_forward(gb *b, const shp *s) {
  cudnnBackendDescriptor_t q = heads(b, s, OPS_CUDNN_Q, s->NH, s->C3, 0), kt = heads(b, s, OPS_CUDNN_K, s->NKV, s->C3, 1);
  cudnnBackendDescriptor_t v = heads(b, s, OPS_CUDNN_V, s->NKV, s->C3, 0), o = heads(b, s, OPS_CUDNN_O, s->NH, s->C, 0);
  cudnnBackendDescriptor_t scale = scalar(b, OPS_CUDNN_SCALE), neginf = scalar(b, OPS_CUDNN_NEGINF);
  cudnnBackendDescriptor_t x = matmul(b, q, kt, scores(b, s, F32));
  x = pw(b, CUDNN_POINTWISE_MUL, F32, x, scale, NULL, scores(b, s, F32), -1);
  x = causal(b, s, x, neginf);
  cudnnBackendDescriptor_t m = reduce(b, CUDNN_REDUCE_TENSOR_MAX, x, rows(b, s, 0));
  x = pw(b, CUDNN_POINTWISE_SUB, F32, x, m, NULL, scores(b, s, F32), -1);
  cudnnBackendDescriptor_t e = pw(b, CUDNN_POINTWISE_EXP, F32, x, NULL, NULL, scores(b, s, F32), -1);
  cudnnBackendDescriptor_t l = reduce(b, CUDNN_REDUCE_TENSOR_ADD, e, rows(b, s, 0));
  cudnnBackendDescriptor_t lg = pw(b, CUDNN_POINTWISE_LOG, F32, l, NULL, NULL, rows(b, s, 0), -1);
  pw(b, CUDNN_POINTWISE_ADD, F32, m, lg, NULL, rows(b, s, OPS_CUDNN_STATS), -1);
  cudnnBackendDescriptor_t p = pw(b, CUDNN_POINTWISE_DIV, F32, e, l, NULL, scores(b, s, BF16), -1);
  matmul(b, p, v, o);
}

/* dO·O row sums; P = e^(scale·Q·Kᵀ − stats), masked; dV = Pᵀ·dO; dS = scale·P∘(dO·Vᵀ − rowsum);
 * dK = dSᵀ·Q; dQ = dS·K through an fp32 accumulator. A grouped kv head's dK and dV are the sums
 * over its query heads of the full-head products. */
static void sdpa_backward(gb *b, const shp *s) {
  const int64_t C3 = s->C3, gqa = s->NH != s->NKV;
  cudnnBackendDescriptor_t q = heads(b, s, OPS_CUDNN_Q, s->NH, C3, 0), kt = heads(b, s, OPS_CUDNN_K, s->NKV, C3, 1);
  cudnnBackendDescriptor_t vt = heads(b, s, OPS_CUDNN_V, s->NKV, C3, 1), o = heads(b, s, OPS_CUDNN_O, s->NH, s->C, 0);
  cudnnBackendDescriptor_t dout = heads(b, s, OPS_CUDNN_DO, s->NH, s->C, 0), stats = rows(b, s, OPS_CUDNN_STATS);
  cudnnBackendDescriptor_t dq = heads(b, s, OPS_CUDNN_DQ, s->NH, C3, 0), dk = heads(b, s, OPS_CUDNN_DK, s->NKV, C3, 0);
  cudnnBackendDescriptor_t dv = heads(b, s, OPS_CUDNN_DV, s->NKV, C3, 0);
  cudnnBackendDescriptor_t scale = scalar(b, OPS_CUDNN_SCALE), neginf = scalar(b, OPS_CUDNN_NEGINF);
  cudnnBackendDescriptor_t one = scalar(b, OPS_CUDNN_ONE);
  const int64_t hd[4] = {s->B, s->NH, s->T, s->hs}, hst[4] = {s->NH * s->T * s->hs, s->T * s->hs, s->hs, 1};

  cudnnBackendDescriptor_t x = pw(b, CUDNN_POINTWISE_MUL, F32, dout, o, NULL, tensor(b, 0, F32, hd, hst, T_VIRTUAL), -1);
  x = reduce(b, CUDNN_REDUCE_TENSOR_ADD, x, rows(b, s, 0));
  cudnnBackendDescriptor_t ssum = pw(b, CUDNN_POINTWISE_MUL, F32, x, one, NULL, rows(b, s, OPS_CUDNN_SSUM), -1);

  x = matmul(b, q, kt, scores(b, s, F32));
  x = pw(b, CUDNN_POINTWISE_MUL, F32, x, scale, NULL, scores(b, s, F32), -1);
  x = pw(b, CUDNN_POINTWISE_SUB, F32, x, stats, NULL, scores(b, s, F32), -1);
  x = causal(b, s, x, neginf);
  cudnnBackendDescriptor_t p = pw(b, CUDNN_POINTWISE_EXP, F32, x, NULL, NULL, scores(b, s, F32), -1);
  cudnnBackendDescriptor_t pt = reshape(b, p, scores_t(b, s, BF16));
  if (!gqa) matmul(b, pt, dout, dv);
  else reduce(b, CUDNN_REDUCE_TENSOR_ADD, matmul(b, pt, dout, tensor(b, 0, BF16, hd, hst, T_VIRTUAL)), dv);

  x = matmul(b, dout, vt, scores(b, s, F32));
  x = pw(b, CUDNN_POINTWISE_SUB, F32, x, ssum, NULL, scores(b, s, F32), -1);
  x = pw(b, CUDNN_POINTWISE_MUL, F32, x, p, NULL, scores(b, s, F32), -1);
  cudnnBackendDescriptor_t ds = pw(b, CUDNN_POINTWISE_MUL, F32, x, scale, NULL, scores(b, s, F32), -1);
  cudnnBackendDescriptor_t dst = reshape(b, ds, scores_t(b, s, BF16));
  if (!gqa) matmul(b, dst, q, dk);
  else reduce(b, CUDNN_REDUCE_TENSOR_ADD, matmul(b, dst, q, tensor(b, 0, BF16, hd, hst, T_VIRTUAL)), dk);

  cudnnBackendDescriptor_t k = reshape(b, kt, heads(b, s, 0, s->NKV, C3, 0));
  const int64_t ast[4] = {s->NH * s->T * s->hs, s->T * s->hs, s->hs, 1};
  cudnnBackendDescriptor_t acc = matmul(b, ds, k, tensor(b, OPS_CUDNN_DQACC, F32, hd, ast, 0));
  pw(b, CUDNN_POINTWISE_IDENTITY, F32, acc, NULL, NULL, dq, -1);
  b->g->ssum_bytes = 4 * s->B * s->NH * s->T;
  b->g->dqacc_bytes = 4 * s->B * s->NH * s->T * s->hs;
}

fsdp_status ops_cudnn_sdpa_build(ops_cudnn_sdpa *g, const ops_cudnn_api *api, int backward, int B, int T, int C,
                                 int NH, int NKV, int window) {
  memset(g, 0, sizeof *g);
  g->api = api;
  g->backward = backward;
  if (B <= 0 || T <= 0 || NH <= 0 || NKV <= 0 || C % NH || NH % NKV || window < 0)
    return fsdp_set_error(FSDP_ERR_INVALID, "cuDNN attention: bad shape B=%d T=%d C=%d NH=%d NKV=%d window=%d", B, T, C,
                          NH, NKV, window);
  const int64_t hs = C / NH;
  const shp s = {.B = B, .T = T, .NH = NH, .NKV = NKV, .hs = hs, .C = C, .C3 = C + 2 * NKV * hs, .window = window};
  gb b = {.g = g, .rc = FSDP_OK, .uid = 100};
  if (backward) sdpa_backward(&b, &s);
  else sdpa_forward(&b, &s);
  if (b.rc != FSDP_OK) ops_cudnn_sdpa_free(g);
  return b.rc;
}

void ops_cudnn_sdpa_free(ops_cudnn_sdpa *g) {
  for (int i = g->ndesc - 1; i >= 0; i--) g->api->DestroyDescriptor(g->desc[i]);
  g->ndesc = g->nops = 0;
}

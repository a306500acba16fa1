/* ckpt_rankfile — see ckpt_rankfile.h. Rank file layout (little-endian, offsets in bytes):
 *
 *     0  magic "FSDPCKPT"          8
 *     8  u32 version               12  u32 header_bytes (H)
 *    16  u64 step                  24  u32 rank        28  u32 world
 *    32  u32 sharding (jobspec)    36  u32 shard_world
 *    40  i32 n_layer, n_head, n_embd, vocab_size, seq_len
 *    60  u32 nunits                64  u64 shard_total (floats)   72  u64 optimizer step count
 *    80  3 × {u64 offset, u64 length (bytes), u32 crc32c, u32 0}   (param, adamw_m, adamw_v)
 *   152  u64 padded[nunits]
 *  H-4   u32 crc32c of bytes [0, H-4)
 *  then the sections, each 4·shard_total bytes, each from a page (4096) boundary: the first at H
 *  rounded up to 4096, the next ones after the previous rounded up to 4096 (aligned and O_DIRECT
 *  writes; files written before this rounded the first to 64 and packed the others back to back,
 *  and readers take the offsets from the header).
 */
#define _GNU_SOURCE
#include "ckpt_rankfile.h"

#include <errno.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the checkpoint format is little-endian");

#define HDR_FIXED 152
#define MAX_UNITS 100000

static const char *const sec_names[CKPT_NSEC] = {"param", "adamw_m", "adamw_v"};
const char *ckpt_section_name(ckpt_section s) { return (unsigned)s < CKPT_NSEC ? sec_names[s] : "unknown"; }

uint32_t ckpt_crc32c(uint32_t crc, const void *buf, size_t len) {
  /* ISA-L's crc32_iscsi takes and returns the raw register (no final inversion) and an int length:
   * standard CRC32C is ~crc32_iscsi(buf, len, ~crc). */
  const unsigned char *p = buf;
  uint32_t c = ~crc;
  while (len > 0) {
    int n = len > (1u << 30) ? 1 << 30 : (int)len;
    c = crc32_iscsi((unsigned char *)p, n, c);
    p += n;
    len -= (size_t)n;
  }
  return ~c;
}

/* ---- the step directory ---- */

void ckpt_step_dir(const char *dir, int step, char *out, size_t cap) { snprintf(out, cap, "%s/step-%08d", dir, step); }

fsdp_status ckpt_open_step_dir(const char *dir, int step, int create, int *dirfd, int *stepfd) {
  char name[32], shown[PATH_MAX];
  int dfd;
  snprintf(name, sizeof name, "step-%08d", step);
  ckpt_step_dir(dir, step, shown, sizeof shown);
  TRY(fsutil_dir_open(AT_FDCWD, dir, create ? 0755 : 0, FSUTIL_TRUSTED_LINKS, &dfd));
  fsdp_status rc = fsutil_dir_open(dfd, name, create ? 0755 : 0, FSUTIL_NO_LINKS, stepfd);
  if (rc == FSDP_ERR_INVALID)   /* the walker names the component only */
    rc = fsdp_set_error(rc, "%s is not a directory of this checkpoint (a link or another file); refusing it", shown);
  if (rc == FSDP_OK && dirfd) *dirfd = dfd;
  else close(dfd);
  return rc;
}

fsdp_status ckpt_open_in_step(const char *dir, int step, const char *name, int *fd, char *shown, size_t cap) {
  int sfd;
  char sdir[PATH_MAX];
  ckpt_step_dir(dir, step, sdir, sizeof sdir);
  snprintf(shown, cap, "%s/%s", sdir, name);
  TRY(ckpt_open_step_dir(dir, step, 0, NULL, &sfd));
  *fd = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  int e = errno;
  close(sfd);
  if (*fd >= 0) return FSDP_OK;
  if (e == ELOOP) return fsdp_set_error(FSDP_ERR_INVALID, "%s is a symbolic link; refusing to read through it", shown);
  return fsdp_set_error(e == ENOENT ? FSDP_ERR_NOTFOUND : FSDP_ERR_IO, "cannot open %s: %s", shown, strerror(e));
}

/* ---- the header ---- */

static void put32(uint8_t *b, size_t off, uint32_t v) { memcpy(b + off, &v, 4); }
static void put64(uint8_t *b, size_t off, uint64_t v) { memcpy(b + off, &v, 8); }
static uint32_t get32(const uint8_t *b, size_t off) { uint32_t v; memcpy(&v, b + off, 4); return v; }
static uint64_t get64(const uint8_t *b, size_t off) { uint64_t v; memcpy(&v, b + off, 8); return v; }

size_t ckpt_rankfile_header_bytes(int nunits) { return HDR_FIXED + 8 * (size_t)nunits + 4; }
uint64_t ckpt_rankfile_page_up(uint64_t x) { return (x + CKPT_PAGE - 1) & ~(uint64_t)(CKPT_PAGE - 1); }
/* Each section starts on a page: O_DIRECT writes need aligned offsets. */
static uint64_t sec_stride(const plan_t *p) { return ckpt_rankfile_page_up((uint64_t)p->shard_total * sizeof(float)); }

uint64_t ckpt_rank_file_bytes(const plan_t *p) {
  return ckpt_rankfile_page_up(ckpt_rankfile_header_bytes(p->nunits)) + (CKPT_NSEC - 1) * sec_stride(p) +
         (uint64_t)p->shard_total * sizeof(float);
}

void ckpt_rankfile_header(uint8_t *h, size_t hb, const plan_t *p, int rank, int step, int64_t opt_step, uint64_t off) {
  uint64_t len = (uint64_t)p->shard_total * sizeof(float);
  memcpy(h, CKPT_MAGIC, 8);
  put32(h, 8, CKPT_VERSION);
  put32(h, 12, (uint32_t)hb);
  put64(h, 16, (uint64_t)step);
  put32(h, 24, (uint32_t)rank);
  put32(h, 28, (uint32_t)p->world);
  put32(h, 32, (uint32_t)p->sharding);
  put32(h, 36, (uint32_t)p->shard_world);
  const int32_t mc[5] = {p->model.n_layer, p->model.n_head, p->model.n_embd, p->model.vocab_size, p->model.seq_len};
  memcpy(h + 40, mc, sizeof mc);
  put32(h, 60, (uint32_t)p->nunits);
  put64(h, 64, (uint64_t)p->shard_total);
  put64(h, 72, (uint64_t)opt_step);
  for (int s = 0; s < CKPT_NSEC; s++) {
    put64(h, 80 + 24 * (size_t)s, off + (uint64_t)s * sec_stride(p));
    put64(h, 88 + 24 * (size_t)s, len);
  }
  for (int u = 0; u < p->nunits; u++) put64(h, HDR_FIXED + 8 * (size_t)u, (uint64_t)p->units[u].padded);
}

void ckpt_rankfile_set_crc(uint8_t *h, int s, uint32_t crc) { put32(h, 96 + 24 * (size_t)s, crc); }

void ckpt_rankfile_seal(uint8_t *h, size_t hb) { put32(h, hb - 4, ckpt_crc32c(0, h, hb - 4)); }

/* ---- reading ---- */

/* Read exactly N bytes at OFF; a short read is a truncated file. */
static fsdp_status pread_full(int fd, void *buf, size_t n, off_t off, const char *path) {
  char *p = buf;
  while (n > 0) {
    ssize_t r = pread(fd, p, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return fsdp_set_error(FSDP_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    if (r == 0)
      return fsdp_set_error(FSDP_ERR_FORMAT, "%s is truncated (end of file at byte %lld); the checkpoint is corrupt",
                            path, (long long)off);
    p += r, n -= (size_t)r, off += r;
  }
  return FSDP_OK;
}

/* The shape (the header's five numbers) and, from the manifest, the architecture and Llama's keys. */
int ckpt_shape_eq(const model_config *a, const model_config *b) {
  return a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd &&
         a->vocab_size == b->vocab_size && a->seq_len == b->seq_len;
}
fsdp_status ckpt_rankfile_open(const char *dir, const ckpt_info *ci, const plan_t *old, int q, rank_file *f) {
  char name[32];
  snprintf(name, sizeof name, "rank-%d.bin", q);
  fsdp_status orc = ckpt_open_in_step(dir, ci->step, name, &f->fd, f->path, sizeof f->path);
  if (orc == FSDP_ERR_NOTFOUND) return fsdp_set_error(orc, "%s does not exist (the manifest lists it)", f->path);
  TRY(orc);
  uint8_t fixed[HDR_FIXED];
  TRY(pread_full(f->fd, fixed, sizeof fixed, 0, f->path));
  if (memcmp(fixed, CKPT_MAGIC, 8) != 0)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: bad magic (not an fsdpd checkpoint rank file)", f->path);
  if (get32(fixed, 8) != CKPT_VERSION)
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: format version %u; this build reads version %d", f->path,
                          get32(fixed, 8), CKPT_VERSION);
  uint32_t nunits = get32(fixed, 60), hb = get32(fixed, 12);
  if (nunits < 1 || nunits > MAX_UNITS || hb != ckpt_rankfile_header_bytes((int)nunits))
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s: header size %u does not fit %u units", f->path, hb, nunits);
  uint8_t *h = malloc(hb);
  if (!h) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate a checkpoint header");
  fsdp_status rc = pread_full(f->fd, h, hb, 0, f->path);
  if (rc != FSDP_OK) goto out;
  uint32_t want = get32(h, hb - 4), got = ckpt_crc32c(0, h, hb - 4);
  if (want != got) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: header CRC32C mismatch (stored %08x, computed %08x): the file is corrupt",
                        f->path, want, got);
    goto out;
  }
  model_config mc;
  int32_t mcv[5];
  memcpy(mcv, h + 40, sizeof mcv);
  mc = (model_config){.n_layer = mcv[0], .n_head = mcv[1], .n_embd = mcv[2], .vocab_size = mcv[3], .seq_len = mcv[4]};
  if (get64(h, 16) != (uint64_t)ci->step || get32(h, 24) != (uint32_t)q || get32(h, 28) != (uint32_t)ci->world ||
      get32(h, 32) != (uint32_t)ci->sharding || get32(h, 36) != (uint32_t)old->shard_world || !ckpt_shape_eq(&mc, &ci->model) ||
      nunits != (uint32_t)old->nunits || get64(h, 64) != (uint64_t)old->shard_total) {
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: header (step %llu, rank %u, world %u, sharding %u, %u units, shard_total "
                        "%llu) disagrees with the manifest (step %d, rank %d, world %d, sharding %s, %d units, "
                        "shard_total %lld)", f->path, (unsigned long long)get64(h, 16), get32(h, 24), get32(h, 28),
                        get32(h, 32), nunits, (unsigned long long)get64(h, 64), ci->step, q, ci->world,
                        jobspec_shard_mode_name(ci->sharding), old->nunits, (long long)old->shard_total);
    goto out;
  }
  for (int u = 0; u < old->nunits; u++)
    if (get64(h, HDR_FIXED + 8 * (size_t)u) != (uint64_t)old->units[u].padded) {
      rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: unit %d padded size %llu, the plan says %lld", f->path, u,
                          (unsigned long long)get64(h, HDR_FIXED + 8 * (size_t)u), (long long)old->units[u].padded);
      goto out;
    }
  f->opt_step = (int64_t)get64(h, 72);
  uint64_t len = (uint64_t)old->shard_total * sizeof(float), end = 0;
  for (int s = 0; s < CKPT_NSEC; s++) {
    f->sec_off[s] = get64(h, 80 + 24 * (size_t)s);
    f->sec_len[s] = get64(h, 88 + 24 * (size_t)s);
    f->sec_crc[s] = get32(h, 96 + 24 * (size_t)s);
    if (f->sec_len[s] != len || f->sec_off[s] < hb) {
      rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: section %s has length %llu at %llu; expected %llu after the header",
                          f->path, sec_names[s], (unsigned long long)f->sec_len[s], (unsigned long long)f->sec_off[s],
                          (unsigned long long)len);
      goto out;
    }
    if (f->sec_off[s] + len > end) end = f->sec_off[s] + len;
  }
  struct stat sb;
  if (fstat(f->fd, &sb) != 0) {
    rc = fsdp_set_error(FSDP_ERR_IO, "cannot stat %s: %s", f->path, strerror(errno));
    goto out;
  }
  if ((uint64_t)sb.st_size != end)
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s is %s: %lld bytes, its header says %llu; the checkpoint is corrupt", f->path,
                        (uint64_t)sb.st_size < end ? "truncated" : "too long", (long long)sb.st_size,
                        (unsigned long long)end);
out:
  free(h);
  return rc;
}

void ckpt_rankfile_close(rank_file *f) {
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
}

fsdp_status ckpt_rankfile_read_section(rank_file *f, int s, void *buf) {
  enum { CHUNK = 8 << 20 };
  uint8_t *tmp = buf ? NULL : malloc(CHUNK);
  if (!buf && !tmp) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate a read buffer");
  uint32_t crc = 0;
  fsdp_status rc = FSDP_OK;
  for (uint64_t done = 0; done < f->sec_len[s];) {
    size_t n = f->sec_len[s] - done > CHUNK ? CHUNK : (size_t)(f->sec_len[s] - done);
    uint8_t *dst = buf ? (uint8_t *)buf + done : tmp;
    TRY_GOTO(pread_full(f->fd, dst, n, (off_t)(f->sec_off[s] + done), f->path), rc, out);
    crc = ckpt_crc32c(crc, dst, n);
    done += n;
  }
  if (crc != f->sec_crc[s])
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s: section %s CRC32C mismatch (stored %08x, computed %08x): the checkpoint "
                        "is corrupt; delete its step directory to resume from an older one", f->path, sec_names[s],
                        f->sec_crc[s], crc);
out:
  free(tmp);
  return rc;
}

fsdp_status ckpt_rankfile_pread(const rank_file *f, void *buf, size_t n, uint64_t off) {
  return pread_full(f->fd, buf, n, (off_t)off, f->path);
}

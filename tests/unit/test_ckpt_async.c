/* test_ckpt_async — the asynchronous checkpoint writer (worker/ckpt_async.h): a write on the writer
 * thread produces the file a synchronous ckpt_write_rank does, byte for byte; the write is pending
 * and not finished while the writer is held at a named point (FSDP_TEST_CKPT_PAUSE, tests/hooks/ckpt_pause.c),
 * and finished once released; a failed write reports its message on the caller's thread; destroy
 * with a write in flight waits for it; the writer thread runs under SCHED_IDLE (read back from
 * /proc/self/task, not from the module's own word); a write begun from live shards and detached
 * before they change is the file of the shards as they were (its control: changed undetached, the
 * file differs). */
#define _GNU_SOURCE   /* SCHED_IDLE */
#include <dirent.h>
#include <sched.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "ckpt_async.h"
#include "device.h"
#include "jobspec.h"
#include "plan.h"
#include "testfiles.h"

static const char *JOB = "[model]\nn_layer = 2\nn_head = 2\nn_embd = 32\nvocab_size = 64\nseq_len = 16\n"
                         "[data]\ntrain = synthetic:markov:1\nbatch_size = 2\n[fsdp]\nworld_size = 2\n";

/* Wait up to 20 s for PATH to exist. */
static int wait_file(const char *path) {
  struct timespec tick = {0, 5 * 1000 * 1000};
  for (double t0 = now_s(); now_s() - t0 < 20;) {
    if (access(path, F_OK) == 0) return 1;
    nanosleep(&tick, NULL);
  }
  return 0;
}

/* How many of this process's threads run under POLICY (field 41 of /proc/self/task/TID/stat). */
static int threads_with_policy(int policy) {
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char path[300], line[2048];
    snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t len = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[len] = 0;
    char *p = strrchr(line, ')');   /* the command name may hold spaces; fields 3.. follow it */
    int field = 2, pol = -1;
    for (char *tok = p ? strtok(p + 1, " ") : NULL; tok; tok = strtok(NULL, " "))
      if (++field == 41) { pol = atoi(tok); break; }
    n += pol == policy;
  }
  closedir(d);
  return n;
}

int main(void) {
  char dir[] = "/tmp/fsdp-ckasync-XXXXXX";
  if (!mkdtemp(dir)) return 2;
  jobspec_t spec;
  plan_t *p = NULL;
  device_t *dev = NULL;
  ckpt_async *a = NULL;
  CHECK_OK(jobspec_parse(JOB, "t.ini", "/tmp", &spec));
  CHECK_OK(plan_build(&spec, 2, &p));
  CHECK_OK(dev_new_cpu(DEV_CPU_SYNC, &dev));
  CHECK_EQ_INT(0, threads_with_policy(SCHED_IDLE));
  CHECK_OK(ckpt_async_new(&a));
  if (!p || !dev || !a) return check_done();
  /* the writer yields to training: SCHED_IDLE, which Linux grants without privilege */
  CHECK(strcmp(ckpt_async_priority(a), "idle") == 0);
  CHECK_EQ_INT(1, threads_with_policy(SCHED_IDLE));
  size_t bytes = (size_t)p->shard_total * sizeof(float);
  float *buf[CKPT_NSEC];
  CHECK_OK(ckpt_async_buffers(a, dev, bytes, buf));
  for (int s = 0; s < CKPT_NSEC; s++)
    for (int64_t i = 0; i < p->shard_total; i++) buf[s][i] = (float)(s * 1000003 + i) * 0.5f;

  /* the reference: the same shards written synchronously */
  char sync_dir[700], f_sync[800], f_async[800];
  snprintf(sync_dir, sizeof sync_dir, "%s/sync", dir);
  CHECK_OK(ckpt_write_rank(sync_dir, p, 1, 3, 3, buf[0], buf[1], buf[2]));

  /* held mid-file (after the first section), then released */
  char pause_dir[700], marker[800], release[800];
  snprintf(pause_dir, sizeof pause_dir, "%s/pause", dir);
  mkdir(pause_dir, 0700);
  snprintf(marker, sizeof marker, "%s/paused-mid-1", pause_dir);
  snprintf(release, sizeof release, "%s/release", pause_dir);
  setenv("FSDP_TEST_CKPT_PAUSE", "mid:3", 1);
  setenv("FSDP_TEST_CKPT_PAUSE_DIR", pause_dir, 1);
  ckpt_save_stats st = {.blocked_s = 0.25};
  CHECK(!ckpt_async_pending(a));
  ckpt_async_start(a, dir, p, NULL, 1, 3, &st);
  CHECK(ckpt_async_pending(a));
  CHECK(wait_file(marker));
  CHECK(!ckpt_async_finished(a));   /* held mid-file: not finished, and no rank file yet */
  snprintf(f_async, sizeof f_async, "%s/step-00000003/rank-1.bin", dir);
  CHECK(access(f_async, F_OK) != 0);
  CHECK(ckpt_async_buffers(a, dev, bytes, buf) != FSDP_OK);   /* the snapshot is not reused meanwhile */
  int fd = open(release, O_WRONLY | O_CREAT, 0600);
  if (fd >= 0) close(fd);
  memset(&st, 0, sizeof st);
  CHECK_OK(ckpt_async_wait(a, &st));
  CHECK(!ckpt_async_pending(a));
  unsetenv("FSDP_TEST_CKPT_PAUSE");
  snprintf(f_sync, sizeof f_sync, "%s/step-00000003/rank-1.bin", sync_dir);
  CHECK(files_equal(f_sync, f_async));
  struct stat sb;
  CHECK(stat(f_async, &sb) == 0 && (uint64_t)sb.st_size == st.bytes);
  CHECK_EQ_INT(3, st.step);
  CHECK(st.blocked_s == 0.25 && st.write_s > 0);
  CHECK(ckpt_async_plan(a) == p && strcmp(ckpt_async_dir(a), dir) == 0);
  printf("async write: %llu bytes in %.3f s, equal to the synchronous file\n", (unsigned long long)st.bytes, st.write_s);

  /* held mid-file again, asked to hurry, released: the writer hands the rest over at its next chunk
   * and the waiting thread finishes it, the same file byte for byte */
  char sync7[700], f_sync7[800], f_async7[800];
  snprintf(sync7, sizeof sync7, "%s/sync7", dir);
  CHECK_OK(ckpt_write_rank(sync7, p, 1, 7, 7, buf[0], buf[1], buf[2]));
  unlink(release);
  unlink(marker);
  setenv("FSDP_TEST_CKPT_PAUSE", "mid:7", 1);
  CHECK_OK(ckpt_async_buffers(a, dev, bytes, buf));
  ckpt_async_start(a, dir, p, NULL, 1, 7, &st);
  CHECK(wait_file(marker));
  ckpt_async_hurry(a);
  fd = open(release, O_WRONLY | O_CREAT, 0600);
  if (fd >= 0) close(fd);
  memset(&st, 0, sizeof st);
  CHECK_OK(ckpt_async_wait(a, &st));
  unsetenv("FSDP_TEST_CKPT_PAUSE");
  CHECK_EQ_INT(1, st.handed_over);
  snprintf(f_sync7, sizeof f_sync7, "%s/step-00000007/rank-1.bin", sync7);
  snprintf(f_async7, sizeof f_async7, "%s/step-00000007/rank-1.bin", dir);
  CHECK(files_equal(f_sync7, f_async7));
  printf("handed over mid-file: finished by the waiting thread, equal to the synchronous file\n");

  /* from the live shards (no snapshot): held after its first chunk (the first section), detached,
   * the shards then overwritten as the optimizer would: the file is the shards as they were at the
   * start, and what was left (the two other sections) was copied at the detach. The control: the
   * same without the detach, and the file differs. */
  float *live[CKPT_NSEC], *orig[CKPT_NSEC];
  const float *clive[CKPT_NSEC];
  for (int s = 0; s < CKPT_NSEC; s++) {
    live[s] = dev->op->alloc_host(dev, bytes);
    orig[s] = malloc(bytes);
    if (!live[s] || !orig[s]) return check_done();
    memcpy(orig[s], buf[s], bytes);
    clive[s] = live[s];
  }
  setenv("FSDP_TEST_CKPT_PAUSE_DIR", pause_dir, 1);
  snprintf(marker, sizeof marker, "%s/paused-chunk-1", pause_dir);
  for (int detach = 1; detach >= 0; detach--) {
    int step = detach ? 8 : 9;
    char ref_dir[700], pause[32], f_ref[800], f_live[800];
    snprintf(ref_dir, sizeof ref_dir, "%s/ref%d", dir, step);
    CHECK_OK(ckpt_write_rank(ref_dir, p, 1, step, step, orig[0], orig[1], orig[2]));
    CHECK_OK(ckpt_async_buffers(a, dev, bytes, buf));
    for (int s = 0; s < CKPT_NSEC; s++) {
      memcpy(live[s], orig[s], bytes);
      memset(buf[s], 0, bytes);   /* the snapshot's old content is not what the file gets */
    }
    unlink(release);
    unlink(marker);
    snprintf(pause, sizeof pause, "chunk:%d", step);
    setenv("FSDP_TEST_CKPT_PAUSE", pause, 1);
    st = (ckpt_save_stats){.blocked_s = 0.25};
    ckpt_async_start_live(a, dir, p, NULL, 1, step, &st, clive);
    CHECK(wait_file(marker));
    if (detach) CHECK(ckpt_async_detach(a) >= 0.0);
    for (int s = 0; s < CKPT_NSEC; s++) memset(live[s], 0x7f, bytes);   /* the optimizer's update */
    if (detach) CHECK(ckpt_async_detach(a) == 0.0);   /* detached already: a no-op */
    fd = open(release, O_WRONLY | O_CREAT, 0600);
    if (fd >= 0) close(fd);
    memset(&st, 0, sizeof st);
    CHECK_OK(ckpt_async_wait(a, &st));
    unsetenv("FSDP_TEST_CKPT_PAUSE");
    snprintf(f_ref, sizeof f_ref, "%s/step-%08d/rank-1.bin", ref_dir, step);
    snprintf(f_live, sizeof f_live, "%s/step-%08d/rank-1.bin", dir, step);
    CHECK_EQ_INT(detach, files_equal(f_ref, f_live));
    CHECK_EQ_INT(detach ? 2 * (long long)bytes : 0, (long long)st.detached_bytes);
    CHECK(st.blocked_s >= 0.25);
  }
  printf("live write detached after its first section: the file of the shards as they were; undetached: not\n");
  for (int s = 0; s < CKPT_NSEC; s++) {
    dev->op->free_host(dev, live[s]);
    free(orig[s]);
  }

  /* a write that fails (its directory is a file): the message reaches the caller's thread */
  char notdir[700];
  snprintf(notdir, sizeof notdir, "%s/plain-file", dir);
  fd = open(notdir, O_WRONLY | O_CREAT, 0600);
  if (fd >= 0) close(fd);
  CHECK_OK(ckpt_async_buffers(a, dev, bytes, buf));
  ckpt_async_start(a, notdir, p, NULL, 0, 4, &st);
  fsdp_clear_error();
  CHECK(ckpt_async_wait(a, NULL) != FSDP_OK);
  CHECK(strstr(fsdp_last_error(), "plain-file") != NULL);
  printf("failed write: %s\n", fsdp_last_error());

  /* a rank beyond the writer's world writes nothing and is complete at once; an owned plan is freed */
  plan_t *own = NULL;
  CHECK_OK(plan_build(&spec, 2, &own));
  ckpt_async_start(a, dir, own, &own, 2, 5, &st);
  CHECK(own == NULL);
  CHECK_OK(ckpt_async_wait(a, &st));
  CHECK_EQ_INT(0, st.bytes);

  /* destroy while a write is in flight: it waits for the write */
  CHECK_OK(ckpt_async_buffers(a, dev, bytes, buf));
  ckpt_async_start(a, dir, p, NULL, 0, 6, &st);
  ckpt_async_destroy(&a);
  CHECK(a == NULL);
  CHECK_EQ_INT(0, threads_with_policy(SCHED_IDLE));
  char f6[800];
  snprintf(f6, sizeof f6, "%s/step-00000006/rank-0.bin", dir);
  CHECK(access(f6, F_OK) == 0);

  dev_destroy(&dev);
  plan_destroy(&p);
  rm_rf(dir);
  return check_done();
}

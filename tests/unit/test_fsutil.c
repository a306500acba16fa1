/* test_fsutil — the link-safe file helpers: directory walks that follow only trusted links,
 * atomic replacement through a planted NAME.tmp or NAME link without writing through it, appends
 * that refuse links and hard links, removal that never follows a link, the StrictModes checks, reads
 * that follow only the reader's (or root's) links and, as root under fsutil_reads_own_tree, take
 * root's files only, and output folders written at one descriptor and removed whole on failure.
 * Each attack checks that the file the link points to is unchanged, byte for byte. Checks that need
 * a file owned by another user (lchown) run only as root. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fsutil.h"

#define NOBODY 65534

static char base[] = "/tmp/test-fsutil-XXXXXX";

static void at(char *buf, size_t n, const char *rel) { snprintf(buf, n, "%s/%s", base, rel); }

static void put(const char *rel, const char *text) {
  char p[512];
  at(p, sizeof p, rel);
  FILE *f = fopen(p, "w");
  fputs(text, f);
  fclose(f);
}

/* The whole content of REL ("" when it cannot be read). */
static const char *get(const char *rel) {
  static char buf[4096];
  char p[512];
  at(p, sizeof p, rel);
  buf[0] = '\0';
  FILE *f = fopen(p, "r");
  if (!f) return buf;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static void mk(const char *rel, mode_t mode) {
  char p[512];
  at(p, sizeof p, rel);
  mkdir(p, mode);
  chmod(p, mode);   /* whatever the umask */
}

static void ln(const char *target, const char *rel) {
  char p[512];
  at(p, sizeof p, rel);
  if (symlink(target, p) != 0) perror(p);
}

static int is_link(const char *rel) {
  char p[512];
  struct stat st;
  at(p, sizeof p, rel);
  return lstat(p, &st) == 0 && S_ISLNK(st.st_mode);
}

static int exists(const char *rel) {
  char p[512];
  struct stat st;
  at(p, sizeof p, rel);
  return lstat(p, &st) == 0;
}

static void test_dir_open(void) {
  char p[512], victim[512];
  int fd = -1;
  at(p, sizeof p, "made/a/b");
  CHECK_OK(fsutil_dir_open(AT_FDCWD, p, 0700, FSUTIL_TRUSTED_LINKS, &fd));
  struct stat st;
  CHECK(fd >= 0 && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
  if (fd >= 0) close(fd);
  CHECK_OK(fsutil_mkdir_p(p, 0700));   /* existing: fine */
  at(p, sizeof p, "missing/x");
  CHECK_EQ_INT(FSDP_ERR_NOTFOUND, fsutil_dir_open(AT_FDCWD, p, 0, FSUTIL_TRUSTED_LINKS, &fd));
  CHECK(!exists("missing"));

  /* A link of our own in a directory only we can write: followed. */
  mk("real", 0755);
  mk("safe", 0755);
  at(victim, sizeof victim, "real");
  ln(victim, "safe/to-real");
  at(p, sizeof p, "safe/to-real/sub");
  CHECK_OK(fsutil_dir_open(AT_FDCWD, p, 0755, FSUTIL_TRUSTED_LINKS, &fd));
  if (fd >= 0) close(fd);
  CHECK(exists("real/sub"));
  /* ... but never with FSUTIL_NO_LINKS, even to create below it. */
  at(p, sizeof p, "safe/to-real/other");
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_dir_open(AT_FDCWD, p, 0755, FSUTIL_NO_LINKS, &fd));
  CHECK(!exists("real/other"));
  CHECK(strstr(fsdp_last_error(), "safe/to-real is a symbolic link") != NULL);

  /* The same link in a directory that others can write (no sticky bit): refused, nothing created. */
  mk("open", 0777);
  ln(victim, "open/to-real");
  at(p, sizeof p, "open/to-real/planted");
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_dir_open(AT_FDCWD, p, 0755, FSUTIL_TRUSTED_LINKS, &fd));
  CHECK(!exists("real/planted"));
  CHECK(strstr(fsdp_last_error(), "open/to-real is a symbolic link owned by") != NULL);
  /* In a sticky one (as /tmp) our own link is ours to keep: followed. */
  mk("sticky", 01777);
  ln(victim, "sticky/to-real");
  at(p, sizeof p, "sticky/to-real");
  CHECK_OK(fsutil_dir_open(AT_FDCWD, p, 0, FSUTIL_TRUSTED_LINKS, &fd));
  if (fd >= 0) close(fd);

  if (geteuid() == 0) {   /* a link that another user planted in the sticky directory: refused */
    ln(victim, "sticky/theirs");
    at(p, sizeof p, "sticky/theirs");
    CHECK(lchown(p, NOBODY, NOBODY) == 0);
    CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_dir_open(AT_FDCWD, p, 0, FSUTIL_TRUSTED_LINKS, &fd));
    CHECK(strstr(fsdp_last_error(), "uid 65534") != NULL);
  }
  /* A file where a directory is expected */
  put("plain", "x");
  at(p, sizeof p, "plain/sub");
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_dir_open(AT_FDCWD, p, 0755, FSUTIL_TRUSTED_LINKS, &fd));
}

static void test_parent_open(void) {
  char p[512];
  int fd = -1;
  const char *name = NULL;
  at(p, sizeof p, "made/a/file.bin");
  CHECK_OK(fsutil_parent_open(p, FSUTIL_TRUSTED_LINKS, &fd, &name));
  CHECK(name && !strcmp(name, "file.bin"));
  if (fd >= 0) close(fd);
  at(p, sizeof p, "made/a/..");
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_parent_open(p, FSUTIL_TRUSTED_LINKS, &fd, &name));
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_parent_open("/", FSUTIL_TRUSTED_LINKS, &fd, &name));
}

/* A link planted at NAME.tmp and at NAME: the writes land in a new file; the victim is unchanged. */
static void test_atomic_planted(void) {
  char victim[512], p[512];
  mk("out", 0777);
  put("victim", "root's file\n");
  at(victim, sizeof victim, "victim");
  ln(victim, "out/model.bin.tmp");
  ln(victim, "out/model.bin");
  fsutil_atomic a = FSUTIL_ATOMIC_INIT;
  at(p, sizeof p, "out/model.bin");
  CHECK_OK(fsutil_atomic_open(p, 0600, &a));
  CHECK(!is_link("out/model.bin.tmp"));
  CHECK_OK(fsutil_write_full(a.fd, "new\n", 4, a.shown));
  CHECK_OK(fsutil_atomic_commit(&a));
  CHECK(!strcmp(get("victim"), "root's file\n"));
  CHECK(!is_link("out/model.bin") && !strcmp(get("out/model.bin"), "new\n"));
  CHECK(!exists("out/model.bin.tmp"));
  fsutil_atomic_abort(&a);   /* after commit: nothing */

  /* through a stream, into a directory given as a descriptor; abort leaves NAME as it was */
  int dfd = -1;
  at(p, sizeof p, "out");
  CHECK_OK(fsutil_dir_open(AT_FDCWD, p, 0, FSUTIL_TRUSTED_LINKS, &dfd));
  ln(victim, "out/config.json.tmp");
  CHECK_OK(fsutil_atomic_begin(dfd, p, "config.json", 0644, &a));
  FILE *f = fsutil_atomic_stream(&a);
  CHECK(f && fputs("{}\n", f) >= 0);
  CHECK(strstr(a.shown, "/out/config.json") != NULL);
  fsutil_atomic_abort(&a);
  CHECK(!exists("out/config.json") && !exists("out/config.json.tmp"));
  CHECK_OK(fsutil_atomic_begin(dfd, p, "config.json", 0644, &a));
  f = fsutil_atomic_stream(&a);
  CHECK(f && fputs("{}\n", f) >= 0);
  CHECK_OK(fsutil_atomic_commit(&a));
  CHECK(!strcmp(get("out/config.json"), "{}\n"));
  CHECK(!strcmp(get("victim"), "root's file\n"));
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_atomic_begin(dfd, p, "a/b", 0644, &a));
  fsutil_atomic_abort(&a);   /* after a failed begin: nothing */
  close(dfd);

  /* a directory path through a link that others could have planted: refused */
  char rd[512];
  at(rd, sizeof rd, "real");
  ln(rd, "out/dir");
  at(p, sizeof p, "out/dir/x.bin");
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_atomic_open(p, 0644, &a));
  CHECK(!exists("real/x.bin") && !exists("real/x.bin.tmp"));
}

static void test_open_append(void) {
  char p[512], victim[512];
  int fd = -1;
  at(victim, sizeof victim, "victim");
  ln(victim, "out/log");
  at(p, sizeof p, "out/log");
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_open_append(AT_FDCWD, p, p, 0644, &fd));
  CHECK(fd == -1 && strstr(fsdp_last_error(), "is a symbolic link") != NULL);
  at(p, sizeof p, "out/hard");
  CHECK(link(victim, p) == 0);
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_open_append(AT_FDCWD, p, p, 0644, &fd));
  at(p, sizeof p, "out/fifo");
  CHECK(mkfifo(p, 0600) == 0);
  CHECK_EQ_INT(FSDP_ERR_IO, fsutil_open_append(AT_FDCWD, p, p, 0644, &fd));   /* ENXIO, not a hang */
  CHECK(!strcmp(get("victim"), "root's file\n"));
  at(p, sizeof p, "out/real.log");
  CHECK_OK(fsutil_open_append(AT_FDCWD, p, p, 0644, &fd));
  CHECK(fd >= 0 && write(fd, "a\n", 2) == 2);
  if (fd >= 0) close(fd);
  CHECK_OK(fsutil_open_append(AT_FDCWD, p, p, 0644, &fd));
  CHECK(fd >= 0 && write(fd, "b\n", 2) == 2);
  if (fd >= 0) close(fd);
  CHECK(!strcmp(get("out/real.log"), "a\nb\n"));
}

static void test_remove(void) {
  char p[512], keep[512];
  mk("keep", 0755);
  put("keep/precious", "do not delete\n");
  at(keep, sizeof keep, "keep");
  mk("tree", 0755);
  mk("tree/step-00000001", 0755);
  put("tree/step-00000001/rank-0.bin", "x");
  ln(keep, "tree/step-00000001/link-to-keep");
  ln(keep, "tree/step-00000002");
  at(p, sizeof p, "tree");
  CHECK_OK(fsutil_remove_tree(p));
  CHECK(!exists("tree"));
  CHECK(!strcmp(get("keep/precious"), "do not delete\n"));
  /* a link given itself is removed as a link */
  ln(keep, "lnk");
  int dfd = -1;
  CHECK_OK(fsutil_dir_open(AT_FDCWD, base, 0, FSUTIL_TRUSTED_LINKS, &dfd));
  CHECK_OK(fsutil_remove_at(dfd, "lnk", "lnk"));
  CHECK_OK(fsutil_remove_at(dfd, "lnk", "lnk"));   /* missing: fine */
  close(dfd);
  CHECK(!exists("lnk") && !strcmp(get("keep/precious"), "do not delete\n"));
}

static void test_strict_modes(void) {
  char p[512];
  int fd = -1;
  mk("state", 0700);
  at(p, sizeof p, "state");
  fd = open(p, O_RDONLY | O_DIRECTORY);
  CHECK_OK(fsutil_check_private(fd, p));
  CHECK_OK(fsutil_check_parents(fd, p));   /* base is 0700 under /tmp (root's, sticky) */
  chmod(p, 0770);
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_check_private(fd, p));
  CHECK(strstr(fsdp_last_error(), "mode 0770") != NULL);
  chmod(p, 0702);
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_check_private(fd, p));
  chmod(p, 0700);
  if (geteuid() == 0) {
    CHECK(fchown(fd, NOBODY, NOBODY) == 0);
    CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_check_private(fd, p));
    CHECK(strstr(fsdp_last_error(), "uid 65534") != NULL);
    CHECK(fchown(fd, 0, 0) == 0);
  }
  close(fd);

  /* a parent writable by others without the sticky bit, then with it */
  mk("shared", 0777);
  mk("shared/state", 0700);
  at(p, sizeof p, "shared/state");
  fd = open(p, O_RDONLY | O_DIRECTORY);
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_check_parents(fd, p));
  CHECK(strstr(fsdp_last_error(), "/shared, above") != NULL);
  at(p, sizeof p, "shared");
  chmod(p, 01777);
  at(p, sizeof p, "shared/state");
  CHECK_OK(fsutil_check_parents(fd, p));
  close(fd);
}

static void test_open_read(void) {
  char p[512], q[512], *buf = NULL;
  size_t len = 0;
  int fd = -1;
  mk("rd", 0755);
  put("rd/secret", "TOPSECRET");
  put("rd/data", "hello");
  at(p, sizeof p, "rd/data");
  ln(p, "rd/mine");   /* the reader's own link: followed */
  at(q, sizeof q, "rd/mine");
  CHECK_OK(fsutil_read_all(AT_FDCWD, q, 100, &buf, &len));
  CHECK(len == 5 && !strcmp(buf, "hello"));
  free(buf);
  CHECK_EQ_INT(FSDP_ERR_RANGE, fsutil_read_all(AT_FDCWD, q, 4, &buf, &len));   /* over MAX */
  at(p, sizeof p, "rd/none");
  CHECK_EQ_INT(FSDP_ERR_NOTFOUND, fsutil_open_read(AT_FDCWD, p, &fd));
  CHECK(errno == ENOENT);
  at(p, sizeof p, "rd");
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_open_read(AT_FDCWD, p, &fd));   /* a directory */
  at(p, sizeof p, "rd/fifo");
  CHECK(mkfifo(p, 0600) == 0);
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_open_read(AT_FDCWD, p, &fd));   /* refused, never blocked on */
  CHECK(strstr(fsdp_last_error(), "not a regular file") != NULL);
  if (geteuid() != 0) return;
  /* another user's links, at the last component and along the path: refused, whatever they point at */
  at(p, sizeof p, "rd/secret");
  ln(p, "rd/theirs");
  at(q, sizeof q, "rd/theirs");
  CHECK(lchown(q, NOBODY, NOBODY) == 0);
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_read_all(AT_FDCWD, q, 100, &buf, &len));
  CHECK(strstr(fsdp_last_error(), "owned by uid 65534") != NULL || strstr(fsdp_last_error(), "(uid 65534)") != NULL);
  CHECK(strstr(fsdp_last_error(), "TOPSECRET") == NULL);
  at(p, sizeof p, "rd");
  ln(p, "rdlink");
  at(q, sizeof q, "rdlink");
  CHECK(lchown(q, NOBODY, NOBODY) == 0);
  at(q, sizeof q, "rdlink/data");
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_open_read(AT_FDCWD, q, &fd));
  CHECK(strstr(fsdp_last_error(), "rdlink is a symbolic link owned by") != NULL);
}

/* As root under fsutil_reads_own_tree: another user's file, or a file in another user's directory or
 * in a directory others can write, is refused; root's own is read. */
static void test_own_tree(void) {
  if (geteuid() != 0) return;
  char p[512];
  int fd = -1;
  mk("tree", 0755);
  mk("tree/bob", 0755);
  mk("tree/open", 0777);
  put("tree/root", "r");
  put("tree/bobs", "b");
  put("tree/bob/f", "b");
  put("tree/open/f", "o");
  at(p, sizeof p, "tree/bobs");
  CHECK(chown(p, NOBODY, NOBODY) == 0);
  at(p, sizeof p, "tree/bob");
  CHECK(chown(p, NOBODY, NOBODY) == 0);
  fsutil_reads_own_tree(1);
  at(p, sizeof p, "tree/root");
  CHECK_OK(fsutil_open_read(AT_FDCWD, p, &fd));
  close(fd);
  const char *refused[] = {"tree/bobs", "tree/bob/f", "tree/open/f"};
  const char *named[] = {"tree/bobs is owned by", "tree/bob is owned by", "tree/open is owned by root"};
  for (int i = 0; i < 3; i++) {
    at(p, sizeof p, refused[i]);
    CHECK_EQ_INT(FSDP_ERR_DENIED, fsutil_open_read(AT_FDCWD, p, &fd));
    CHECK(strstr(fsdp_last_error(), "fsdpctl reads only what root alone owns") != NULL);
    if (!strstr(fsdp_last_error(), named[i])) fprintf(stderr, "  got '%s', want '%s'\n", fsdp_last_error(), named[i]);
    CHECK(strstr(fsdp_last_error(), named[i]) != NULL);   /* the file or the directory that is at fault */
  }
  at(p, sizeof p, "tree/open/f");
  CHECK(chmod(p, 0646) == 0);   /* a file others can write, too */
  at(p, sizeof p, "tree");
  fd = open(p, O_RDONLY | O_DIRECTORY);
  CHECK_OK(fsutil_check_own_tree(fd, p));
  close(fd);
  at(p, sizeof p, "tree/open");
  fd = open(p, O_RDONLY | O_DIRECTORY);
  CHECK_EQ_INT(FSDP_ERR_DENIED, fsutil_check_own_tree(fd, p));
  close(fd);
  fsutil_reads_own_tree(0);
  at(p, sizeof p, "tree/bob/f");
  CHECK_OK(fsutil_open_read(AT_FDCWD, p, &fd));   /* without it, root reads as root */
  close(fd);
}

static void test_out(void) {
  char p[512];
  fsutil_out o;
  mk("out", 0755);
  at(p, sizeof p, "out/new");
  CHECK_OK(fsutil_out_dir(p, &o));
  CHECK_OK(fsutil_out_write(&o, "a.json", "{}", 2, 0644));
  CHECK_OK(fsutil_out_write(&o, "b.bin", "xy", 2, 0644));
  CHECK(!strcmp(get("out/new/a.json"), "{}"));
  fsutil_out_discard(&o);   /* a failure: the folder it created goes, with everything in it */
  CHECK(!exists("out/new"));
  CHECK(o.dirfd == -1 && o.parentfd == -1);
  CHECK_OK(fsutil_out_dir(p, &o));
  CHECK_OK(fsutil_out_write(&o, "a.json", "{}", 2, 0644));
  fsutil_out_close(&o);   /* success keeps it */
  CHECK(!strcmp(get("out/new/a.json"), "{}"));
  CHECK_EQ_INT(FSDP_ERR_INVALID, fsutil_out_dir(p, &o));   /* not empty */
  CHECK(strstr(fsdp_last_error(), "is not empty") != NULL);
  /* an existing directory (the one-file export's): only what was written goes; what was there stays */
  put("out/keep", "old");
  at(p, sizeof p, "out/x.bin");
  const char *name;
  CHECK_OK(fsutil_out_parent(p, &o, &name));
  CHECK(!strcmp(name, "x.bin"));
  CHECK_OK(fsutil_out_write(&o, name, "1", 1, 0644));
  fsutil_out_discard(&o);
  CHECK(!exists("out/x.bin") && !strcmp(get("out/keep"), "old") && exists("out/new/a.json"));
  /* the folder swapped for a link after it was opened: the writes land in the real folder, wherever
   * it was moved, and the discard removes neither the link nor what it points to */
  put("victim", "V");
  at(p, sizeof p, "out/swap");
  CHECK_OK(fsutil_out_dir(p, &o));
  char moved[512];
  at(moved, sizeof moved, "out/moved");
  CHECK(rename(p, moved) == 0);
  ln(base, "out/swap");
  CHECK_OK(fsutil_out_write(&o, "victim", "written", 7, 0644));
  CHECK(!strcmp(get("victim"), "V") && !strcmp(get("out/moved/victim"), "written"));
  fsutil_out_discard(&o);
  CHECK(is_link("out/swap") && !strcmp(get("victim"), "V") && !exists("out/moved/victim") && exists("out/moved"));
}

int main(void) {
  umask(022);
  if (!mkdtemp(base)) {
    perror("mkdtemp");
    return 1;
  }
  test_dir_open();
  test_parent_open();
  test_atomic_planted();
  test_open_append();
  test_remove();
  test_strict_modes();
  test_open_read();
  test_own_tree();
  test_out();
  CHECK_OK(fsutil_remove_tree(base));
  CHECK(access(base, F_OK) != 0);
  return check_done();
}

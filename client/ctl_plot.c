/* ctl_plot — `fsdpctl plot ID|METRICS.jsonl -o OUT.png`: a job's training curves as one PNG.
 *
 * Reads metrics.jsonl (the job directory that `status` names, or a path given directly: a file or
 * a job directory), and pipes a generated gnuplot script into gnuplot (Debian's gnuplot-nox; the
 * pngcairo terminal), with the data inline as datablocks, so no temporary file is written. Three
 * panels against step: loss (and val_loss where the job evaluates), learning rate, tokens/s.
 * gnuplot's own diagnostics go to a pipe and the first line becomes fsdpctl's one-line error.
 * Single-threaded; the gnuplot child is waited for before returning.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl.h"
#include "ctl_client.h"
#include "envknob.h"
#include "fsutil.h"
#include "wire.h"

#define PLOT_USAGE "plot ID|METRICS.jsonl -o OUT.png [--size WxH] [--ctl ENDPOINT]"

typedef struct point {
  double step, loss, lr, tps, val;
  int has_loss, has_val;   /* [eval] at_start's step 0 has val_loss only */
} point;

/* The rows of metrics.jsonl at PATH into *PTS (malloc'd); 0, or the exit status after one line. */
static int read_points(const char *path, point **pts, size_t *n) {
  *pts = NULL;
  *n = 0;
  int fd;
  if (fsutil_open_read(AT_FDCWD, path, &fd) != FSDP_OK)   /* no one else's link; as root, root's files only */
    return ctl_fail("plot: %s", fsdp_last_error());
  FILE *f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    return ctl_fail("plot: cannot open %s: %s", path, strerror(errno));
  }
  char *line = NULL;
  size_t cap = 0, alloc = 0, lineno = 0;
  ssize_t len;
  int rc = 0;
  while ((len = getline(&line, &cap, f)) > 0) {
    lineno++;
    if (line[0] == '\n') continue;
    json_error_t err;
    json_t *o = json_loads(line, 0, &err);
    json_t *step = o ? json_object_get(o, "step") : NULL, *loss = o ? json_object_get(o, "loss") : NULL;
    if (!json_is_number(step) || !(json_is_number(loss) || json_is_number(json_object_get(o, "val_loss")))) {
      json_decref(o);
      rc = ctl_fail("plot: %s:%zu: not a metrics.jsonl line (no step and loss)", path, lineno);
      break;
    }
    if (*n == alloc) {
      alloc = alloc ? 2 * alloc : 256;
      point *p = realloc(*pts, alloc * sizeof *p);
      if (!p) {
        json_decref(o);
        rc = ctl_fail("plot: out of memory reading %s", path);
        break;
      }
      *pts = p;
    }
    point *p = &(*pts)[(*n)++];
    p->step = json_number_value(step);
    p->has_loss = json_is_number(loss);
    p->loss = json_number_value(loss);
    p->lr = json_number_value(json_object_get(o, "lr"));
    p->tps = json_number_value(json_object_get(o, "tokens_per_s"));
    json_t *v = json_object_get(o, "val_loss");
    p->has_val = json_is_number(v);
    p->val = p->has_val ? json_number_value(v) : 0;
    json_decref(o);
  }
  free(line);
  fclose(f);
  if (rc) {
    free(*pts);
    *pts = NULL;
    *n = 0;
  }
  return rc;
}

/* gnuplot on PATH ($FSDP_GNUPLOT overrides); 0 when found. */
static int find_gnuplot(char *buf, size_t n) {
  const char *env = envknob_get(ENV_GNUPLOT);
  if (env) {
    snprintf(buf, n, "%s", env);
    return access(buf, X_OK) == 0 ? 0 : -1;
  }
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/usr/bin:/bin";
  for (const char *p = path; *p;) {
    size_t l = strcspn(p, ":");
    snprintf(buf, n, "%.*s/gnuplot", (int)l, p);
    if (l && access(buf, X_OK) == 0) return 0;
    p += l + (p[l] == ':');
  }
  return -1;
}

/* S as a gnuplot single-quoted string (a quote is doubled). */
static void put_quoted(FILE *f, const char *s) {
  fputc('\'', f);
  for (; *s; s++) {
    if (*s == '\'') fputc('\'', f);
    fputc(*s, f);
  }
  fputc('\'', f);
}

/* The whole gnuplot script: terminal, datablocks, three panels. */
static void write_script(FILE *f, const point *pts, size_t n, const char *out, int w, int h, const char *title) {
  fprintf(f, "set terminal pngcairo size %d,%d font 'sans,10' noenhanced\nset output ", w, h);
  put_quoted(f, out);
  fputs("\n$train << EOD\n", f);
  int nval = 0;
  for (size_t i = 0; i < n; i++) {
    if (pts[i].has_loss) fprintf(f, "%.17g %.17g %.17g %.17g\n", pts[i].step, pts[i].loss, pts[i].lr, pts[i].tps);
    nval += pts[i].has_val;
  }
  fputs("EOD\n", f);
  if (nval) {
    fputs("$val << EOD\n", f);
    for (size_t i = 0; i < n; i++)
      if (pts[i].has_val) fprintf(f, "%.17g %.17g\n", pts[i].step, pts[i].val);
    fputs("EOD\n", f);
  }
  fputs("set multiplot layout 3,1 title ", f);
  put_quoted(f, title);
  fputs("\nset grid\nset autoscale xfix\nset key top right\nset xlabel 'step'\nset lmargin 12\n", f);
  fputs("set ylabel 'loss'\nplot $train using 1:2 with lines lw 2 lc rgb '#1f77b4' title 'loss'", f);
  if (nval) fputs(", $val using 1:2 with linespoints pt 7 ps 0.8 lw 2 lc rgb '#d62728' title 'val_loss'", f);
  fputs("\nset ylabel 'learning rate'\nset format y '%.1e'\n"
        "plot $train using 1:3 with lines lw 2 lc rgb '#2ca02c' title 'lr'\n"
        "set ylabel 'tokens/s'\nset format y '%.0f'\nset yrange [0:*]\n"
        "plot $train using 1:4 with lines lw 1 lc rgb '#9467bd' title 'tokens/s'\n"
        "unset multiplot\nset output\n", f);
}

/* Run gnuplot with SCRIPT on its standard input; 0, or the exit status after one line. gnuplot
 * writes the image into OUT.tmp, which fsdpctl creates (O_EXCL | O_NOFOLLOW) and hands it as fd 3
 * (/proc/self/fd/3 reopens that very file, whatever is planted at a name), then renames over OUT. */
static int run_gnuplot(const char *gnuplot, const point *pts, size_t n, const char *out, int w, int h, const char *title) {
  int in[2], err[2];
  fsutil_atomic img = FSUTIL_ATOMIC_INIT;
  if (fsutil_atomic_open(out, 0644, &img) != FSDP_OK) return ctl_fail("plot: %s", fsdp_last_error());
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    fsutil_atomic_abort(&img);
    return ctl_fail("plot: pipe: %s", strerror(errno));
  }
  pid_t pid = fork();
  if (pid < 0) {
    fsutil_atomic_abort(&img);
    return ctl_fail("plot: fork: %s", strerror(errno));
  }
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(err[1], 1);
    dup2(err[1], 2);
    if (img.fd == 3) fcntl(3, F_SETFD, 0);   /* dup2 onto itself would keep O_CLOEXEC */
    else dup2(img.fd, 3);
    execl(gnuplot, "gnuplot", (char *)NULL);
    dprintf(2, "cannot run %s: %s\n", gnuplot, strerror(errno));
    _exit(127);
  }
  close(in[0]);
  close(err[1]);
  void (*old)(int) = signal(SIGPIPE, SIG_IGN);   /* a gnuplot that dies early must not kill us */
  FILE *f = fdopen(in[1], "w");
  if (f) {
    write_script(f, pts, n, "/proc/self/fd/3", w, h, title);
    fclose(f);
  } else {
    close(in[1]);
  }
  char msg[1024] = "";
  size_t got = 0;
  ssize_t r;
  while ((r = read(err[0], msg + got, sizeof msg - 1 - got)) > 0 && got < sizeof msg - 1) got += (size_t)r;
  msg[got] = '\0';
  char sink[4096];
  while (read(err[0], sink, sizeof sink) > 0) {}
  close(err[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  signal(SIGPIPE, old);
  /* gnuplot's message: its last non-empty line says what went wrong */
  char *last = NULL;
  for (char *tok = strtok(msg, "\n"); tok; tok = strtok(NULL, "\n"))
    if (strspn(tok, " \t^") < strlen(tok)) last = tok;
  struct stat sb;
  int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0, wrote = fstat(img.fd, &sb) == 0 && sb.st_size > 0;
  if (!ok || !wrote) {
    fsutil_atomic_abort(&img);
    if (!ok) return ctl_fail("plot: gnuplot failed%s%s", last ? ": " : "", last ? last : "");
    return ctl_fail("plot: gnuplot wrote no image to %s", out);
  }
  if (fsutil_atomic_commit(&img) != FSDP_OK) return ctl_fail("plot: %s", fsdp_last_error());
  return 0;
}

/* WxH into *W and *H (64..8192 each). */
static int parse_size(const char *s, int *w, int *h) {
  char *end;
  long a = strtol(s, &end, 10);
  if (end == s || (*end != 'x' && *end != 'X')) return -1;
  const char *t = end + 1;
  long b = strtol(t, &end, 10);
  if (end == t || *end || a < 64 || a > 8192 || b < 64 || b > 8192) return -1;
  *w = (int)a;
  *h = (int)b;
  return 0;
}

int ctl_plot(int argc, char **argv) {
  static const struct option opts[] = {
    {"output", required_argument, 0, 'o'}, {"size", required_argument, 0, 's'},
    {"ctl", required_argument, 0, OPT_CTL}, {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  fsutil_reads_own_tree(1);   /* run as root: root's own metrics only (docs/cli.md, "Run as root") */
  const char *out = NULL, *ctl = NULL;
  int w = 1000, h = 900, o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "o:", opts, NULL)) != -1) {
    switch (o) {
    case 'o': out = optarg; break;
    case 's':
      if (parse_size(optarg, &w, &h) != 0) return ctl_usage_error(argv[0], PLOT_USAGE, "--size takes WxH, each 64..8192 pixels");
      break;
    case OPT_CTL: ctl = optarg; break;
    case OPT_HELP:
      printf("usage: fsdpctl %s\n\nLoss (and val_loss when the job evaluates), learning rate and tokens/s against step,\n"
             "as a PNG drawn by gnuplot (Debian package gnuplot-nox). The argument is a job id (its\n"
             "metrics.jsonl is found through the daemon's status), a metrics.jsonl file, or a job directory.\n"
             "  -o, --output OUT.png   the image to write\n"
             "  --size WxH             its size in pixels (default 1000x900)\n"
             "  --ctl ENDPOINT         the daemon, for a job id (default $FSDP_CTL, or the state directory's)\n",
             PLOT_USAGE);
      return 0;
    default: return ctl_usage_error(argv[0], PLOT_USAGE, "unknown option");
    }
  }
  if (optind + 1 != argc) return ctl_usage_error(argv[0], PLOT_USAGE, "give one job id or metrics.jsonl path");
  if (!out || !*out) return ctl_usage_error(argv[0], PLOT_USAGE, "-o OUT.png is required");
  const char *arg = argv[optind];
  char path[PATH_MAX + 32], title[256];
  struct stat sb;
  if (stat(arg, &sb) == 0) {
    /* a path: a metrics.jsonl, or a job directory that holds one */
    snprintf(path, sizeof path, S_ISDIR(sb.st_mode) ? "%s/metrics.jsonl" : "%s", arg);
    snprintf(title, sizeof title, "%s", arg);
  } else if (strspn(arg, "0123456789") == strlen(arg) && *arg) {
    uint64_t id;
    int rc = ctl_parse_job_id(argv[0], PLOT_USAGE, arg, &id);
    if (rc) return rc;
    ctl_client cl;
    Fsdp__Msg *reply = NULL;
    if ((rc = ctl_client_open(&cl, ctl)) != 0) return rc;
    rc = ctl_client_status(&cl, id, &reply);
    ctl_client_close(&cl);
    if (rc) return rc;
    const Fsdp__JobInfo *j = reply->status_resp;
    if (!j->job_dir || !*j->job_dir) {
      wire_destroy(&reply);
      return ctl_fail("plot: job %llu has no steps yet (it has not started)", (unsigned long long)id);
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", j->job_dir);
    snprintf(title, sizeof title, "job %llu (%s)", (unsigned long long)id, j->name ? j->name : "");
    wire_destroy(&reply);
    if (stat(path, &sb) != 0) return ctl_fail("plot: job %llu has no steps yet (no %s)", (unsigned long long)id, path);
  } else {
    return ctl_fail("plot: %s is neither a job id nor an existing file", arg);
  }
  point *pts;
  size_t n;
  int rc = read_points(path, &pts, &n);
  if (rc) return rc;
  if (n == 0) {
    free(pts);
    return ctl_fail("plot: no steps yet in %s", path);
  }
  char gnuplot[PATH_MAX];
  if (find_gnuplot(gnuplot, sizeof gnuplot) != 0) {
    free(pts);
    return ctl_fail("plot: gnuplot is not installed (Debian: apt-get install gnuplot-nox; or set $FSDP_GNUPLOT)");
  }
  rc = run_gnuplot(gnuplot, pts, n, out, w, h, title);
  free(pts);
  if (rc == 0) printf("%s: %zu steps\n", out, n);
  return rc;
}

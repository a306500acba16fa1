/* ctl_top — `fsdpctl top [--interval S] [--once | -n N]`: a live view of the daemon's jobs and
 * nodes, like htop, that fits an 80×24 terminal (over ssh too).
 *
 * Every interval it asks the daemon for the job list (list), each running job's status (whose last
 * step carries every rank's memory by category and time split, as `fsdpctl status` shows) and the
 * nodes, and renders one frame of text lines: a header, a row per job (state, step, loss, tokens/s,
 * ETA), the selected running job's ranks (a memory bar by category, its peak, and the share of
 * all-gather wait, compute, reduce-scatter wait and optimizer in the step), and the nodes.
 *
 * On a terminal the frame is drawn with ncurses (the bar's categories in colour; q quits, ↑/↓ or
 * j/k select the job whose ranks are shown, the frame follows resizes); when standard output is not
 * a terminal, or with --once, the same frame is printed as plain lines (the bar as letters), every
 * interval, N times with -n (and on a terminal whose TERM curses does not know, after a line that says
 * so). Single-threaded; the curses screen is restored on every exit path.
 */
#include <curses.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "ctl_client.h"
#include "ctl_fmt.h"
#include "plan.h"
#include "stepstats.h"
#include "wire.h"

#define TOP_USAGE "top [--interval SECONDS] [--once | -n N] [--ctl ENDPOINT]"
#define TOP_LIST 50      /* jobs asked for: the running ones, then the newest */
#define TOP_MAXLINES 200
#define TOP_MAXCOLS 512
/* A call's deadline. list, status and nodes are answered at once by a live daemon; fsdpctl's usual
 * 30 s (sized for submit) would freeze the screen, and q, that long for each call of a poll when the
 * daemon wedges or goes away mid-poll. */
#define TOP_CALL_TIMEOUT_MS 5000

/* A memory bar's letters, one per category (plan.h's order), and their legend. */
static const char bar_letters[MEM_NCAT] = {'P', 'G', 'O', 'g', 'A', 'W', 'C'};
static const char *const bar_legend = "P param G grad O optim g gathered A act W wksp C comm";
static const char *const phase_short[4] = {"AG", "comp", "RS", "opt"};

/* One frame's data: the daemon's replies of one poll (owned). */
typedef struct frame {
  Fsdp__Msg *list, *nodes;
  Fsdp__Msg **status;        /* per list entry: its status reply when it runs, else NULL */
  size_t njobs;
  char err[512];             /* the poll failed: why (the frame shows it instead) */
} frame;

/* A rendered frame: lines, and where each one's memory bar starts (-1: none). */
typedef struct screen {
  char line[TOP_MAXLINES][TOP_MAXCOLS];
  int bar_at[TOP_MAXLINES], bar_len[TOP_MAXLINES];
  int n;
} screen;

static void frame_clear(frame *f) {
  wire_destroy(&f->list);
  wire_destroy(&f->nodes);
  for (size_t i = 0; f->status && i < f->njobs; i++) wire_destroy(&f->status[i]);
  free(f->status);
  memset(f, 0, sizeof *f);
}

/* One call: 0, or -1 with an error reply in ERR, or -2 when the daemon could not be asked or did not
 * answer within TOP_CALL_TIMEOUT_MS (or a signal came): then the rest of the poll is not tried. */
static int quiet_call(ctl_conn *c, Fsdp__Msg *req, Fsdp__Msg__BodyCase want, Fsdp__Msg **reply, char *err, size_t n,
                      const char *ep) {
  fsdp_status rc = ctl_conn_call(c, req, TOP_CALL_TIMEOUT_MS, reply);
  if (rc != FSDP_OK) {
    ctl_describe_failure(ep, rc, err, n);
    return -2;
  }
  if ((*reply)->body_case == want) return 0;
  snprintf(err, n, "%s", (*reply)->body_case == FSDP__MSG__BODY_ERROR ? (*reply)->error->message : "unexpected reply");
  wire_destroy(reply);
  return -1;
}

/* One poll: list, the running jobs' status, nodes. Failures are kept in f->err, not printed: the
 * screen says them and the next poll tries again. */
static void poll_daemon(ctl_conn *c, const char *ep, frame *f) {
  frame_clear(f);
  Fsdp__ListReq lq = FSDP__LIST_REQ__INIT;
  lq.limit = TOP_LIST;
  lq.running_first = 1;   /* a queue of newer jobs never hides the running ones */
  Fsdp__Msg req = WIRE_MSG_INIT;
  req.body_case = FSDP__MSG__BODY_LIST_REQ;
  req.list_req = &lq;
  if (quiet_call(c, &req, FSDP__MSG__BODY_LIST_RESP, &f->list, f->err, sizeof f->err, ep)) return;
  f->njobs = f->list->list_resp->n_jobs;
  f->status = calloc(f->njobs ? f->njobs : 1, sizeof *f->status);
  if (!f->status) {
    snprintf(f->err, sizeof f->err, "out of memory");
    return;
  }
  for (size_t i = 0; i < f->njobs; i++) {
    const Fsdp__JobInfo *j = f->list->list_resp->jobs[i];
    if (j->state != FSDP__JOB_STATE__RUNNING) continue;
    Fsdp__JobQuery q = FSDP__JOB_QUERY__INIT;
    q.job_id = j->id;
    Fsdp__Msg sr = WIRE_MSG_INIT;
    sr.body_case = FSDP__MSG__BODY_STATUS_REQ;
    sr.status_req = &q;
    char why[512];   /* an error reply: a job that ended meanwhile, whose row says so next time */
    if (quiet_call(c, &sr, FSDP__MSG__BODY_STATUS_RESP, &f->status[i], why, sizeof why, ep) == -2) {
      snprintf(f->err, sizeof f->err, "%s", why);   /* the daemon is gone or wedged: the next poll tries again */
      return;
    }
  }
  if (ctl_interrupts) return;
  Fsdp__NodesReq nq = FSDP__NODES_REQ__INIT;
  Fsdp__Msg nr = WIRE_MSG_INIT;
  nr.body_case = FSDP__MSG__BODY_NODES_REQ;
  nr.nodes_req = &nq;
  quiet_call(c, &nr, FSDP__MSG__BODY_NODES_RESP, &f->nodes, f->err, sizeof f->err, ep);
}

static int add(screen *s, int cols, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int add(screen *s, int cols, const char *fmt, ...) {
  if (s->n >= TOP_MAXLINES) return -1;
  va_list ap;
  va_start(ap, fmt);
  int w = cols < TOP_MAXCOLS ? cols + 1 : TOP_MAXCOLS;
  vsnprintf(s->line[s->n], (size_t)w, fmt, ap);
  va_end(ap);
  s->bar_at[s->n] = -1;
  return s->n++;
}

/* The running jobs of F, in list order: index into the list. */
static size_t running(const frame *f, size_t *idx, size_t max) {
  size_t k = 0;
  for (size_t i = 0; i < f->njobs && k < max; i++)
    if (f->status[i]) idx[k++] = i;
  return k;
}

/* WIDTH letters: each category's share of TOTAL_SCALE (the job's largest rank total), '.' beyond. */
static void mem_bar(const Fsdp__RankStats *r, uint64_t scale, int width, char *out) {
  int k = 0;
  double acc = 0;
  for (int c = 0; c < MEM_NCAT && r->n_peak_bytes == MEM_NCAT; c++) {
    acc += (double)r->peak_bytes[c];
    int upto = scale ? (int)lround(acc / (double)scale * width) : 0;
    while (k < upto && k < width) out[k++] = bar_letters[c];
  }
  while (k < width) out[k++] = '.';
  out[k] = '\0';
}

/* A job with more ranks than one step's lines carry (steps.h): its figures over all ranks, one line
 * per memory category and phase: min (rank) / median / max (rank). */
static void render_agg(screen *s, int cols, int rows_left, const Fsdp__JobInfo *j) {
  const Fsdp__StepSummary *st = j->last;
  const Fsdp__StepAgg *a = st->agg;
  add(s, cols, "job %llu, step %u over %u ranks (slowest: rank %u):  min (rank) / median / max (rank)", (unsigned long long)j->id,
      st->step, a->ranks, st->step_ms_rank);
  int shown = 1;
  for (size_t i = 0; i < a->n_min && i < 2 * MEM_NCAT + STEPSTATS_NPHASE && shown < rows_left; i++) {
    if (!a->count[i] || (i >= MEM_NCAT && i < 2 * MEM_NCAT)) continue;   /* peaks and phases only */
    const char *group, *key;
    stepstats_figure_name(a, i, &group, &key);
    char mn[32], md[32], mx[32];
    if (i < MEM_NCAT) {
      ctl_fmt_bytes(a->min[i], mn, sizeof mn), ctl_fmt_bytes(i < a->n_median ? a->median[i] : 0, md, sizeof md);
      ctl_fmt_bytes(a->max[i], mx, sizeof mx);
    } else {
      snprintf(mn, sizeof mn, "%.2f ms", (double)a->min[i] / 1e3);
      snprintf(md, sizeof md, "%.2f ms", (double)(i < a->n_median ? a->median[i] : 0) / 1e3);
      snprintf(mx, sizeof mx, "%.2f ms", (double)a->max[i] / 1e3);
    }
    add(s, cols, "  %-5s %-13s %10s (%u) %10s %10s (%u)", i < MEM_NCAT ? "peak" : "time", key, mn, a->min_rank[i], md, mx,
        a->max_rank[i]);
    shown++;
  }
}

static void render_ranks(screen *s, int cols, int rows_left, const Fsdp__JobInfo *j) {
  const Fsdp__StepSummary *st = j->last;
  if (st && st->agg && (st->n_ranks == 0 || st->n_ranks > CTL_FMT_RANKS_MAX)) {
    render_agg(s, cols, rows_left, j);
    return;
  }
  if (!st || st->n_ranks == 0) {
    add(s, cols, "job %llu: no step reported yet", (unsigned long long)j->id);
    return;
  }
  add(s, cols, "job %llu, step %u:  %s", (unsigned long long)j->id, st->step, bar_legend);
  int barw = cols - 48;
  if (barw > 40) barw = 40;
  if (barw < 8) barw = 8;
  add(s, cols, "%4s %-*s %9s %5s %5s %5s %5s", "RANK", barw + 2, "MEMORY (peak, by category)", "PEAK", phase_short[0],
      phase_short[1], phase_short[2], phase_short[3]);
  uint64_t scale = 0;
  for (size_t r = 0; r < st->n_ranks; r++) {
    uint64_t t = 0;
    for (size_t c = 0; c < st->ranks[r]->n_peak_bytes; c++) t += st->ranks[r]->peak_bytes[c];
    if (t > scale) scale = t;
  }
  int room = rows_left - 2 < 1 ? 1 : rows_left - 2;   /* lines for ranks, after the two above */
  int shown = 0;
  for (size_t r = 0; r < st->n_ranks; r++) {
    if (shown == room - 1 && r + 1 < st->n_ranks) {
      add(s, cols, "  ... %zu more ranks (fsdpctl status %llu)", st->n_ranks - r, (unsigned long long)j->id);
      break;
    }
    const Fsdp__RankStats *rk = st->ranks[r];
    char bar[64], peak[32];
    uint64_t t = 0, ph = 0;
    for (size_t c = 0; c < rk->n_peak_bytes; c++) t += rk->peak_bytes[c];
    for (size_t i = 0; i < rk->n_phase_us; i++) ph += rk->phase_us[i];
    mem_bar(rk, scale, barw, bar);
    double pct[4] = {0};
    for (size_t i = 0; i < 4 && i < rk->n_phase_us; i++) pct[i] = ph ? 100.0 * (double)rk->phase_us[i] / (double)ph : 0;
    int ln = add(s, cols, "%4u [%s] %9s %4.0f%% %4.0f%% %4.0f%% %4.0f%%", rk->rank, bar,
                 ctl_fmt_bytes(t, peak, sizeof peak), pct[0], pct[1], pct[2], pct[3]);
    if (ln >= 0) s->bar_at[ln] = 6, s->bar_len[ln] = barw;
    shown++;
  }
}

static void render_nodes(screen *s, int cols, int rows_left, const frame *f) {
  if (!f->nodes || rows_left < 2) return;
  const Fsdp__NodesResp *nr = f->nodes->nodes_resp;
  add(s, cols, "%4s %-20s %-6s %s", "NODE", "NAME", "STATE", "DEVICES (busy: job/rank)");
  for (size_t i = 0; i < nr->n_nodes && (int)i < rows_left - 1; i++) {
    const Fsdp__NodeInfo *n = nr->nodes[i];
    char dev[256];
    size_t k = 0, busy = 0;
    for (size_t d = 0; d < n->n_slots; d++) busy += n->slots[d]->job_id != 0;
    k += (size_t)snprintf(dev, sizeof dev, "%zu %s, %zu busy", n->n_slots,
                          n->n_slots ? ctl_fmt_device(n->slots[0]->kind) : "-", busy);
    for (size_t d = 0; d < n->n_slots && k < sizeof dev - 24; d++)
      if (n->slots[d]->job_id)
        k += (size_t)snprintf(dev + k, sizeof dev - k, " %llu/%u", (unsigned long long)n->slots[d]->job_id,
                              n->slots[d]->rank);
    add(s, cols, "%4u %-20.20s %-6s %s", n->id, n->name, n->stopped ? "stopped" : n->lost ? "lost" : "up", dev);
  }
}

/* The frame as lines for a COLS×ROWS screen; SEL picks the running job whose ranks are shown. */
static void render(const frame *f, const char *ep, int cols, int rows, size_t sel, int interactive, screen *s) {
  s->n = 0;
  if (cols > TOP_MAXCOLS - 1) cols = TOP_MAXCOLS - 1;
  if (rows > TOP_MAXLINES) rows = TOP_MAXLINES;
  time_t now = time(NULL);
  char clock[16];
  strftime(clock, sizeof clock, "%H:%M:%S", localtime(&now));
  const Fsdp__ListResp *lr = f->list ? f->list->list_resp : NULL;
  if (lr && lr->n_state_jobs > FSDP__JOB_STATE__RUNNING) {   /* the daemon's counts: every job, not the listed ones */
    uint32_t *k = lr->state_jobs;
    add(s, cols, "fsdpctl top  %s  %u running  %u starting  %u queued  %s", clock, k[FSDP__JOB_STATE__RUNNING],
        k[FSDP__JOB_STATE__STARTING], k[FSDP__JOB_STATE__QUEUED], ep);
  } else {   /* an older daemon: what the list shows */
    int nrun = 0;
    for (size_t i = 0; i < f->njobs; i++) nrun += f->status[i] != NULL;
    add(s, cols, "fsdpctl top  %s  %d running  %s", clock, nrun, ep);
  }
  if (f->err[0]) add(s, cols, "! %s", f->err);
  add(s, cols, "%5s %-14s %-9s %11s %8s %8s %8s %8s", "JOB", "NAME", "STATE", "STEP", "LOSS", "TOK/S", "ETA", "TRAIN/S");
  size_t idx[TOP_LIST];
  size_t nr = running(f, idx, TOP_LIST);
  if (sel >= nr) sel = nr ? nr - 1 : 0;
  int job_rows = rows / 3 < 3 ? 3 : rows / 3;
  for (size_t i = 0, shown = 0; f->list && i < f->njobs && (int)shown < job_rows; i++, shown++) {
    const Fsdp__JobInfo *j = f->status[i] ? f->status[i]->status_resp : f->list->list_resp->jobs[i];
    char step[32], loss[32], tps[32], eta[32], trained[32];
    snprintf(step, sizeof step, "%u/%u", j->step, j->steps);
    /* the trained tokens' rate (masked data: the loss's tokens, apart from TOK/S's every position) */
    if (j->last && j->last->trained_tokens_per_s > 0) ctl_fmt_si(j->last->trained_tokens_per_s, trained, sizeof trained);
    else snprintf(trained, sizeof trained, "-");
    if (j->step > 0 && isfinite(j->loss)) snprintf(loss, sizeof loss, "%.4f", j->loss);
    else snprintf(loss, sizeof loss, "-");
    if (j->tokens_per_s > 0) ctl_fmt_si(j->tokens_per_s, tps, sizeof tps);
    else snprintf(tps, sizeof tps, "-");
    if (j->state == FSDP__JOB_STATE__RUNNING && j->started_at > 0)
      ctl_fmt_duration(ctl_fmt_eta(j->step, j->steps, j->start_step, ctl_wall_now() - j->started_at), eta, sizeof eta);
    else snprintf(eta, sizeof eta, "-");
    int mark = nr && f->status[i] && idx[sel] == i;
    add(s, cols, "%c%4llu %-14.14s %-9s %11s %8s %8s %8s %8s", mark ? '>' : ' ', (unsigned long long)j->id,
        j->name ? j->name : "", ctl_fmt_state(j->state), step, loss, tps, eta, trained);
  }
  if (f->njobs == 0 && !f->err[0]) add(s, cols, "  no jobs");
  int foot = interactive ? 1 : 0;
  int nodes_rows = f->nodes ? (int)f->nodes->nodes_resp->n_nodes + 2 : 0;
  if (nodes_rows > 4) nodes_rows = 4;
  if (nr) {
    add(s, cols, "%s", "");
    render_ranks(s, cols, rows - s->n - nodes_rows - foot, f->status[idx[sel]]->status_resp);
  }
  add(s, cols, "%s", "");
  render_nodes(s, cols, rows - s->n - foot, f);
  if (interactive) {
    while (s->n < rows - 1) add(s, cols, "%s", "");
    add(s, cols, "%s", "q quit   up/down or j/k: the job whose ranks are shown");
  }
}

/* ---- output ---- */

static void print_plain(const screen *s) {
  for (int i = 0; i < s->n; i++) {
    size_t l = strlen(s->line[i]);
    while (l && s->line[i][l - 1] == ' ') l--;
    printf("%.*s\n", (int)l, s->line[i]);
  }
  fflush(stdout);
}

static void draw_curses(const screen *s, int rows) {
  erase();
  for (int i = 0; i < s->n && i < rows; i++) {
    mvaddstr(i, 0, s->line[i]);
    if (s->bar_at[i] < 0 || !has_colors()) continue;
    for (int k = 0; k < s->bar_len[i]; k++) {
      const char *p = memchr(bar_letters, s->line[i][s->bar_at[i] + k], MEM_NCAT);
      if (p) mvchgat(i, s->bar_at[i] + k, 1, A_REVERSE, (short)(1 + (p - bar_letters)), NULL);
    }
  }
  refresh();
}

#define TOP_NO_TERMINAL (-1)   /* run_curses: curses knows no such terminal (TERM); nothing was drawn */

static int run_curses(ctl_conn *c, const char *ep, int interval_ms) {
  /* newterm, not initscr: initscr prints "Error opening terminal" and exits when TERM has no terminfo
   * entry here (ssh from a terminal whose entry the server lacks); the caller falls back to plain lines */
  SCREEN *scr = newterm(NULL, stdout, stdin);
  if (!scr) return TOP_NO_TERMINAL;
  cbreak();
  noecho();
  keypad(stdscr, TRUE);
  curs_set(0);
  if (has_colors()) {
    start_color();
    use_default_colors();
    static const short fg[MEM_NCAT] = {COLOR_BLUE, COLOR_CYAN, COLOR_MAGENTA, COLOR_GREEN, COLOR_YELLOW, COLOR_WHITE, COLOR_RED};
    for (int k = 0; k < MEM_NCAT; k++) init_pair((short)(1 + k), fg[k], -1);
  }
  frame f = {0};
  screen *s = calloc(1, sizeof *s);
  size_t sel = 0;
  int quit = 0;
  while (s && !quit && !ctl_interrupts) {
    poll_daemon(c, ep, &f);
    int rows, cols;
    getmaxyx(stdscr, rows, cols);
    render(&f, ep, cols, rows, sel, 1, s);
    draw_curses(s, rows);
    /* keys until the next poll: a key redraws at once, q quits */
    double next = ctl_mono_ms() + interval_ms;
    for (double left; !quit && !ctl_interrupts && (left = next - ctl_mono_ms()) > 0;) {
      timeout((int)left + 1);
      int ch = getch();
      if (ch == ERR) continue;
      if (ch == 'q' || ch == 'Q') quit = 1;
      else if ((ch == KEY_DOWN || ch == 'j') && sel + 1 < TOP_LIST) sel++;
      else if ((ch == KEY_UP || ch == 'k') && sel > 0) sel--;
      else if (ch != KEY_RESIZE) continue;
      getmaxyx(stdscr, rows, cols);
      size_t idx[TOP_LIST];
      size_t nr = running(&f, idx, TOP_LIST);
      if (sel >= nr) sel = nr ? nr - 1 : 0;
      render(&f, ep, cols, rows, sel, 1, s);
      draw_curses(s, rows);
    }
  }
  endwin();
  delscreen(scr);
  frame_clear(&f);
  free(s);
  if (!s) return ctl_fail("top: out of memory");
  return ctl_interrupts && !quit ? EXIT_CANCELLED : 0;
}

static int run_plain(ctl_conn *c, const char *ep, int interval_ms, long count) {
  frame f = {0};
  screen *s = calloc(1, sizeof *s);
  if (!s) return ctl_fail("top: out of memory");
  int rc = 0;
  for (long i = 0; (count <= 0 || i < count) && !ctl_interrupts; i++) {
    if (i > 0) {
      ctl_pause_ms(interval_ms);
      printf("\n");
    }
    poll_daemon(c, ep, &f);
    render(&f, ep, 80, TOP_MAXLINES, 0, 0, s);   /* no terminal: every rank and node */
    print_plain(s);
    if (f.err[0] && count > 0 && i == count - 1) rc = ctl_fail("top: %s", f.err);   /* the last frame missed the daemon */
  }
  frame_clear(&f);
  free(s);
  return rc ? rc : ctl_interrupts ? EXIT_CANCELLED : 0;
}

int ctl_top(int argc, char **argv) {
  static const struct option opts[] = {
    {"interval", required_argument, 0, 'i'}, {"once", no_argument, 0, '1'}, {"iterations", required_argument, 0, 'n'},
    {"ctl", required_argument, 0, OPT_CTL}, {"help", no_argument, 0, OPT_HELP}, {0, 0, 0, 0}};
  const char *ctl = NULL;
  double interval = 1.0;
  long count = 0;
  int once = 0, o;
  opterr = 0;
  optind = 1;
  while ((o = getopt_long(argc, argv, "n:", opts, NULL)) != -1) {
    char *end;
    switch (o) {
    case 'i':
      interval = strtod(optarg, &end);
      if (*end || end == optarg || !(interval >= 0.1) || interval > 3600)
        return ctl_usage_error(argv[0], TOP_USAGE, "--interval takes seconds in 0.1..3600");
      break;
    case '1': once = 1; break;
    case 'n':
      count = strtol(optarg, &end, 10);
      if (*end || end == optarg || count < 1 || count > 1000000)
        return ctl_usage_error(argv[0], TOP_USAGE, "-n takes a number of frames, 1..1000000");
      break;
    case OPT_CTL: ctl = optarg; break;
    case OPT_HELP:
      printf("usage: fsdpctl %s\n\nA live view of the daemon's jobs (state, step, loss, tokens/s, ETA), the ranks of the\n"
             "selected running job (a memory bar by category and the time split: all-gather wait, compute,\n"
             "reduce-scatter wait, optimizer) and the nodes. On a terminal: q quits, up/down or j/k select\n"
             "a job. Not on a terminal (or with --once): plain lines, one frame every interval.\n"
             "  --interval SECONDS   between polls (default 1)\n"
             "  --once               print one frame as plain lines and exit (as -n 1)\n"
             "  -n, --iterations N   print N frames as plain lines and exit (status 1 when the last could not\n"
             "                       reach the daemon)\n"
             "  --ctl ENDPOINT       the daemon (default $FSDP_CTL, or the state directory's)\n",
             TOP_USAGE);
      return 0;
    default: return ctl_usage_error(argv[0], TOP_USAGE, "unknown option");
    }
  }
  if (optind != argc) return ctl_usage_error(argv[0], TOP_USAGE, "top takes no arguments");
  if (once) count = 1;
  ctl_client cl;
  int rc = ctl_client_open(&cl, ctl);
  if (rc) return rc;
  ctl_catch_interrupts();
  int interval_ms = (int)(interval * 1000);
  rc = TOP_NO_TERMINAL;
  if (count == 0 && isatty(STDOUT_FILENO) && isatty(STDIN_FILENO)) {
    rc = run_curses(cl.conn, cl.endpoint, interval_ms);
    if (rc == TOP_NO_TERMINAL) {
      const char *term = getenv("TERM");
      fprintf(stderr, "fsdpctl: top: TERM=%s is not a terminal type known here (no terminfo entry): plain frames "
              "instead; set TERM (e.g. TERM=xterm-256color) for the live view\n", term ? term : "");
    }
  }
  if (rc == TOP_NO_TERMINAL) rc = run_plain(cl.conn, cl.endpoint, interval_ms, count);
  ctl_client_close(&cl);
  return rc;
}

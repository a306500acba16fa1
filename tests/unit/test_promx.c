/* test_promx — the Prometheus exposition (promx) and its HTTP server (metricsrv): counters summed
 * over steps, gauges from the latest step, MFU only with a known peak, label escaping, the state
 * series, finished jobs kept then expired; --metrics values parsed or refused; a publish served
 * over a real loopback socket, 404 elsewhere, and a second bind of the same port refused.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "coord_core.h"
#include "job_priv.h"   /* jobs built by hand */
#include "metricsrv.h"
#include "promx.h"

static Fsdp__StepReport *report(uint32_t step, double loss, uint64_t peak0, uint64_t phase_us) {
  Fsdp__StepReport *r = calloc(1, sizeof *r);
  Fsdp__RankStats *s = calloc(1, sizeof *s);
  fsdp__step_report__init(r);
  fsdp__rank_stats__init(s);
  r->step = step, r->loss = loss, r->tokens = 1000, r->step_ms = 100, r->stats = s;
  s->n_peak_bytes = MEM_NCAT, s->peak_bytes = calloc(MEM_NCAT, sizeof(uint64_t));
  s->peak_bytes[0] = peak0;
  s->n_phase_us = STEPSTATS_NPHASE, s->phase_us = calloc(STEPSTATS_NPHASE, sizeof(uint64_t));
  for (int i = 0; i < STEPSTATS_NPHASE; i++) s->phase_us[i] = phase_us;
  s->n_sent_bytes = COLL_NKIND, s->sent_bytes = calloc(COLL_NKIND, sizeof(uint64_t));
  s->sent_bytes[0] = 4096;
  return r;
}

static void report_free(Fsdp__StepReport *r) {
  free(r->stats->peak_bytes), free(r->stats->phase_us), free(r->stats->sent_bytes), free(r->stats), free(r);
}

/* The value of the exact series S in TEXT, or -1. */
static double value(const char *text, const char *s) {
  size_t n = strlen(s);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (!strncmp(p, s, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
  return -1;
}

/* GET PATH from 127.0.0.1:PORT; the whole answer (headers and body), malloc'd. */
static char *http_get(int port, const char *path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) return close(fd), NULL;
  char req[256];
  int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", path);
  if (write(fd, req, (size_t)n) != n) return close(fd), NULL;
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  ssize_t r;
  while ((r = read(fd, buf + len, cap - 1 - len)) > 0) len += (size_t)r;
  buf[len] = '\0';
  close(fd);
  return buf;
}

static int bound_port(void) {   /* a port the kernel says is free now */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t l = sizeof a;
  bind(fd, (struct sockaddr *)&a, sizeof a);
  getsockname(fd, (struct sockaddr *)&a, &l);
  close(fd);
  return ntohs(a.sin_port);
}

int main(void) {
  /* two steps of a 2-rank job: counters add up, gauges follow the latest step */
  coord_t c;
  memset(&c, 0, sizeof c);
  job_t j;
  memset(&j, 0, sizeof j);
  j.id = 7;
  c.jobs = &j;
  Fsdp__StepReport *s1[2] = {report(1, 5.5, 100, 1000000), report(1, 5.5, 200, 2000000)};
  Fsdp__StepReport *s2[2] = {report(2, 4.25, 300, 500000), report(2, 4.25, 400, 500000)};
  Fsdp__RankStats *r1[2] = {s1[0]->stats, s1[1]->stats}, *r2[2] = {s2[0]->stats, s2[1]->stats};
  Fsdp__StepSummary sum = FSDP__STEP_SUMMARY__INIT;
  sum.step = 1, sum.loss = 5.5, sum.tokens = 1000, sum.tokens_per_s = 10000, sum.ranks = r1, sum.n_ranks = 2;
  CHECK_OK(promx_on_step(&j.sv.px, 7, "my \"job\"\\x", ST_RUNNING, &sum, 2, 0, 0));
  sum.step = 2, sum.loss = 4.25, sum.has_val = 1, sum.val_loss = 4.5, sum.ranks = r2;
  CHECK_OK(promx_on_step(&j.sv.px, 7, "my \"job\"\\x", ST_RUNNING, &sum, 2, 6e6, 1e12));
  char *t;
  size_t len;
  CHECK_OK(job_render_metrics(&c, &t, &len));
  CHECK_EQ_INT(strlen(t), len);
  const char *lab = "{job=\"7\",name=\"my \\\"job\\\"\\\\x\"}";
  char s[256];
  snprintf(s, sizeof s, "fsdp_job_loss%s", lab);
  CHECK_NEAR(4.25, value(t, s), 0, 0);
  snprintf(s, sizeof s, "fsdp_job_step%s", lab);
  CHECK_NEAR(2, value(t, s), 0, 0);
  snprintf(s, sizeof s, "fsdp_job_val_loss%s", lab);
  CHECK_NEAR(4.5, value(t, s), 0, 0);
  snprintf(s, sizeof s, "fsdp_job_mfu%s", lab);
  CHECK_NEAR(6e6 * 10000 / 1e12, value(t, s), 0, 1e-12);
  snprintf(s, sizeof s, "fsdp_job_tokens_total%s", lab);
  CHECK_NEAR(2000, value(t, s), 0, 0);
  CHECK_NEAR(2.5, value(t, "fsdp_rank_phase_seconds_total{job=\"7\",rank=\"1\",phase=\"compute\"}"), 0, 1e-12);
  CHECK_NEAR(8192, value(t, "fsdp_rank_sent_bytes_total{job=\"7\",rank=\"0\",collective=\"allgather\"}"), 0, 0);
  CHECK_NEAR(400, value(t, "fsdp_rank_memory_peak_bytes{job=\"7\",rank=\"1\",category=\"param_shard\"}"), 0, 0);
  snprintf(s, sizeof s, "fsdp_job_state{job=\"7\",name=\"my \\\"job\\\"\\\\x\",state=\"running\"}");
  CHECK_NEAR(1, value(t, s), 0, 0);
  snprintf(s, sizeof s, "fsdp_job_state{job=\"7\",name=\"my \\\"job\\\"\\\\x\",state=\"queued\"}");
  CHECK_NEAR(0, value(t, s), 0, 0);
  CHECK(strstr(t, "# TYPE fsdp_rank_phase_seconds_total counter\n") != NULL);
  CHECK(strstr(t, "# TYPE fsdp_job_loss gauge\n") != NULL);
  free(t);
  /* no peak known (a CPU job): no MFU series */
  CHECK_OK(promx_on_step(&j.sv.px, 7, "cpu", ST_RUNNING, &sum, 2, 6e6, 0));
  CHECK_OK(job_render_metrics(&c, &t, &len));
  CHECK(strstr(t, "fsdp_job_mfu{") == NULL);
  free(t);
  CHECK(promx_peak_flops("NVIDIA H100 80GB HBM3") > 9e14);
  CHECK(promx_peak_flops("cpu") == 0);

  /* retired: still rendered from the finished list, then expired after PROMX_KEEP_S */
  c.jobs = NULL;
  promx_retire(&c.px_done, &j.sv.px, 100.0);
  CHECK(j.sv.px == NULL);
  CHECK_OK(job_render_metrics(&c, &t, &len));
  CHECK_NEAR(2.0, value(t, "fsdp_rank_phase_seconds_total{job=\"7\",rank=\"0\",phase=\"allgather\"}"), 0, 1e-12);
  free(t);
  promx_expire(&c.px_done, 100.0 + PROMX_KEEP_S + 1);
  CHECK(c.px_done == NULL);
  for (int r = 0; r < 2; r++) report_free(s1[r]), report_free(s2[r]);

  /* --metrics values */
  char host[64];
  int port = 0;
  CHECK_OK(metricsrv_parse("9100", host, sizeof host, &port));
  CHECK(!strcmp(host, "127.0.0.1") && port == 9100);
  CHECK_OK(metricsrv_parse(":9101", host, sizeof host, &port));
  CHECK(!strcmp(host, "127.0.0.1") && port == 9101);
  CHECK_OK(metricsrv_parse("0.0.0.0:80", host, sizeof host, &port));
  CHECK(!strcmp(host, "0.0.0.0") && port == 80);
  CHECK_OK(metricsrv_parse("[::1]:9102", host, sizeof host, &port));
  CHECK(!strcmp(host, "::1") && port == 9102);
  const char *bad[] = {"", "x", ":0", "h:65536", "h:", "[::1]", "[]:80", "1:2x"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) CHECK_EQ_INT(FSDP_ERR_INVALID, metricsrv_parse(bad[i], host, sizeof host, &port));

  /* a real server: what was published is served; a second bind of the port is refused */
  metricsrv_t *m = NULL, *m2 = NULL;
  port = bound_port();
  CHECK_OK(metricsrv_bind("127.0.0.1", port, &m));
  CHECK_EQ_INT(FSDP_ERR_IO, metricsrv_bind("127.0.0.1", port, &m2));
  CHECK(strstr(fsdp_last_error(), "already in use") != NULL);
  if (m) {
    CHECK_OK(metricsrv_start(m));
    CHECK_OK(metricsrv_publish(m, "fsdp_x 1\n", 9));
    char *a = http_get(port, "/metrics");
    CHECK(a && strstr(a, " 200 ") && strstr(a, "text/plain; version=0.0.4") && strstr(a, "\r\n\r\nfsdp_x 1\n"));
    free(a);
    CHECK_OK(metricsrv_publish(m, "fsdp_x 2\n", 9));
    a = http_get(port, "/metrics");
    CHECK(a && strstr(a, "\r\n\r\nfsdp_x 2\n"));
    free(a);
    a = http_get(port, "/other");
    CHECK(a && strstr(a, " 404 "));
    free(a);
  }
  metricsrv_destroy(&m);
  CHECK(m == NULL);
  return check_done();
}

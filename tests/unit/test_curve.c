/* test_curve — CURVE key files (write, load, permissions, '#' in keys), the daemon's server keys
 * (created once, then reused), the authorized list, the no-plaintext rule for tcp:// clients, and
 * a real CURVE exchange over tcp://127.0.0.1 (the right server key talks; a wrong one never does). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "check.h"
#include "curve.h"

static char dir[] = "/tmp/test-curve-XXXXXX";

static void path(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", dir, name); }

static void write_text(const char *p, const char *text, mode_t mode) {
  FILE *f = fopen(p, "w");
  fputs(text, f);
  fclose(f);
  chmod(p, mode);
}

static void test_keypair_files(void) {
  char pub[CURVE_KEY_LEN + 1], sec[CURVE_KEY_LEN + 1], p2[CURVE_KEY_LEN + 1], s2[CURVE_KEY_LEN + 1];
  char kp[512];
  path(kp, sizeof kp, "client.key");
  CHECK_OK(curve_keypair_new(pub, sec));
  CHECK_EQ_INT(CURVE_KEY_LEN, (int)strlen(pub));
  CHECK_OK(curve_keypair_write(kp, pub, sec));
  struct stat st;
  CHECK(stat(kp, &st) == 0 && (st.st_mode & 0777) == 0600);
  CHECK_OK(curve_keypair_load(kp, p2, s2));
  CHECK(!strcmp(pub, p2) && !strcmp(sec, s2));
  /* never overwritten */
  char q[CURVE_KEY_LEN + 1], r[CURVE_KEY_LEN + 1];
  CHECK_OK(curve_keypair_new(q, r));
  CHECK_EQ_INT(FSDP_ERR_STATE, curve_keypair_write(kp, q, r));
  CHECK_OK(curve_keypair_load(kp, p2, s2));
  CHECK(!strcmp(pub, p2));
  /* readable by others: refused */
  chmod(kp, 0640);
  CHECK_EQ_INT(FSDP_ERR_INVALID, curve_keypair_load(kp, p2, s2));
  CHECK(strstr(fsdp_last_error(), "chmod 600") != NULL);
  chmod(kp, 0600);
  /* a public key that is not the secret key's */
  char bad[512], text[256];
  path(bad, sizeof bad, "mismatch.key");
  snprintf(text, sizeof text, "%s\n%s\n", q, sec);
  write_text(bad, text, 0600);
  CHECK_EQ_INT(FSDP_ERR_FORMAT, curve_keypair_load(bad, p2, s2));
  /* only one key, or garbage */
  snprintf(text, sizeof text, "# one key only\n%s\n", pub);
  write_text(bad, text, 0600);
  CHECK_EQ_INT(FSDP_ERR_FORMAT, curve_keypair_load(bad, p2, s2));
  write_text(bad, "not a key\n", 0600);
  CHECK_EQ_INT(FSDP_ERR_FORMAT, curve_keypair_load(bad, p2, s2));
  CHECK(curve_keypair_load("/nonexistent/x.key", p2, s2) == FSDP_ERR_NOTFOUND);
  /* a public key file: first key line */
  char pp[512];
  path(pp, sizeof pp, "x.pub");
  snprintf(text, sizeof text, "# the server\n\n  %s  \n", pub);
  write_text(pp, text, 0644);
  CHECK_OK(curve_pubkey_load(pp, p2));
  CHECK(!strcmp(p2, pub));
}

/* Z85 has '#' (never first: 4 bytes are below 83·85^4): inside a key it is no comment. */
static void test_hash_keys(void) {
  char pub[CURVE_KEY_LEN + 1], sec[CURVE_KEY_LEN + 1];
  int found = 0;
  for (int i = 0; i < 20000 && !found; i++)
    found = curve_keypair_new(pub, sec) == FSDP_OK && strchr(pub, '#') != NULL;
  CHECK(found);
  if (!found) return;
  char kp[512], ap[512], p2[CURVE_KEY_LEN + 1], s2[CURVE_KEY_LEN + 1], text[256];
  path(kp, sizeof kp, "hash.key");
  CHECK_OK(curve_keypair_write(kp, pub, sec));
  CHECK_OK(curve_keypair_load(kp, p2, s2));
  CHECK(!strcmp(p2, pub));
  path(ap, sizeof ap, "hash-authorized");
  snprintf(text, sizeof text, "# clients\n%s admin node-x\n", pub);
  write_text(ap, text, 0644);
  curve_grant g = CURVE_NOT_LISTED;
  char user[CURVE_USER_MAX + 1];
  CHECK_OK(curve_authorized(ap, pub, &g, user));
  CHECK_EQ_INT(CURVE_AS_ADMIN, g);
  /* commented out: not listed, and no malformed line */
  snprintf(text, sizeof text, "# %s admin\n#%s admin\n", pub, pub);
  write_text(ap, text, 0644);
  CHECK_OK(curve_authorized(ap, pub, &g, user));
  CHECK_EQ_INT(CURVE_NOT_LISTED, g);
  int bad = -1;
  CHECK_OK(curve_authorized_check(ap, &bad, NULL, NULL));
  CHECK_EQ_INT(0, bad);
}

static void test_authorized(void) {
  char a[CURVE_KEY_LEN + 1], b[CURVE_KEY_LEN + 1], c[CURVE_KEY_LEN + 1], s[CURVE_KEY_LEN + 1];
  curve_keypair_new(a, s);
  curve_keypair_new(b, s);
  curve_keypair_new(c, s);
  char ap[512], text[512];
  path(ap, sizeof ap, "authorized");
  curve_grant g = CURVE_AS_ADMIN;
  char user[CURVE_USER_MAX + 1];
  CHECK_OK(curve_authorized(ap, a, &g, user));   /* missing file: nobody */
  CHECK_EQ_INT(CURVE_NOT_LISTED, g);
  snprintf(text, sizeof text, "# team\n\n  %s admin\r\n%s\tuser=bob   # the build box\n", a, b);
  write_text(ap, text, 0644);
  CHECK_OK(curve_authorized(ap, a, &g, user));
  CHECK_EQ_INT(CURVE_AS_ADMIN, g);
  CHECK(!strcmp(user, ""));
  CHECK_OK(curve_authorized(ap, b, &g, user));
  CHECK_EQ_INT(CURVE_AS_USER, g);
  CHECK(!strcmp(user, "bob"));
  CHECK_OK(curve_authorized(ap, c, &g, user));
  CHECK_EQ_INT(CURVE_NOT_LISTED, g);
}

/* Collects curve_authorized_check's reports. */
typedef struct reports { int n; char last[512]; } reports;
static void on_report(void *arg, const char *msg) {
  reports *r = arg;
  r->n++;
  snprintf(r->last, sizeof r->last, "%s", msg);
}

/* "KEY user=NAME [note]" and "KEY admin [note]" grant; every other non-comment line is malformed:
 * it is reported with its line, and a key on it is refused, never taken for an admin. The issue's
 * forms: a bare key (the old "daemon's own user"), User=, "user = x", a note before user=, #user=,
 * user= with no name or a bad one, a key with a NUL, and listing a key twice with other rights. */
static void test_authorized_users(void) {
  enum { NK = 11 };
  char k[NK][CURVE_KEY_LEN + 1], s[CURVE_KEY_LEN + 1];
  for (int i = 0; i < NK; i++) curve_keypair_new(k[i], s);
  char ap[512], text[4096], user[CURVE_USER_MAX + 1];
  path(ap, sizeof ap, "authorized-users");
  int n = snprintf(text, sizeof text,
                   "%s user=alice  alice's laptop\n"  /* 1 */
                   "%s\tuser=bob.smith_2\n"           /* 2 */
                   "%s admin\n"                       /* 3 */
                   "%s\n"                             /* 4: bare */
                   "%s alice was here\n"              /* 5: note, no grant */
                   "%s User=alice\n"                  /* 6 */
                   "%s user = alice\n"                /* 7 */
                   "%s note user=alice\n"             /* 8 */
                   "%s #user=alice\n"                 /* 9 */
                   "%s user=-x\n"                     /* 10 */
                   "%s user=\n"                       /* 11 */
                   "%s user=alice\n%s admin\n",       /* 12, 13: k[0] again, other rights */
                   k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], k[8], k[9], k[10], k[0], k[1]);
  CHECK(n > 0 && n < (int)sizeof text);
  write_text(ap, text, 0644);
  curve_grant g;
  CHECK_OK(curve_authorized(ap, k[0], &g, user));   /* listed twice, the same rights */
  CHECK_EQ_INT(CURVE_AS_USER, g);
  CHECK(!strcmp(user, "alice"));
  CHECK(curve_authorized(ap, k[1], &g, user) == FSDP_ERR_FORMAT);   /* listed again as admin */
  CHECK_EQ_INT(CURVE_NOT_LISTED, g);
  CHECK(strstr(fsdp_last_error(), ":13 ") && strstr(fsdp_last_error(), "line 2"));
  CHECK_OK(curve_authorized(ap, k[2], &g, user));
  CHECK_EQ_INT(CURVE_AS_ADMIN, g);
  static const char *const why[] = {"", "", "", "names no user: add user=NAME", "'alice' after the key",
                                    "'User=alice'", "'user' after the key", "'note' after the key",
                                    "'#user=alice'", "'user=-x'", "'user=' after the key"};
  for (int i = 3; i < NK; i++) {
    g = CURVE_AS_ADMIN;
    CHECK(curve_authorized(ap, k[i], &g, user) == FSDP_ERR_FORMAT);
    CHECK_EQ_INT(CURVE_NOT_LISTED, g);
    char at[600];
    snprintf(at, sizeof at, "%s:%d ", ap, i + 1);
    if (!strstr(fsdp_last_error(), at) || !strstr(fsdp_last_error(), why[i]) || !strstr(fsdp_last_error(), "not admitted"))
      printf("line %d: %s\n", i + 1, fsdp_last_error());
    CHECK(strstr(fsdp_last_error(), at) != NULL);
    CHECK(strstr(fsdp_last_error(), why[i]) != NULL);
  }
  reports r = {0};
  int bad = 0;
  CHECK_OK(curve_authorized_check(ap, &bad, on_report, &r));
  CHECK_EQ_INT(8, bad);   /* lines 4..11 (13 is a well-formed line: the conflict is the lookup's) */
  CHECK_EQ_INT(8, r.n);
  CHECK(strstr(r.last, ":11 ") != NULL);
  /* a NUL byte inside a line: the line is malformed, the key on it refused */
  FILE *f = fopen(ap, "w");
  fprintf(f, "%s user=alice", k[3]);
  fputc('\0', f);
  fprintf(f, " x\n");
  fclose(f);
  CHECK(curve_authorized(ap, k[3], &g, user) == FSDP_ERR_FORMAT);
  CHECK_EQ_INT(CURVE_NOT_LISTED, g);
  CHECK(curve_user_name_ok("alice") && curve_user_name_ok("a.b-c_1"));
  CHECK(!curve_user_name_ok("") && !curve_user_name_ok("-a") && !curve_user_name_ok("a b") && !curve_user_name_ok("a/b") &&
        !curve_user_name_ok("abcdefghijklmnopqrstuvwxyz0123456"));
}

/* Lines of any length: a comment of 100 kB whose tail holds a key (at every 512-byte boundary an old
 * fgets would have cut it at) admits nothing; a grant after it on the next line is read; a key with a
 * 10 kB note is admitted. The same for a keypair file's comment. */
static void test_authorized_long_lines(void) {
  char a[CURVE_KEY_LEN + 1], b[CURVE_KEY_LEN + 1], s[CURVE_KEY_LEN + 1];
  curve_keypair_new(a, s);
  curve_keypair_new(b, s);
  char ap[512], user[CURVE_USER_MAX + 1];
  path(ap, sizeof ap, "authorized-long");
  FILE *f = fopen(ap, "w");
  fputc('#', f);
  for (int pos = 1; pos < 100000; pos++) {
    if (pos % 511 == 0) {   /* where a 512-byte chunk starts */
      fprintf(f, "%s admin ", a);
      pos += CURVE_KEY_LEN + 6;
    }
    fputc('x', f);
  }
  fprintf(f, "\n%s user=bob ", b);
  for (int i = 0; i < 10000; i++) fputc('n', f);
  fputc('\n', f);
  fclose(f);
  curve_grant g;
  CHECK_OK(curve_authorized(ap, a, &g, user));
  CHECK_EQ_INT(CURVE_NOT_LISTED, g);
  CHECK_OK(curve_authorized(ap, b, &g, user));
  CHECK_EQ_INT(CURVE_AS_USER, g);
  CHECK(!strcmp(user, "bob"));
  int bad = -1;
  CHECK_OK(curve_authorized_check(ap, &bad, NULL, NULL));
  CHECK_EQ_INT(0, bad);
  /* a keypair file with a long comment whose tail would have read as a key line */
  char pub[CURVE_KEY_LEN + 1], sec[CURVE_KEY_LEN + 1], kp[512], p2[CURVE_KEY_LEN + 1], s2[CURVE_KEY_LEN + 1];
  curve_keypair_new(pub, sec);
  path(kp, sizeof kp, "long-comment.key");
  f = fopen(kp, "w");
  fputc('#', f);
  for (int i = 1; i < 511; i++) fputc('x', f);
  fprintf(f, "%s\n%s\n%s\n", b, pub, sec);
  fclose(f);
  chmod(kp, 0600);
  CHECK_OK(curve_keypair_load(kp, p2, s2));
  CHECK(!strcmp(p2, pub) && !strcmp(s2, sec));
}

static void test_server_keys(void) {
  char kd[512], pub[CURVE_KEY_LEN + 1], sec[CURVE_KEY_LEN + 1], p2[CURVE_KEY_LEN + 1], s2[CURVE_KEY_LEN + 1];
  path(kd, sizeof kd, "keys");
  int created = 0;
  CHECK_OK(curve_server_keys(kd, pub, sec, &created));
  CHECK_EQ_INT(1, created);
  struct stat st;
  CHECK(stat(kd, &st) == 0 && (st.st_mode & 0777) == 0700);
  char f[600];
  snprintf(f, sizeof f, "%s/server.key", kd);
  CHECK(stat(f, &st) == 0 && (st.st_mode & 0777) == 0600);
  snprintf(f, sizeof f, "%s/server.pub", kd);
  CHECK_OK(curve_pubkey_load(f, p2));
  CHECK(!strcmp(p2, pub));
  /* reused; a lost server.pub is written again */
  unlink(f);
  CHECK_OK(curve_server_keys(kd, p2, s2, &created));
  CHECK_EQ_INT(0, created);
  CHECK(!strcmp(p2, pub) && !strcmp(s2, sec));
  CHECK_OK(curve_pubkey_load(f, p2));
  CHECK(!strcmp(p2, pub));
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Send "ping" from CLIENT and wait up to TIMEOUT_S for it at SERVER. */
static int ping(void *client, void *server, double timeout_s) {
  zmq_send(client, "ping", 4, ZMQ_DONTWAIT);
  double end = now_s() + timeout_s;
  while (now_s() < end) {
    zmq_pollitem_t it = {server, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 50) > 0) {
      char id[256], data[16];
      int n = zmq_recv(server, id, sizeof id, 0);
      int m = zmq_recv(server, data, sizeof data, 0);
      return n > 0 && m == 4 && !memcmp(data, "ping", 4);
    }
  }
  return 0;
}

static void test_tcp_exchange(void) {
  char kd[512], spub[CURVE_KEY_LEN + 1], ssec[CURVE_KEY_LEN + 1];
  path(kd, sizeof kd, "keys");
  CHECK_OK(curve_server_keys(kd, spub, ssec, NULL));
  char ck[512], pubfile[600], cpub[CURVE_KEY_LEN + 1], csec[CURVE_KEY_LEN + 1];
  path(ck, sizeof ck, "client.key");   /* from test_keypair_files */
  snprintf(pubfile, sizeof pubfile, "%s/server.pub", kd);
  CHECK_OK(curve_keypair_load(ck, cpub, csec));

  void *ctx = zmq_ctx_new();
  void *srv = zmq_socket(ctx, ZMQ_ROUTER);
  CHECK_OK(curve_server_apply(srv, ssec));
  CHECK(zmq_bind(srv, "tcp://127.0.0.1:*") == 0);
  char ep[128];
  size_t len = sizeof ep;
  zmq_getsockopt(srv, ZMQ_LAST_ENDPOINT, ep, &len);

  /* ipc:// and inproc://: nothing to do, keys or not */
  void *cli = zmq_socket(ctx, ZMQ_DEALER);
  CHECK_OK(curve_client_apply(cli, "ipc:///tmp/x.sock", NULL, NULL, "test"));
  /* tcp:// without keys: an error, not plaintext */
  CHECK_EQ_INT(FSDP_ERR_INVALID, curve_client_apply(cli, ep, NULL, ck, "--join x"));
  CHECK(strstr(fsdp_last_error(), "--join x") && strstr(fsdp_last_error(), "needs CURVE keys"));
  CHECK_EQ_INT(FSDP_ERR_INVALID, curve_client_apply(cli, ep, pubfile, "", "test"));
  /* the right server key: the message arrives */
  CHECK_OK(curve_client_apply(cli, ep, pubfile, ck, "test"));
  CHECK(zmq_connect(cli, ep) == 0);
  CHECK(ping(cli, srv, 10.0));

  /* a wrong server key: no connection, nothing arrives */
  char other[512], text[64], opub[CURVE_KEY_LEN + 1], osec[CURVE_KEY_LEN + 1];
  curve_keypair_new(opub, osec);
  path(other, sizeof other, "other.pub");
  snprintf(text, sizeof text, "%s\n", opub);
  write_text(other, text, 0644);
  void *bad = zmq_socket(ctx, ZMQ_DEALER);
  CHECK_OK(curve_client_apply(bad, ep, other, ck, "test"));
  CHECK(zmq_connect(bad, ep) == 0);
  CHECK(!ping(bad, srv, 0.5));
  /* a plaintext client: nothing arrives either */
  void *plain = zmq_socket(ctx, ZMQ_DEALER);
  CHECK(zmq_connect(plain, ep) == 0);
  CHECK(!ping(plain, srv, 0.5));

  int zero = 0;
  void *socks[] = {cli, bad, plain, srv};
  for (int i = 0; i < 4; i++) zmq_setsockopt(socks[i], ZMQ_LINGER, &zero, sizeof zero), zmq_close(socks[i]);
  zmq_ctx_term(ctx);
}

int main(void) {
  CHECK(zmq_has("curve"));
  CHECK_OK(curve_available());
  CHECK(mkdtemp(dir) != NULL);
  CHECK(curve_is_tcp("tcp://10.0.0.1:7070") && !curve_is_tcp("ipc:///x") && !curve_is_tcp(NULL));
  test_keypair_files();
  test_hash_keys();
  test_authorized();
  test_authorized_users();
  test_authorized_long_lines();
  test_server_keys();
  test_tcp_exchange();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
  return check_done();
}

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
  snprintf(text, sizeof text, "# clients\n%s node-x\n", pub);
  write_text(ap, text, 0644);
  int listed = 0;
  char user[CURVE_USER_MAX + 1];
  CHECK_OK(curve_authorized(ap, pub, &listed, user));
  CHECK_EQ_INT(1, listed);
  /* commented out: not listed */
  snprintf(text, sizeof text, "# %s\n#%s\n", pub, pub);
  write_text(ap, text, 0644);
  CHECK_OK(curve_authorized(ap, pub, &listed, user));
  CHECK_EQ_INT(0, listed);
}

static void test_authorized(void) {
  char a[CURVE_KEY_LEN + 1], b[CURVE_KEY_LEN + 1], c[CURVE_KEY_LEN + 1], s[CURVE_KEY_LEN + 1];
  curve_keypair_new(a, s);
  curve_keypair_new(b, s);
  curve_keypair_new(c, s);
  char ap[512], text[512];
  path(ap, sizeof ap, "authorized");
  int listed = 1;
  char user[CURVE_USER_MAX + 1];
  CHECK_OK(curve_authorized(ap, a, &listed, user));   /* missing file: nobody */
  CHECK_EQ_INT(0, listed);
  snprintf(text, sizeof text, "# team\n\n  %s\r\n%s   # the build box\n", a, b);
  write_text(ap, text, 0644);
  CHECK_OK(curve_authorized(ap, a, &listed, user));
  CHECK_EQ_INT(1, listed);
  CHECK_OK(curve_authorized(ap, b, &listed, user));
  CHECK_EQ_INT(1, listed);
  CHECK_OK(curve_authorized(ap, c, &listed, user));
  CHECK_EQ_INT(0, listed);
}

/* "KEY user=NAME [note]": the key acts as NAME; a key without user= names nobody (the daemon's own
 * user); a note is never taken for a user; a malformed user= is an error naming the line, and the
 * key is not listed. */
static void test_authorized_users(void) {
  char a[CURVE_KEY_LEN + 1], b[CURVE_KEY_LEN + 1], c[CURVE_KEY_LEN + 1], d[CURVE_KEY_LEN + 1], s[CURVE_KEY_LEN + 1];
  curve_keypair_new(a, s);
  curve_keypair_new(b, s);
  curve_keypair_new(c, s);
  curve_keypair_new(d, s);
  char ap[512], text[1024], user[CURVE_USER_MAX + 1];
  path(ap, sizeof ap, "authorized-users");
  snprintf(text, sizeof text, "%s user=alice  alice's laptop\n%s\tuser=bob.smith_2\n%s alice was here\n%s user=-x\n",
           a, b, c, d);
  write_text(ap, text, 0644);
  int listed = 0;
  CHECK_OK(curve_authorized(ap, a, &listed, user));
  CHECK_EQ_INT(1, listed);
  CHECK(!strcmp(user, "alice"));
  CHECK_OK(curve_authorized(ap, b, &listed, user));
  CHECK_EQ_INT(1, listed);
  CHECK(!strcmp(user, "bob.smith_2"));
  CHECK_OK(curve_authorized(ap, c, &listed, user));
  CHECK_EQ_INT(1, listed);
  CHECK(!strcmp(user, ""));
  CHECK(curve_authorized(ap, d, &listed, user) == FSDP_ERR_FORMAT);
  CHECK_EQ_INT(0, listed);
  CHECK(strstr(fsdp_last_error(), "line 4") != NULL);
  CHECK(curve_user_name_ok("alice") && curve_user_name_ok("a.b-c_1"));
  CHECK(!curve_user_name_ok("") && !curve_user_name_ok("-a") && !curve_user_name_ok("a b") && !curve_user_name_ok("a/b") &&
        !curve_user_name_ok("abcdefghijklmnopqrstuvwxyz0123456"));
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
  test_server_keys();
  test_tcp_exchange();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
  return check_done();
}

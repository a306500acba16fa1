/* curve — see curve.h. */
#include "curve.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "fsutil.h"

int curve_is_tcp(const char *endpoint) { return endpoint && !strncmp(endpoint, "tcp://", 6); }

fsdp_status curve_available(void) {
  if (!zmq_has("curve"))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED,
                          "this libzmq was built without CURVE, which tcp:// endpoints require; use ipc:// or a libzmq with libsodium");
  return FSDP_OK;
}

/* Z85 includes '#': a key line may start with it, so a line is a key when it is exactly 40 Z85
 * characters, and only otherwise a comment. */
static const char z85_chars[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

static int key_valid(const char *z85) {
  uint8_t bin[32];
  return strlen(z85) == CURVE_KEY_LEN && strspn(z85, z85_chars) == CURVE_KEY_LEN && zmq_z85_decode(bin, z85) != NULL;
}

fsdp_status curve_keypair_new(char pub[CURVE_KEY_LEN + 1], char sec[CURVE_KEY_LEN + 1]) {
  TRY(curve_available());
  if (zmq_curve_keypair(pub, sec) != 0)
    return fsdp_set_error(FSDP_ERR_INTERNAL, "zmq_curve_keypair: %s", zmq_strerror(zmq_errno()));
  return FSDP_OK;
}

fsdp_status curve_keypair_write(const char *path, const char *pub, const char *sec) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST)
      return fsdp_set_error(FSDP_ERR_STATE, "%s already exists; a key file is never overwritten (remove it first, or choose another name)", path);
    return fsdp_set_error(FSDP_ERR_IO, "cannot create %s: %s", path, strerror(errno));
  }
  char buf[2 * CURVE_KEY_LEN + 128];
  int n = snprintf(buf, sizeof buf, "# fsdpd CURVE keypair: public key, then secret key\n%s\n%s\n", pub, sec);
  ssize_t w = write(fd, buf, (size_t)n);
  int err = errno;
  if (fsync(fd) != 0 && w == n) w = -1, err = errno;
  close(fd);
  if (w != n) {
    unlink(path);
    return fsdp_set_error(FSDP_ERR_IO, "cannot write %s: %s", path, strerror(err));
  }
  return FSDP_OK;
}

/* Read up to MAX key lines (blank and # lines skipped, surrounding blanks trimmed) from PATH. */
static fsdp_status read_keys(const char *path, char keys[][CURVE_KEY_LEN + 1], int max, int *n, int check_mode) {
  *n = 0;
  FILE *f = fopen(path, "re");
  if (!f) return fsdp_set_error(errno == ENOENT ? FSDP_ERR_NOTFOUND : FSDP_ERR_IO, "cannot open key file %s: %s", path, strerror(errno));
  if (check_mode) {
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || (st.st_mode & 077)) {
      fclose(f);
      return fsdp_set_error(FSDP_ERR_INVALID, "key file %s holds a secret key and must be readable by its owner only (chmod 600 %s)", path, path);
    }
  }
  char line[512];
  int lineno = 0;
  fsdp_status rc = FSDP_OK;
  while (*n < max && fgets(line, sizeof line, f)) {
    lineno++;
    char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    size_t len = strcspn(p, "\r\n");
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
    p[len] = '\0';
    if (!*p || (*p == '#' && !key_valid(p))) continue;
    if (!key_valid(p)) {
      rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s:%d: not a CURVE key (expected 40 Z85 characters)", path, lineno);
      break;
    }
    memcpy(keys[*n], p, CURVE_KEY_LEN + 1);
    (*n)++;
  }
  fclose(f);
  return rc;
}

fsdp_status curve_keypair_load(const char *path, char pub[CURVE_KEY_LEN + 1], char sec[CURVE_KEY_LEN + 1]) {
  char keys[2][CURVE_KEY_LEN + 1];
  int n;
  TRY(read_keys(path, keys, 2, &n, 1));
  if (n != 2)
    return fsdp_set_error(FSDP_ERR_FORMAT, "key file %s holds %d keys; expected a keypair: the public key line, then the secret key line (make one with `fsdpctl keygen FILE`)", path, n);
  char derived[CURVE_KEY_LEN + 1];
  if (zmq_curve_public(derived, keys[1]) != 0 || strcmp(derived, keys[0]))
    return fsdp_set_error(FSDP_ERR_FORMAT, "key file %s: the public key does not belong to the secret key", path);
  memcpy(pub, keys[0], CURVE_KEY_LEN + 1);
  memcpy(sec, keys[1], CURVE_KEY_LEN + 1);
  return FSDP_OK;
}

fsdp_status curve_pubkey_load(const char *path, char pub[CURVE_KEY_LEN + 1]) {
  char keys[1][CURVE_KEY_LEN + 1];
  int n;
  TRY(read_keys(path, keys, 1, &n, 0));
  if (n != 1) return fsdp_set_error(FSDP_ERR_FORMAT, "public key file %s holds no key (expected one 40-character Z85 line, such as the daemon's STATE/keys/server.pub)", path);
  memcpy(pub, keys[0], CURVE_KEY_LEN + 1);
  return FSDP_OK;
}

fsdp_status curve_server_keys(const char *keys_dir, char pub[CURVE_KEY_LEN + 1], char sec[CURVE_KEY_LEN + 1], int *created) {
  if (created) *created = 0;
  TRY(curve_available());
  if (mkdir(keys_dir, 0700) != 0 && errno != EEXIST)
    return fsdp_set_error(FSDP_ERR_IO, "cannot create %s: %s", keys_dir, strerror(errno));
  char kpath[4200], ppath[4200];
  snprintf(kpath, sizeof kpath, "%s/server.key", keys_dir);
  snprintf(ppath, sizeof ppath, "%s/server.pub", keys_dir);
  if (access(kpath, F_OK) != 0) {
    TRY(curve_keypair_new(pub, sec));
    TRY(curve_keypair_write(kpath, pub, sec));
    if (created) *created = 1;
  } else {
    TRY(curve_keypair_load(kpath, pub, sec));
  }
  /* server.pub is derived: rewrite it whenever it is missing or differs. */
  char have[CURVE_KEY_LEN + 1];
  if (curve_pubkey_load(ppath, have) == FSDP_OK && !strcmp(have, pub)) return FSDP_OK;
  /* server.pub.tmp created O_EXCL | O_NOFOLLOW and renamed over: never written through a link */
  fsutil_atomic a = FSUTIL_ATOMIC_INIT;
  fsdp_status rc;
  TRY_GOTO(fsutil_atomic_open(ppath, 0644, &a), rc, out);
  if (fchmod(a.fd, 0644) != 0) {   /* readable by clients, whatever the daemon's umask */
    rc = fsdp_set_error(FSDP_ERR_IO, "cannot chmod %s: %s", a.shown, strerror(errno));
    goto out;
  }
  char line[CURVE_KEY_LEN + 2];
  int n = snprintf(line, sizeof line, "%s\n", pub);
  TRY_GOTO(fsutil_write_full(a.fd, line, (size_t)n, a.shown), rc, out);
  rc = fsutil_atomic_commit(&a);
out:
  fsutil_atomic_abort(&a);
  return rc;
}

int curve_user_name_ok(const char *name) {
  size_t n = strlen(name);
  if (n == 0 || n > CURVE_USER_MAX || name[0] == '-') return 0;
  for (size_t i = 0; i < n; i++)
    if (!isalnum((unsigned char)name[i]) && !strchr("._-", name[i])) return 0;
  return 1;
}

/* The user a key line names: "KEY user=NAME [note]" (*USER = NAME), or "KEY [note]" (""). */
static fsdp_status line_user(const char *path, int lineno, const char *rest, char user[CURVE_USER_MAX + 1]) {
  user[0] = '\0';
  rest += strspn(rest, " \t");
  if (strncmp(rest, "user=", 5)) return FSDP_OK;   /* no user: a note, or nothing */
  rest += 5;
  size_t len = strcspn(rest, " \t\r\n");
  char name[CURVE_USER_MAX + 2];
  snprintf(name, sizeof name, "%.*s", (int)(len < CURVE_USER_MAX + 1 ? len : CURVE_USER_MAX + 1), rest);
  if (len > CURVE_USER_MAX || !curve_user_name_ok(name))
    return fsdp_set_error(FSDP_ERR_FORMAT, "%s line %d: user=%.*s is not a user name (allowed: 1 to %d letters, digits, "
                          "'.', '_' or '-', not starting with '-')", path, lineno, (int)(len < 64 ? len : 64), rest,
                          CURVE_USER_MAX);
  memcpy(user, name, len + 1);
  return FSDP_OK;
}

fsdp_status curve_authorized(const char *path, const char *pub, int *listed, char user[CURVE_USER_MAX + 1]) {
  *listed = 0;
  user[0] = '\0';
  FILE *f = fopen(path, "re");
  if (!f) {
    if (errno == ENOENT) return FSDP_OK;
    return fsdp_set_error(FSDP_ERR_IO, "cannot read %s: %s", path, strerror(errno));
  }
  char line[512];
  fsdp_status rc = FSDP_OK;
  for (int lineno = 1; !*listed && fgets(line, sizeof line, f); lineno++) {
    char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    size_t len = strcspn(p, " \t\r\n");   /* a key line: the key, then optionally user=NAME, then a note */
    if (len != CURVE_KEY_LEN || strncmp(p, pub, CURVE_KEY_LEN)) continue;
    rc = line_user(path, lineno, p + len, user);
    *listed = rc == FSDP_OK;
    if (rc != FSDP_OK) break;
  }
  fclose(f);
  return rc;
}

fsdp_status curve_server_apply(void *sock, const char *sec) {
  TRY(curve_available());
  int one = 1;
  if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
      zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, CURVE_KEY_LEN) != 0 ||
      zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, "fsdpd", 5) != 0)
    return fsdp_set_error(FSDP_ERR_COMM, "cannot make a CURVE server socket: %s", zmq_strerror(zmq_errno()));
  return FSDP_OK;
}

fsdp_status curve_client_apply(void *sock, const char *endpoint, const char *server_key_path,
                               const char *client_key_path, const char *what) {
  if (!curve_is_tcp(endpoint)) return FSDP_OK;
  if (!server_key_path || !*server_key_path || !client_key_path || !*client_key_path)
    return fsdp_set_error(FSDP_ERR_INVALID,
                          "%s: a tcp:// endpoint needs CURVE keys: --server-key FILE (the daemon's STATE/keys/server.pub) and "
                          "--client-key FILE (a keypair made by `fsdpctl keygen FILE`, its public key listed in the daemon's "
                          "STATE/keys/authorized), or $%s and $%s; unencrypted tcp:// is not allowed",
                          what, CURVE_ENV_SERVER_KEY, CURVE_ENV_CLIENT_KEY);
  TRY(curve_available());
  char spub[CURVE_KEY_LEN + 1], pub[CURVE_KEY_LEN + 1], sec[CURVE_KEY_LEN + 1];
  TRY(curve_pubkey_load(server_key_path, spub));
  TRY(curve_keypair_load(client_key_path, pub, sec));
  if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, spub, CURVE_KEY_LEN) != 0 ||
      zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, CURVE_KEY_LEN) != 0 ||
      zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, sec, CURVE_KEY_LEN) != 0)
    return fsdp_set_error(FSDP_ERR_COMM, "cannot make a CURVE client socket: %s", zmq_strerror(zmq_errno()));
  return FSDP_OK;
}

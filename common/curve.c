/* curve — see curve.h. */
#include "curve.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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
  char *line = NULL;
  size_t cap = 0;
  int lineno = 0;
  fsdp_status rc = FSDP_OK;
  while (*n < max && getline(&line, &cap, f) >= 0) {   /* whole lines, of any length */
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
  free(line);
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

/* One line of an authorized file (LEN bytes, without its newline), parsed by the grammar of curve.h:
 * 0 for a blank or comment line, 1 for a grant (KEY, *GRANT, USER), -1 for anything else (WHY says
 * what is wrong and what is allowed). KEY holds the line's first word when it is a key, else "". */
static int parse_line(const char *line, size_t len, char key[CURVE_KEY_LEN + 1], curve_grant *grant,
                      char user[CURVE_USER_MAX + 1], char *why, size_t whylen) {
  key[0] = user[0] = '\0';
  *grant = CURVE_NOT_LISTED;
  if (strlen(line) != len) {   /* a NUL byte: no text line */
    snprintf(why, whylen, "holds a NUL byte; allowed: KEY user=NAME or KEY admin, then an optional note");
    return -1;
  }
  const char *p = line + strspn(line, " \t");
  size_t n = strlen(p);
  while (n && (p[n - 1] == ' ' || p[n - 1] == '\t' || p[n - 1] == '\r')) n--;
  if (n == 0 || *p == '#') return 0;   /* no key starts with '#' (curve.h) */
  size_t w = strcspn(p, " \t\r");
  char word[CURVE_KEY_LEN + 1];
  snprintf(word, sizeof word, "%.*s", (int)(w < CURVE_KEY_LEN ? w : CURVE_KEY_LEN), p);
  if (w != CURVE_KEY_LEN || !key_valid(word)) {
    snprintf(why, whylen, "does not start with a CURVE key (40 Z85 characters); allowed: KEY user=NAME or KEY admin, "
             "then an optional note, or a comment line starting with #");
    return -1;
  }
  memcpy(key, word, CURVE_KEY_LEN + 1);
  const char *g = p + w, *end = p + n;
  while (g < end && (*g == ' ' || *g == '\t')) g++;
  size_t gl = 0;   /* the grant: the second word */
  while (g + gl < end && g[gl] != ' ' && g[gl] != '\t') gl++;
  if (gl == 0) {
    snprintf(why, whylen, "names no user: add user=NAME (the local user the key acts as) or admin (the daemon's own "
             "rights) after the key");
    return -1;
  }
  if (gl == 5 && !strncmp(g, "admin", 5)) {
    *grant = CURVE_AS_ADMIN;
    return 1;
  }
  if (gl > 5 && !strncmp(g, "user=", 5) && gl - 5 <= CURVE_USER_MAX) {
    snprintf(user, CURVE_USER_MAX + 1, "%.*s", (int)(gl - 5), g + 5);
    if (curve_user_name_ok(user)) {
      *grant = CURVE_AS_USER;
      return 1;
    }
    user[0] = '\0';
  }
  snprintf(why, whylen, "'%.*s' after the key is neither user=NAME nor admin (NAME: 1 to %d letters, digits, '.', "
           "'_' or '-', not starting with '-'; lower case user=, no blanks around '=')", (int)(gl < 64 ? gl : 64), g,
           CURVE_USER_MAX);
  return -1;
}

/* Every line of PATH in order: VISIT(ARG, lineno, parse_line's result, its outputs); a non-zero
 * return stops the walk. A missing file has no lines. */
typedef int (*line_visit)(void *arg, int lineno, int kind, const char *line, const char *key, curve_grant grant,
                          const char *user, const char *why);

static fsdp_status walk_authorized(const char *path, line_visit visit, void *arg) {
  FILE *f = fopen(path, "re");
  if (!f) {
    if (errno == ENOENT) return FSDP_OK;
    return fsdp_set_error(FSDP_ERR_IO, "cannot read %s: %s", path, strerror(errno));
  }
  char *line = NULL, key[CURVE_KEY_LEN + 1], user[CURVE_USER_MAX + 1], why[256];
  size_t cap = 0;
  ssize_t len;
  for (int lineno = 1; (len = getline(&line, &cap, f)) >= 0; lineno++) {   /* whole lines, of any length */
    if (len && line[len - 1] == '\n') line[--len] = '\0';
    curve_grant g;
    int kind = parse_line(line, (size_t)len, key, &g, user, why, sizeof why);
    if (visit(arg, lineno, kind, line, key, g, user, why)) break;
  }
  int err = ferror(f) ? errno : 0;
  free(line);
  fclose(f);
  if (err) return fsdp_set_error(FSDP_ERR_IO, "cannot read %s: %s", path, strerror(err));
  return FSDP_OK;
}

typedef struct lookup {
  const char *path, *pub;
  curve_grant grant;
  char user[CURVE_USER_MAX + 1];
  int line;                /* the line that granted PUB; 0: none yet */
  fsdp_status rc;
} lookup;

static int lookup_visit(void *arg, int lineno, int kind, const char *line, const char *key, curve_grant grant,
                        const char *user, const char *why) {
  lookup *l = arg;
  if (kind < 0) {
    /* a malformed line that holds the key, wherever it stands, refuses it: never a guess at its rights */
    if (strstr(line, l->pub)) {
      l->rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s:%d %s; key %s is not admitted", l->path, lineno, why, l->pub);
      return 1;
    }
    return 0;
  }
  if (kind == 0 || strcmp(key, l->pub)) return 0;
  if (l->line && (grant != l->grant || strcmp(user, l->user))) {
    l->rc = fsdp_set_error(FSDP_ERR_FORMAT, "%s:%d lists key %s again with other rights than line %d; list each key "
                           "once; the key is not admitted", l->path, lineno, l->pub, l->line);
    return 1;
  }
  l->grant = grant;
  snprintf(l->user, sizeof l->user, "%s", user);
  if (!l->line) l->line = lineno;
  return 0;
}

fsdp_status curve_authorized(const char *path, const char *pub, curve_grant *grant, char user[CURVE_USER_MAX + 1]) {
  *grant = CURVE_NOT_LISTED;
  user[0] = '\0';
  lookup l = {.path = path, .pub = pub, .rc = FSDP_OK};
  TRY(walk_authorized(path, lookup_visit, &l));
  if (l.rc != FSDP_OK) return l.rc;
  *grant = l.grant;
  memcpy(user, l.user, sizeof l.user);
  return FSDP_OK;
}

typedef struct check {
  const char *path;
  curve_report report;
  void *arg;
  int bad;
} check;

static int check_visit(void *arg, int lineno, int kind, const char *line, const char *key, curve_grant grant,
                       const char *user, const char *why) {
  (void)line, (void)key, (void)grant, (void)user;
  check *k = arg;
  if (kind >= 0) return 0;
  char msg[512];
  snprintf(msg, sizeof msg, "%s:%d %s; the line admits no key", k->path, lineno, why);
  k->bad++;
  if (k->report) k->report(k->arg, msg);
  return 0;
}

fsdp_status curve_authorized_check(const char *path, int *bad, curve_report report, void *arg) {
  check k = {.path = path, .report = report, .arg = arg};
  fsdp_status rc = walk_authorized(path, check_visit, &k);
  if (bad) *bad = k.bad;
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

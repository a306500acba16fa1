/* kv — see kv.h. */
#include "kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

void kv_drop_job(coord_t *c, uint64_t job_id, const char *why) {
  char prefix[64];
  int plen = snprintf(prefix, sizeof prefix, "job-%llu/", (unsigned long long)job_id);
  for (kv_entry **p = &c->kv; *p;) {
    if (!strncmp((*p)->key, prefix, (size_t)plen)) {
      kv_entry *e = *p;
      *p = e->next;
      free(e->key);
      free(e->val);
      free(e);
    } else {
      p = &(*p)->next;
    }
  }
  for (kv_wait **p = &c->kv_waits; *p;) {
    if ((*p)->job_id == job_id) {
      kv_wait *w = *p;
      *p = w->next;
      coord_reply_error(c->cluster, &w->env, FSDP_ERR_CANCELLED, why);
      free(w->key);
      free(w);
    } else {
      p = &(*p)->next;
    }
  }
}

static fsdp_status kv_key(const char *prefix, const char *key, char *out, size_t cap) {
  size_t plen = strlen(prefix);
  /* Keys are namespaced by the job's kv_prefix; a key given without it gets it. */
  int n = strncmp(key, prefix, plen) == 0 ? snprintf(out, cap, "%s", key) : snprintf(out, cap, "%s%s", prefix, key);
  if (n < 0 || (size_t)n >= cap) return fsdp_set_error(FSDP_ERR_RANGE, "kv key '%s' is too long", key);
  return FSDP_OK;
}

static void kv_answer(coord_t *c, const wire_env *env, const kv_entry *e) {
  Fsdp__KvResp r = FSDP__KV_RESP__INIT;
  r.found = 1;
  r.value.data = e->val;
  r.value.len = e->len;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_KV_RESP;
  m.kv_resp = &r;
  coord_reply(c->cluster, env, &m);
}

void kv_on_set(coord_t *c, const wire_env *env, uint64_t job_id, const char *prefix, const Fsdp__KvSet *s) {
  (void)job_id;   /* a set is never parked: only the key's namespace matters */
  char key[512];
  if (kv_key(prefix, s->key, key, sizeof key) != FSDP_OK) {
    coord_reply_error(c->cluster, env, FSDP_ERR_RANGE, fsdp_last_error());
    return;
  }
  kv_entry *e = NULL;
  for (kv_entry *x = c->kv; x; x = x->next)
    if (!strcmp(x->key, key)) e = x;
  if (!e) {
    e = calloc(1, sizeof *e);
    if (!e || !(e->key = strdup(key))) {
      free(e);
      coord_reply_error(c->cluster, env, FSDP_ERR_NOMEM, "out of memory");
      return;
    }
    e->next = c->kv;
    c->kv = e;
  }
  free(e->val);
  e->val = malloc(s->value.len ? s->value.len : 1);
  e->len = s->value.len;
  if (s->value.len) memcpy(e->val, s->value.data, s->value.len);
  coord_reply_ack(c->cluster, env);
  for (kv_wait **p = &c->kv_waits; *p;) {
    if (!strcmp((*p)->key, key)) {
      kv_wait *w = *p;
      *p = w->next;
      kv_answer(c, &w->env, e);
      free(w->key);
      free(w);
    } else {
      p = &(*p)->next;
    }
  }
}

void kv_on_get(coord_t *c, const wire_env *env, uint64_t job_id, const char *prefix, const Fsdp__KvGet *g) {
  char key[512];
  if (kv_key(prefix, g->key, key, sizeof key) != FSDP_OK) {
    coord_reply_error(c->cluster, env, FSDP_ERR_RANGE, fsdp_last_error());
    return;
  }
  for (kv_entry *x = c->kv; x; x = x->next)
    if (!strcmp(x->key, key)) {
      kv_answer(c, env, x);
      return;
    }
  kv_wait *w = calloc(1, sizeof *w);
  if (!w || !(w->key = strdup(key))) {
    free(w);
    coord_reply_error(c->cluster, env, FSDP_ERR_NOMEM, "out of memory");
    return;
  }
  w->job_id = job_id;
  w->env = *env;
  w->next = c->kv_waits;
  c->kv_waits = w;
}

void kv_destroy_all(coord_t *c) {
  while (c->kv) {
    kv_entry *e = c->kv;
    c->kv = e->next;
    free(e->key);
    free(e->val);
    free(e);
  }
  while (c->kv_waits) {
    kv_wait *w = c->kv_waits;
    c->kv_waits = w->next;
    free(w->key);
    free(w);
  }
}

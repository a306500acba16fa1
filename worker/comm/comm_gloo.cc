// comm_gloo — the gloo adapter (C++17): a C API over Debian's libgloo 0.5 with the TCP transport.
//
// comm.c calls comm_gloo_run() from the comm's single communication thread, one collective at a
// time, in the order the caller issued them; nothing here is shared with other threads except
// comm_gloo_abort(). Every gloo exception is caught here and becomes FSDP_ERR_TIMEOUT (gloo's
// "Timed out" / "Wait timeout" messages) or FSDP_ERR_COMM, with gloo's text; nothing throws across
// the C boundary.
//
// Algorithms: all-gather is gloo::allgather (ring), all-reduce gloo::allreduce (ring), barrier
// gloo::barrier. Reduce-scatter is a ring written here on gloo's unbound buffers, because gloo 0.5
// has only ReduceScatterHalvingDoubling, an in-place algorithm over a full-size buffer (it would
// need a copy of the whole input per call and a different summation tree per world size). The
// ring: in step s = 0..N−2 rank r sends its partial sum of block (r−s−1) mod N to rank r+1 and
// receives the partial of block (r−s−2) mod N from rank r−1, adding its own contribution; after
// N−1 steps it holds the full sum of block r. Block b is summed in the fixed order
// ((x[b+1] + x[b+2]) + …) + x[b] (ranks mod N), whatever the timing. Each rank sends
// (N−1)·count elements: exactly the logical S·(N−1)/N. Scratch: one block, counted under MEM_COMM.
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

extern "C" {
#include "envknob.h"
#include "err.h"
#include "log.h"
#include "mem.h"
#include "plan.h"
}
#include "comm.h"

namespace {

using ms = std::chrono::milliseconds;
using clk = std::chrono::steady_clock;

// Our own slot space for the reduce-scatter ring: gloo's collectives build theirs from a one-byte
// prefix ≤ 0x08 in the top byte (gloo/types.h), and nextSlot() counts up from 0.
constexpr uint64_t kReduceScatterSlot = 0x40ull << 56;
// Reduce-scatter pipelining segment (gloo's all-reduce uses 1 MiB too).
constexpr size_t kSegmentBytes = 1 << 20;

// A store that applies our timeout to every wait (gloo's FileStore otherwise waits 30 s in get()).
class TimeoutStore : public gloo::rendezvous::Store {
 public:
  TimeoutStore(gloo::rendezvous::Store& inner, ms timeout) : inner_(inner), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { inner_.set(key, data); }
  std::vector<char> get(const std::string& key) override {
    inner_.wait({key}, timeout_);
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { inner_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const ms& timeout) override { inner_.wait(keys, timeout); }

 private:
  gloo::rendezvous::Store& inner_;
  ms timeout_;
};

// The coordinator's KV service through comm_kv callbacks.
class KvStore : public gloo::rendezvous::Store {
 public:
  KvStore(const comm_kv& kv, ms timeout) : kv_(kv), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    fsdp_status st = kv_.set(kv_.ctx, key.c_str(), data.data(), data.size());
    if (st != FSDP_OK) throw gloo::IoException("KV store set '" + key + "' failed: " + fsdp_last_error());
  }
  std::vector<char> get(const std::string& key) override { return fetch(key, timeout_); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const ms& timeout) override {
    auto deadline = clk::now() + timeout;
    for (const auto& k : keys) fetch(k, std::max(ms(1), std::chrono::duration_cast<ms>(deadline - clk::now())));
  }

 private:
  std::vector<char> fetch(const std::string& key, ms timeout) {
    void* val = nullptr;
    size_t len = 0;
    fsdp_status st = kv_.get(kv_.ctx, key.c_str(), &val, &len, 1e-3 * (double)timeout.count());
    if (st == FSDP_ERR_TIMEOUT)
      throw gloo::IoException("Wait timeout for key '" + key + "' in the KV store: " + fsdp_last_error());
    if (st != FSDP_OK) throw gloo::IoException("KV store get '" + key + "' failed: " + fsdp_last_error());
    std::vector<char> out((char*)val, (char*)val + len);
    free(val);
    return out;
  }
  comm_kv kv_;
  ms timeout_;
};

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {   // round to nearest even; NaN stays NaN
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// acc[i] = acc[i] + own[i]
void add_into(void* acc, const void* own, size_t n, comm_dtype dt) {
  if (dt == COMM_F32) {
    float* a = (float*)acc;
    const float* b = (const float*)own;
    for (size_t i = 0; i < n; i++) a[i] = a[i] + b[i];
  } else {
    uint16_t* a = (uint16_t*)acc;
    const uint16_t* b = (const uint16_t*)own;
    for (size_t i = 0; i < n; i++) a[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
  }
}

void sum_f32(void* out, const void* a, const void* b, size_t n) {
  float* o = (float*)out;
  const float *x = (const float*)a, *y = (const float*)b;
  for (size_t i = 0; i < n; i++) o[i] = x[i] + y[i];
}

void sum_bf16(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = (uint16_t*)out;
  const uint16_t *x = (const uint16_t*)a, *y = (const uint16_t*)b;
  for (size_t i = 0; i < n; i++) o[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
}

// The address ranks that meet through a directory (one machine) listen on: a loopback address of
// their own, 127.X.Y.Z drawn at random (Linux routes all of 127/8 to lo), not 127.0.0.1. gloo
// 0.5's TCP pair accepts the first connection its listening port receives, whoever makes it, and
// that port is an ephemeral one the kernel may have just taken back from some other server; a
// process still connecting to 127.0.0.1 at that port (a ZeroMQ client retrying a coordinator
// that has exited, say) took the peer's place: the peer's own connect was refused, the
// rendezvous failed on both ranks. Only processes told the address, through the store, connect
// to 127.X.Y.Z.
std::string private_loopback() {
  uint8_t b[3];
  if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {   // no entropy yet: this process's id
    const unsigned pid = (unsigned)getpid();
    b[0] = (uint8_t)(pid >> 16), b[1] = (uint8_t)(pid >> 8), b[2] = (uint8_t)pid;
  }
  return "127." + std::to_string(1 + b[0] % 254) + "." + std::to_string(b[1]) + "." + std::to_string(1 + b[2] % 254);
}

bool is_timeout_text(const char* what) {
  return strstr(what, "Timed out") || strstr(what, "timed out") || strstr(what, "Wait timeout") ||
         strstr(what, "timeout");
}

}  // namespace

struct comm_gloo {
  int rank = 0, world = 0;
  ms timeout{0};
  std::shared_ptr<gloo::transport::Device> dev;
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  void* scratch = nullptr;   // one reduce-scatter block, grown on demand, counted under MEM_COMM
  size_t scratch_bytes = 0;
  std::atomic<bool> aborted{false};
};

// gloo's exception text without the source location it starts with ("[./gloo/transport/tcp/
// pair.cc:81] Timed out ..." → "Timed out ..."): locations go to logs, not to users' messages.
static const char* gloo_text(const char* what) {
  if (what[0] != '[') return what;
  const char* end = strstr(what, "] ");
  if (!end || end - what > 200) return what;
  log_debug("gloo's exception raised at %.*s", (int)(end - what - 1), what + 1);
  return end + 2;
}

// Run F, turning every exception into a status with gloo's text recorded.
template <typename F>
static fsdp_status guarded(const char* what, F&& f) {
  try {
    f();
    return FSDP_OK;
  } catch (const gloo::IoException& e) {
    return fsdp_set_error(is_timeout_text(e.what()) ? FSDP_ERR_TIMEOUT : FSDP_ERR_COMM, "gloo %s: %s", what,
                          gloo_text(e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    return fsdp_set_error(FSDP_ERR_COMM, "gloo %s: %s", what, gloo_text(e.what()));
  } catch (const std::bad_alloc&) {
    return fsdp_set_error(FSDP_ERR_NOMEM, "gloo %s: out of memory", what);
  } catch (const std::exception& e) {
    return fsdp_set_error(is_timeout_text(e.what()) ? FSDP_ERR_TIMEOUT : FSDP_ERR_COMM, "gloo %s: %s", what,
                          gloo_text(e.what()));
  } catch (...) {
    return fsdp_set_error(FSDP_ERR_INTERNAL, "gloo %s: unknown exception", what);
  }
}

extern "C" fsdp_status comm_gloo_new(int rank, int world, const char* store_dir, const comm_kv* kv,
                                     const char* prefix, double timeout_s, comm_gloo** out) {
  *out = nullptr;
  if ((store_dir == nullptr) == (kv == nullptr))
    return fsdp_set_error(FSDP_ERR_INVALID,
                          "comm_new_gloo: give exactly one rendezvous store (store_dir or kv) for world %d", world);
  if (kv && (!kv->set || !kv->get))
    return fsdp_set_error(FSDP_ERR_INVALID, "comm_new_gloo: the KV store needs both set and get callbacks");

  // A peer that dies closes its sockets; writing to them must be an error (EPIPE), not a SIGPIPE
  // that kills this worker. Only an unchanged (default) disposition is replaced.
  struct sigaction old;
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);

  comm_gloo* g = new (std::nothrow) comm_gloo;
  if (!g) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the gloo adapter");
  g->rank = rank;
  g->world = world;
  g->timeout = ms((long long)(timeout_s * 1000.0 + 0.5));
  if (g->timeout.count() < 1) g->timeout = ms(1);

  gloo::transport::tcp::attr attr;
  const char* iface = envknob_get(ENV_GLOO_IFACE);
  const char* host = envknob_get(ENV_GLOO_HOST);
  char hostname[256] = "";
  if (iface && *iface) {
    attr.iface = iface;
  } else if (host && *host) {
    attr.hostname = host;
  } else if (store_dir) {
    attr.hostname = private_loopback();
  } else {
    if (gethostname(hostname, sizeof hostname - 1) != 0) strcpy(hostname, "127.0.0.1");
    attr.hostname = hostname;
  }
  std::string where = attr.iface.empty() ? "host " + attr.hostname : "interface " + attr.iface;
  std::string pfx = prefix && *prefix ? prefix : "fsdp";

  fsdp_status st = guarded("rendezvous", [&] {
    g->dev = gloo::transport::tcp::CreateDevice(attr);
    g->ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
    g->ctx->setTimeout(g->timeout);
    std::unique_ptr<gloo::rendezvous::Store> base;
    if (store_dir)
      base.reset(new gloo::rendezvous::FileStore(store_dir));
    else
      base.reset(new KvStore(*kv, g->timeout));
    gloo::rendezvous::PrefixStore prefixed(pfx, *base);
    TimeoutStore timed(prefixed, g->timeout);
    g->ctx->connectFullMesh(timed, g->dev);
    // connectFullMesh returns on the connecting side of a pair once its TCP connect is made, which
    // the kernel completes before the peer has accepted it: a rank could leave the rendezvous, fail
    // on its own (a bad data file) and close its sockets while its peer was still in
    // connectFullMesh, which then failed with "Connection closed by peer" instead of reaching its
    // own error. Nobody leaves this barrier before every rank has finished connecting.
    gloo::BarrierOptions done(g->ctx);
    done.setTimeout(g->timeout);
    gloo::barrier(done);
  });
  if (st != FSDP_OK) {
    std::string msg = fsdp_last_error();
    delete g;
    return fsdp_set_error(st,
                          "gloo rendezvous of rank %d of %d through %s%s (prefix '%s', %s, timeout_s = %.3g) "
                          "failed: %s; check that every rank started with the same store and prefix and that "
                          "the directory held no keys of an earlier run",
                          rank, world, store_dir ? "directory " : "the KV store", store_dir ? store_dir : "",
                          pfx.c_str(), where.c_str(), timeout_s, msg.c_str());
  }
  log_debug("comm: gloo rank %d of %d connected (%s, prefix '%s')", rank, world, where.c_str(), pfx.c_str());
  *out = g;
  return FSDP_OK;
}

static fsdp_status ensure_scratch(comm_gloo* g, size_t bytes) {
  if (bytes <= g->scratch_bytes) return FSDP_OK;
  void* p = nullptr;
  if (posix_memalign(&p, 64, bytes) != 0)
    return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate %zu bytes of reduce-scatter scratch", bytes);
  if (g->scratch) {
    free(g->scratch);
    mem_account(MEM_COMM, -(int64_t)g->scratch_bytes);
  }
  g->scratch = p;
  g->scratch_bytes = bytes;
  mem_account(MEM_COMM, (int64_t)bytes);
  return FSDP_OK;
}

static ms remaining(clk::time_point deadline) {
  auto left = std::chrono::duration_cast<ms>(deadline - clk::now());
  return left.count() < 1 ? ms(1) : left;
}

// Test hooks (comm.h, docs/testing.md): no-ops in fsdp-worker; the test binaries link
// tests/hooks/sum_order.c, whose definitions read FSDP_SUM_ORDER and FSDP_FAULT. reverse_ring runs
// the reduce-scatter ring the other way, so every block's partial sums are added in the reverse
// order of ranks: the same sum rounded differently, which the equivalence tests' tolerances must
// absorb. drop_reduce_scatter plants a fault the tests must catch: each rank keeps its own partial
// block instead of the sum.
extern "C" __attribute__((weak)) int comm_test_reverse_ring(void) { return 0; }
extern "C" __attribute__((weak)) int comm_test_drop_reduce_scatter(void) { return 0; }

static void ring_reduce_scatter(comm_gloo* g, const comm_op* op) {
  const int n = g->world, r = g->rank;
  const size_t esz = comm_dtype_size(op->dt);
  const size_t bytes = op->count * esz;
  // dir = +1: send right (r + 1), receive from the left; dir = -1: the mirror image.
  const int dir = comm_test_reverse_ring() ? -1 : 1;
  const int right = ((r + dir) % n + n) % n, left = ((r - dir) % n + n) % n;
  const char* send = (const char*)op->send;
  const auto deadline = clk::now() + g->timeout;

  auto in = g->ctx->createUnboundBuffer(const_cast<char*>(send), bytes * (size_t)n);
  auto a = g->ctx->createUnboundBuffer(g->scratch, bytes);
  auto b = g->ctx->createUnboundBuffer(op->recv, bytes);
  // Step s receives into tgt(s); the last step (s = n−2) must land in recv.
  auto tgt = [&](int s) -> gloo::transport::UnboundBuffer* { return ((n - 2 - s) % 2 == 0) ? b.get() : a.get(); };

  // Each step moves the block in segments, two in flight each way, so that adding segment k
  // overlaps the transfer of segment k+1 (the same pipelining gloo's all-gather uses).
  const size_t seg = std::max(esz, kSegmentBytes / esz * esz);
  const size_t nseg = (bytes + seg - 1) / seg;
  auto seg_len = [&](size_t k) { return std::min(seg, bytes - k * seg); };
  auto wait_recv = [&](gloo::transport::UnboundBuffer* u) {
    if (!u->waitRecv(remaining(deadline)) || g->aborted.load()) throw gloo::IoException("reduce-scatter aborted");
  };
  auto wait_send = [&](gloo::transport::UnboundBuffer* u) {
    if (!u->waitSend(remaining(deadline)) || g->aborted.load()) throw gloo::IoException("reduce-scatter aborted");
  };

  for (int s = 0; s <= n - 2; s++) {
    const int sb = ((r - dir * (s + 1)) % n + n) % n;   // block sent: our partial from the previous step
    const int rb = ((r - dir * (s + 2)) % n + n) % n;   // block received and added to
    gloo::transport::UnboundBuffer* out = s == 0 ? in.get() : tgt(s - 1);
    gloo::transport::UnboundBuffer* got = tgt(s);
    const size_t src = s == 0 ? (size_t)sb * bytes : 0;   // where the sent block starts in `out`
    const char* own = send + (size_t)rb * bytes;
    for (size_t k = 0; k < std::min<size_t>(2, nseg); k++) {
      got->recv(left, kReduceScatterSlot, k * seg, seg_len(k));
      out->send(right, kReduceScatterSlot, src + k * seg, seg_len(k));
    }
    for (size_t k = 0; k < nseg; k++) {
      wait_recv(got);   // segments of one slot from one peer complete in order
      add_into((char*)got->ptr + k * seg, own + k * seg, seg_len(k) / esz, op->dt);
      if (k + 2 < nseg) got->recv(left, kReduceScatterSlot, (k + 2) * seg, seg_len(k + 2));
      wait_send(out);
      if (k + 2 < nseg) out->send(right, kReduceScatterSlot, src + (k + 2) * seg, seg_len(k + 2));
    }
  }
}

extern "C" fsdp_status comm_gloo_run(void* impl, const comm_op* op) {
  comm_gloo* g = (comm_gloo*)impl;
  if (g->aborted.load()) return fsdp_set_error(FSDP_ERR_COMM, "gloo %s: the comm was aborted", comm_op_name(op->kind));
  const size_t esz = comm_dtype_size(op->dt);
  const size_t bytes = op->count * esz;
  if (op->kind != COMM_OP_BARRIER && op->count == 0) return FSDP_OK;

  switch (op->kind) {
    case COMM_OP_ALLGATHER:
      return guarded("all-gather", [&] {
        gloo::AllgatherOptions o(g->ctx);
        char* recv = (char*)op->recv;
        if (op->send != recv + (size_t)g->rank * bytes) o.setInput((uint8_t*)const_cast<void*>(op->send), bytes);
        o.setOutput((uint8_t*)recv, bytes * (size_t)g->world);
        o.setTimeout(g->timeout);
        gloo::allgather(o);
      });
    case COMM_OP_REDUCESCATTER:
      if (comm_test_drop_reduce_scatter()) {
        memcpy(op->recv, (const char*)op->send + (size_t)g->rank * bytes, bytes);
        return FSDP_OK;
      }
      TRY(ensure_scratch(g, bytes));
      return guarded("reduce-scatter", [&] { ring_reduce_scatter(g, op); });
    case COMM_OP_ALLREDUCE:
      return guarded("all-reduce", [&] {
        gloo::AllreduceOptions o(g->ctx);
        if (op->dt == COMM_F32) {
          o.setOutput((float*)op->recv, op->count);
          o.setReduceFunction(sum_f32);
        } else {
          o.setOutput((uint16_t*)op->recv, op->count);
          o.setReduceFunction(sum_bf16);
        }
        o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        o.setTimeout(g->timeout);
        gloo::allreduce(o);
      });
    case COMM_OP_BARRIER:
      return guarded("barrier", [&] {
        gloo::BarrierOptions o(g->ctx);
        o.setTimeout(g->timeout);
        gloo::barrier(o);
      });
  }
  return fsdp_set_error(FSDP_ERR_INTERNAL, "gloo: unknown collective %d", (int)op->kind);
}

// Called from another thread when the comm thread is stuck: close every connection so that the
// pending gloo calls fail.
extern "C" void comm_gloo_abort(void* impl) {
  comm_gloo* g = (comm_gloo*)impl;
  if (!g || g->aborted.exchange(true)) return;
  try {
    if (g->ctx) g->ctx->closeConnections();
  } catch (...) {
  }
}

extern "C" void comm_gloo_destroy(void* impl) {
  comm_gloo* g = (comm_gloo*)impl;
  if (!g) return;
  try {
    g->ctx.reset();
    g->dev.reset();
  } catch (...) {
  }
  if (g->scratch) {
    free(g->scratch);
    mem_account(MEM_COMM, -(int64_t)g->scratch_bytes);
  }
  delete g;
}

// The guarded backend's memory: mappings, per-page access windows, the SIGSEGV handler.
// Two halves: the calling thread's bookkeeping (std::map of allocations, per-page reference
// counts, window pool; never read by the handler), and a fixed table of atomics that mirrors
// what the handler needs (mapping bounds, size, label, the op in flight), read without locks or
// allocation so that the handler stays async-signal-safe.
#include "backend/cpu/guarded_memory.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "core/check.hpp"

namespace exatrain::guarded {
namespace {

const uintptr_t kPage = uintptr_t(sysconf(_SC_PAGESIZE));

// ---- what the fault handler reads: fixed size, lock-free atomics only --------------------------

constexpr int kSlots = 1 << 14;  // live allocations at once (a tiny Gpt has ~100)
struct SafeSlot {
  std::atomic<uintptr_t> lo{0}, hi{0};  // the mapping, guard pages included; hi == 0: free
  std::atomic<uintptr_t> begin{0};      // the data (lo + one page)
  std::atomic<size_t> bytes{0};
  std::atomic<const char*> label{nullptr};  // interned, never freed
};
static_assert(std::atomic<uintptr_t>::is_always_lock_free && std::atomic<size_t>::is_always_lock_free &&
              std::atomic<const char*>::is_always_lock_free);
SafeSlot g_slots[kSlots];
std::atomic<int> g_slots_used{0};                // slots [0, used) have been handed out
std::atomic<const char*> g_op{nullptr};          // the op in flight (string literal)
std::atomic<const char*> g_last_op{nullptr};     // the op that finished last
struct sigaction g_previous;                     // the handler ours replaced (chained)
volatile sig_atomic_t g_in_chain = 0;            // a previous handler that chains back to us

// ---- the calling thread's bookkeeping -----------------------------------------------------------

struct Allocation {
  uintptr_t lo = 0, hi = 0, begin = 0;
  size_t bytes = 0;
  int slot = -1;
  const void* owner = nullptr;
  std::vector<uint32_t> refs;  // open windows per data page
  int64_t host_scopes = 0;     // open begin_host_access windows on it
};
struct Window {
  Allocation* a = nullptr;  // nullptr: free
  size_t first = 0, last = 0;  // data pages [first, last)
  bool host = false;
};
struct State {
  std::map<uintptr_t, Allocation> allocs;  // by lo
  std::vector<int> free_slots;
  std::vector<Window> windows;
  std::vector<int> free_windows;
  std::map<int64_t, int> host_tokens;  // token -> window
  int64_t next_token = 1;
  std::set<std::string> labels;  // interned: the handler reads c_str() of them
};
// Never destroyed: a backend cached in a static of a test (or of the trainer) is destroyed at
// exit after function-local statics constructed later, and its destructor still unmaps here.
State& state() {
  static State* s = new State;
  return *s;
}

// The entry point in flight: every entry point claims it (one thread at a time, see header).
std::atomic<const char*> g_busy{nullptr};
class Exclusive {
 public:
  explicit Exclusive(const char* what) {
    const char* none = nullptr;
    if (!g_busy.compare_exchange_strong(none, what))
      EXA_FAIL("guarded backend: {} was called while {} is in flight: the guarded backend serves "
               "one thread at a time (see cpu/guarded_memory.hpp)", what, none);
  }
  ~Exclusive() { g_busy.store(nullptr); }
  Exclusive(const Exclusive&) = delete;
  Exclusive& operator=(const Exclusive&) = delete;
};

// The allocation whose mapping (guard pages included) holds address a, or nullptr.
Allocation* find(uintptr_t a) {
  auto& allocs = state().allocs;
  auto it = allocs.upper_bound(a);
  if (it == allocs.begin()) return nullptr;
  --it;
  return a < it->second.hi ? &it->second : nullptr;
}

const char* label_of(const Allocation& al) {
  const char* l = g_slots[al.slot].label.load(std::memory_order_relaxed);
  return l ? l : "(no label)";
}

void protect(const Allocation& al, size_t first, size_t last, int prot) {
  EXA_SYSCHECK(mprotect(reinterpret_cast<void*>(al.begin + first * kPage), (last - first) * kPage,
                        prot) == 0,
               "guarded backend: mprotect of {} pages of allocation \"{}\"", last - first, label_of(al));
}

// Adds `delta` (+1 / -1) to the reference counts of pages [first, last) and changes the
// protection of the maximal runs of pages that became accessible (0 -> 1) or not (1 -> 0).
void count(Allocation& al, size_t first, size_t last, int delta) {
  const uint32_t edge = delta > 0 ? 0u : 1u;  // the count before a change of protection
  const int prot = delta > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
  size_t run = last;  // start of the current run, or `last` when none
  for (size_t i = first; i < last; i++) {
    const bool flips = al.refs[i] == edge;
    al.refs[i] = uint32_t(int64_t(al.refs[i]) + delta);
    if (flips && run == last) run = i;
    if (!flips && run != last) {
      protect(al, run, i, prot);
      run = last;
    }
  }
  if (run != last) protect(al, run, last, prot);
}

// Opens a window on [p, p+bytes) when it starts in guarded memory; returns its index or -1.
int open_window(const char* op, const void* p, size_t bytes, bool host) {
  if (bytes == 0) return -1;
  const uintptr_t a = uintptr_t(p);
  Allocation* al = find(a);
  if (al == nullptr) return -1;  // host memory
  const int64_t off = int64_t(a) - int64_t(al->begin);
  EXA_CHECK(off >= 0 && size_t(off) <= al->bytes && bytes <= al->bytes - size_t(off),
            "guarded backend: {} declares {} bytes at offset {} of allocation \"{}\" of {} bytes, "
            "which do not fit inside it (the op's shape arguments overrun the buffer)",
            op, bytes, off, label_of(*al), al->bytes);
  State& s = state();
  int w;
  if (s.free_windows.empty()) {
    w = int(s.windows.size());
    s.windows.emplace_back();
  } else {
    w = s.free_windows.back();
    s.free_windows.pop_back();
  }
  const size_t first = size_t(off) / kPage, last = (size_t(off) + bytes + kPage - 1) / kPage;
  count(*al, first, last, +1);
  s.windows[size_t(w)] = Window{al, first, last, host};
  if (host) al->host_scopes++;
  return w;
}

void close_window(int w) {
  State& s = state();
  Window& win = s.windows[size_t(w)];
  count(*win.a, win.first, win.last, -1);
  if (win.host) win.a->host_scopes--;
  win = Window{};
  s.free_windows.push_back(w);
}

// ---- the fault handler --------------------------------------------------------------------------

// One line built on the stack (no allocation, no stdio).
struct Line {
  char buf[640];
  size_t n = 0;
  void put(const char* s) {
    while (*s && n + 1 < sizeof buf) buf[n++] = *s++;
  }
  void dec(int64_t v) {
    char t[24];
    int k = 0;
    const bool neg = v < 0;
    uint64_t u = neg ? uint64_t(0) - uint64_t(v) : uint64_t(v);
    do t[k++] = char('0' + u % 10); while ((u /= 10) != 0);
    if (neg) t[k++] = '-';
    while (k > 0 && n + 1 < sizeof buf) buf[n++] = t[--k];
  }
  void hex(uintptr_t v) {
    put("0x");
    char t[20];
    int k = 0;
    do t[k++] = "0123456789abcdef"[v & 15]; while ((v >>= 4) != 0);
    while (k > 0 && n + 1 < sizeof buf) buf[n++] = t[--k];
  }
  void write_stderr() {
    buf[n++] = '\n';
    for (size_t done = 0; done < n;) {
      const ssize_t w = ::write(STDERR_FILENO, buf + done, n - done);
      if (w <= 0) {
        if (w < 0 && errno == EINTR) continue;
        return;
      }
      done += size_t(w);
    }
  }
};

const char* access_kind(void* ctx) {
#if defined(__x86_64__)
  // Bit 1 of the page-fault error code: the access was a write.
  const auto* uc = static_cast<const ucontext_t*>(ctx);
  return (uc->uc_mcontext.gregs[REG_ERR] & 2) ? "a write" : "a read";
#else
  return "an access";
#endif
}

[[noreturn]] void report(const SafeSlot& s, uintptr_t a, void* ctx) {
  Line l;
  const uintptr_t begin = s.begin.load(std::memory_order_relaxed);
  const int64_t bytes = int64_t(s.bytes.load(std::memory_order_relaxed));
  const int64_t off = int64_t(a) - int64_t(begin);
  const char* label = s.label.load(std::memory_order_relaxed);
  l.put("guarded backend: host code touched device memory at ");
  l.hex(a);
  l.put(" (");
  l.put(access_kind(ctx));
  l.put("; allocation \"");
  l.put(label ? label : "(no label)");
  l.put("\" of ");
  l.dec(bytes);
  l.put(" bytes, offset ");
  l.dec(off);
  if (off < 0) l.put(", in the guard page before it");
  if (off >= bytes) l.put(", past its end");
  const char* op = g_op.load();
  if (op != nullptr) {
    l.put(") inside op ");
    l.put(op);
    l.put(" but outside the ranges it declared");
  } else {
    const char* last = g_last_op.load();
    l.put(") outside any backend op (");
    l.put(last ? "the last op was " : "no op has run yet");
    if (last) l.put(last);
    l.put(")");
  }
  l.write_stderr();
  std::abort();  // async-signal-safe
}

// Faults outside guarded memory go to the handler that was installed before ours.
void chain(int sig, siginfo_t* info, void* ctx) {
  const struct sigaction& prev = g_previous;
  if (!g_in_chain) {
    g_in_chain = 1;
    if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction != nullptr) {
      prev.sa_sigaction(sig, info, ctx);
      g_in_chain = 0;
      return;
    }
    if (!(prev.sa_flags & SA_SIGINFO) && prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
      prev.sa_handler(sig);
      g_in_chain = 0;
      return;
    }
  }
  // Default action: restore it and return; the faulting instruction runs again and the kernel
  // terminates the process (core dump) as if no handler had been installed. A SIGSEGV sent with
  // kill() does not run again: send it again.
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  if (info->si_code <= 0) raise(sig);
}

void on_fault(int sig, siginfo_t* info, void* ctx) {
  const uintptr_t a = uintptr_t(info->si_addr);
  const int used = g_slots_used.load(std::memory_order_acquire);
  for (int i = 0; i < used; i++) {
    const uintptr_t hi = g_slots[i].hi.load(std::memory_order_acquire);
    if (hi != 0 && g_slots[i].lo.load(std::memory_order_relaxed) <= a && a < hi)
      report(g_slots[i], a, ctx);
  }
  chain(sig, info, ctx);
}

}  // namespace

void install_fault_handler() {
  struct sigaction current;
  EXA_SYSCHECK(sigaction(SIGSEGV, nullptr, &current) == 0, "guarded backend: sigaction(SIGSEGV) query");
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_fault) return;
  g_previous = current;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;  // the alternate stack, where the process set one up
  sigemptyset(&sa.sa_mask);
  EXA_SYSCHECK(sigaction(SIGSEGV, &sa, nullptr) == 0, "guarded backend: sigaction(SIGSEGV) install");
}

void* map(size_t bytes, bool resident, const void* owner) {
  Exclusive ex("alloc_bytes");
  State& s = state();
  const size_t pages = std::max<size_t>(1, (bytes + kPage - 1) / kPage);
  const size_t len = (pages + 2) * kPage;  // a guard page on each side
  void* m = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  EXA_SYSCHECK(m != MAP_FAILED, "guarded backend: mmap of {} bytes", len);
  Allocation al;
  al.lo = uintptr_t(m);
  al.hi = al.lo + len;
  al.begin = al.lo + kPage;
  al.bytes = bytes;
  al.owner = owner;
  al.refs.assign(pages, 0);
  void* data = reinterpret_cast<void*>(al.begin);
  if (resident) {  // write each page once, as the CPU backend's memset does
    if (mprotect(data, pages * kPage, PROT_READ | PROT_WRITE) == 0) {
      std::memset(data, 0, pages * kPage);
      resident = mprotect(data, pages * kPage, PROT_NONE) != 0;  // false: done
    }
    if (resident) {
      const int err = errno;
      munmap(m, len);
      errno = err;
      EXA_SYSCHECK(false, "guarded backend: mprotect of a new allocation of {} bytes", bytes);
    }
  }
  if (!s.free_slots.empty()) {
    al.slot = s.free_slots.back();
    s.free_slots.pop_back();
  } else {
    al.slot = g_slots_used.load();
    if (al.slot >= kSlots) {
      munmap(m, len);
      EXA_FAIL("guarded backend: more than {} live allocations (raise kSlots in {})", kSlots, __FILE__);
    }
  }
  SafeSlot& slot = g_slots[al.slot];
  slot.label.store(nullptr, std::memory_order_relaxed);
  slot.begin.store(al.begin, std::memory_order_relaxed);
  slot.bytes.store(bytes, std::memory_order_relaxed);
  slot.lo.store(al.lo, std::memory_order_relaxed);
  slot.hi.store(al.hi, std::memory_order_release);  // publishes the slot
  if (al.slot == g_slots_used.load()) g_slots_used.store(al.slot + 1, std::memory_order_release);
  s.allocs.emplace(al.lo, std::move(al));
  return data;
}

namespace {
// Unpublishes and unmaps one allocation (the caller has checked it may go).
void drop(std::map<uintptr_t, Allocation>::iterator it) {
  State& s = state();
  Allocation& al = it->second;
  g_slots[al.slot].hi.store(0, std::memory_order_release);
  const int rc = munmap(reinterpret_cast<void*>(al.lo), al.hi - al.lo);
  const int err = errno;
  s.free_slots.push_back(al.slot);
  s.allocs.erase(it);
  errno = err;
  EXA_SYSCHECK(rc == 0, "guarded backend: munmap");
}
}  // namespace

void unmap(void* p) {
  if (p == nullptr) return;
  Exclusive ex("free_bytes");
  State& s = state();
  auto it = s.allocs.find(uintptr_t(p) - kPage);
  EXA_CHECK(it != s.allocs.end() && it->second.begin == uintptr_t(p),
            "guarded backend: free_bytes({}) of a pointer that is not a live guarded allocation", p);
  EXA_CHECK(it->second.host_scopes == 0,
            "guarded backend: free_bytes of allocation \"{}\" while {} host-access scope(s) on it are "
            "still open (end_host_access first)", label_of(it->second), it->second.host_scopes);
  drop(it);
}

void unmap_all(const void* owner) noexcept {
  State& s = state();
  for (auto t = s.host_tokens.begin(); t != s.host_tokens.end();) {  // their windows go too
    Window& w = s.windows[size_t(t->second)];
    if (w.a->owner != owner) {
      ++t;
      continue;
    }
    w = Window{};
    s.free_windows.push_back(t->second);
    t = s.host_tokens.erase(t);
  }
  for (auto it = s.allocs.begin(); it != s.allocs.end();) {
    auto next = std::next(it);
    if (it->second.owner == owner) {
      g_slots[it->second.slot].hi.store(0, std::memory_order_release);
      munmap(reinterpret_cast<void*>(it->second.lo), it->second.hi - it->second.lo);  // cannot fail
      s.free_slots.push_back(it->second.slot);
      s.allocs.erase(it);
    }
    it = next;
  }
}

void label(const void* p, const std::string& what) {
  Exclusive ex("label");
  Allocation* al = find(uintptr_t(p));
  if (al == nullptr) return;
  const char* interned = state().labels.insert(what).first->c_str();
  g_slots[al->slot].label.store(interned, std::memory_order_release);
}

OpScope::OpScope(const char* op, std::initializer_list<Range> ranges) : op_(op) {
  EXA_CHECK(ranges.size() <= size_t(kMaxRanges), "guarded backend: op {} declares {} ranges (at most {})",
            op, ranges.size(), kMaxRanges);
  const char* none = nullptr;
  if (!g_busy.compare_exchange_strong(none, op))
    EXA_FAIL("guarded backend: op {} was called while {} is in flight: the guarded backend serves "
             "one thread at a time (see cpu/guarded_memory.hpp)", op, none);
  try {
    for (const Range& r : ranges) {
      const int w = open_window(op, r.p, r.bytes, false);
      if (w >= 0) windows_[n_++] = w;
    }
  } catch (...) {
    while (n_ > 0) close_window(windows_[--n_]);
    g_busy.store(nullptr);
    throw;
  }
  g_op.store(op);
}

OpScope::~OpScope() {
  g_op.store(nullptr);
  g_last_op.store(op_);
  while (n_ > 0) close_window(windows_[--n_]);
  g_busy.store(nullptr);
}

int64_t begin_host_access(const void* p, size_t bytes) {
  Exclusive ex("begin_host_access");
  const int w = open_window("begin_host_access", p, bytes, true);
  if (w < 0) return 0;
  State& s = state();
  const int64_t token = s.next_token++;
  s.host_tokens[token] = w;
  return token;
}

void end_host_access(int64_t token) {
  if (token == 0) return;
  Exclusive ex("end_host_access");
  State& s = state();
  auto it = s.host_tokens.find(token);
  EXA_CHECK(it != s.host_tokens.end(),
            "guarded backend: end_host_access({}) of a token that is not open (ended twice, never "
            "begun, or its allocation's backend was destroyed)", token);
  close_window(it->second);
  s.host_tokens.erase(it);
}

}  // namespace exatrain::guarded

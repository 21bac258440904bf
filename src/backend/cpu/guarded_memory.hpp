// The guarded backend's memory (cpu/guarded_backend.hpp): device allocations that host code
// cannot touch outside a backend op, and the SIGSEGV handler that names the culprit.
//
// Owns: one anonymous mapping per allocation (page-aligned data between two guard pages, all
// PROT_NONE at rest); access windows over byte ranges of them, reference-counted per page, so
// that overlapping windows (two ranges of one op, an op over a buffer a communication is still
// reading) each keep their access until they close; the table the fault handler reads. May use:
// core/.
//
// State is per process (the signal handler is): allocations of one guarded backend may be
// passed to the ops of another. ONE THREAD AT A TIME: the bookkeeping is not locked; every
// entry point fails with a clear error when it is entered while another is in flight (a second
// thread). OpenMP threads inside an op are fine: windows open before the op starts its team and
// close after the team has finished, in the calling thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace exatrain::guarded {

// A byte range an op reads or writes. A range whose start is not inside a guarded allocation
// is host memory and ignored; one that starts inside and runs past the allocation's end is an
// error (the op would overrun it).
struct Range {
  const void* p;
  size_t bytes;
};

// Installs the SIGSEGV handler once per process (again if another handler replaced it since),
// chaining to the handler found there for faults outside guarded memory.
void install_fault_handler();

// Zeroed, page-aligned memory of `bytes`, PROT_NONE. resident: every page is written once now
// (like the CPU backend's alloc_bytes); otherwise no page is resident until an op writes it.
// owner: the backend that unmap_all(owner) frees.
void* map(size_t bytes, bool resident, const void* owner);
// Frees an allocation returned by map (nullptr: no-op). Fails when p is not the start of a
// live guarded allocation or when host-access scopes on it are still open.
void unmap(void* p);
// Frees every allocation of `owner` (a backend's destructor), and ends the host-access scopes
// on them.
void unmap_all(const void* owner) noexcept;
// Names the allocation containing p for the fault message (host pointers: ignored).
void label(const void* p, const std::string& what);

// The access of one op: opens a window on each range (host ranges ignored) and names the op
// for the fault handler; the destructor closes them again. At most kMaxRanges ranges.
class OpScope {
 public:
  static constexpr int kMaxRanges = 8;
  OpScope(const char* op, std::initializer_list<Range> ranges);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  const char* op_;
  int windows_[kMaxRanges];
  int n_ = 0;
};

// Host access for a communication library (Backend::begin_host_access): a window on
// [p, p+bytes) until end_host_access(token). Returns 0 (and end_host_access(0) does nothing)
// when the range is empty or host memory.
int64_t begin_host_access(const void* p, size_t bytes);
void end_host_access(int64_t token);

}  // namespace exatrain::guarded

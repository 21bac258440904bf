// The guarded CPU backend: the CPU backend's ops over device memory that host code cannot touch
// outside an op. Every allocation is its own mapping whose pages are PROT_NONE; an op makes the
// ranges it reads and writes accessible for its duration (reference-counted per page, so
// overlapping ranges and communication in flight keep their access), a communication library
// gets the same through begin_host_access / end_host_access. Any other access faults, and the
// fault handler names the allocation, the offset and the op (or "outside any op") before the
// process aborts. Selected with `--set train.backend=cpu-guarded`; the equivalence suite runs on it.
//
// A test instrument, not a fast path: every op costs a few mprotect calls, the page-table
// updates and TLB refills behind them (bench/bench_guarded_backend: a small Gpt step about
// 1.1-1.25x the CPU backend's on a noisy 2-core machine). One thread calls into it at a time
// (OpenMP inside the ops is fine); a second thread fails with an error, see guarded_memory.hpp.
// System calls given device memory outside an op (write(2) of an arena, process_vm_readv of a
// peer) fail with EFAULT instead of faulting. Results are bit-identical to make_cpu_backend
// with the same threads and parallel_min_work.
#pragma once
#include <cstdint>
#include <memory>

#include "backend/backend.hpp"

namespace exatrain {

std::unique_ptr<Backend> make_guarded_cpu_backend(int threads = 0, int64_t parallel_min_work = 1 << 15);

}  // namespace exatrain

// The guarded CPU backend: the CPU backend's ops over device memory that host code cannot touch
// outside an op. Every allocation is its own mapping whose pages are PROT_NONE; an op makes the
// ranges it reads and writes accessible for its duration (reference-counted per page, so
// overlapping ranges and communication in flight keep their access), a communication library
// gets the same through begin_host_access / end_host_access. Any other access faults, and the
// fault handler names the allocation, the offset and the op (or "outside any op") before the
// process aborts. Selected with `--set train.backend=cpu-guarded`; the equivalence suite runs on it.
#pragma once
#include <cstdint>
#include <memory>

#include "backend/backend.hpp"

namespace exatrain {

std::unique_ptr<Backend> make_guarded_cpu_backend(int threads = 0, int64_t parallel_min_work = 1 << 15);

}  // namespace exatrain

#include "backend/backend.hpp"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "backend/cpu/guarded_backend.hpp"
#ifdef EXATRAIN_HAVE_CUDA
#include "backend/cuda/cuda_backend.hpp"
#endif
#include "core/check.hpp"

namespace exatrain {

void Backend::wait(Stream&, const Event& e) {
  EXA_CHECK(e.recorded, "{} backend: a stream waits for an event that was never recorded", name());
}

void Backend::synchronize(const Event& e) {
  EXA_CHECK(e.recorded, "{} backend: synchronize on an event that was never recorded", name());
}

void* Backend::alloc_host(size_t bytes) {
  const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  EXA_CHECK(p != nullptr, "{} backend: cannot allocate {} bytes of host staging memory", name(), bytes);
  return p;
}

void Backend::free_host(void* p) { std::free(p); }

DeviceBuffer::DeviceBuffer(Backend& be, int64_t n, const char* label, bool lazy) : be_(&be), n_(n) {
  if (n <= 0) {
    n_ = 0;
    return;
  }
  const size_t bytes = sizeof(float) * size_t(n);
  p_ = static_cast<float*>(lazy ? be.alloc_bytes_lazy(bytes) : be.alloc_bytes(bytes));
  if (label) be.label(p_, label);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  std::swap(be_, o.be_);
  std::swap(p_, o.p_);
  std::swap(n_, o.n_);
  return *this;
}

void DeviceBuffer::reset() {
  if (be_ && p_) be_->free_bytes(p_);
  p_ = nullptr;
  n_ = 0;
}

#ifdef EXATRAIN_HAVE_CUDA
int cuda_visible_devices(std::string* why);  // cuda/cuda_backend.cpp
bool cuda_backend_built() { return true; }
int visible_cuda_devices(std::string* why) { return cuda_visible_devices(why); }
#else
bool cuda_backend_built() { return false; }
int visible_cuda_devices(std::string* why) {
  if (why) *why = "no CUDA device visible: this exatrain was built without the CUDA backend (EXATRAIN_CUDA=OFF)";
  return 0;
}
#endif

std::unique_ptr<Backend> make_backend(const std::string& name, int threads, int64_t parallel_min_work) {
  if (name == "cpu") return make_cpu_backend(threads, parallel_min_work);
  if (name == "cpu-guarded") return make_guarded_cpu_backend(threads, parallel_min_work);
  if (name == "cuda") {
#ifdef EXATRAIN_HAVE_CUDA
    return make_cuda_backend();
#else
    EXA_FAIL("[train] backend = \"cuda\" (or device = \"cuda\"): this exatrain was built without the CUDA "
             "backend (configure with -DEXATRAIN_CUDA=ON where nvcc is installed; docs/cuda.md), or set "
             "[train] device = \"cpu\"");
#endif
  }
  EXA_FAIL("[train] backend \"{}\" is not known: expected \"cpu\", \"cpu-guarded\" or \"cuda\"", name);
}

}  // namespace exatrain

// The compute interface the model and the runtime are written against: the DEVICE BOUNDARY.
// Every pointer passed to an op is a "device pointer" obtained from alloc(); no code outside
// src/backend/ dereferences one (model, optimizer, parallel runtime and trainer alike): what they
// do to device memory is an op here (copies, add_inplace, scale, sums of squares, fills, page
// release, staging copies to and from host memory). So a CUDA backend (cuBLAS + kernels + NCCL) can
// implement this class without touching the code above it, and the guarded CPU backend
// (cpu/guarded_backend.hpp: device memory is PROT_NONE except inside an op) proves on the CPU
// that nothing above reaches around it.
//
// Owns (room backend/): the ops, device memory, host staging memory, host-access scopes, streams and
// events, make_backend; cpu/ (the CPU backend) and cpu/guarded_* (the guarded CPU backend).
// May use: core/.
//
// Conventions (all tensors are dense, row-major, float32 unless said otherwise):
//   N = rows (B*T tokens), C = channels, O = output features, F = ffn hidden (local shard),
//   B = batch, T = sequence length, Hq/Hkv = local query / key-value heads, D = head dim.
//   Ops whose name ends in _backward ACCUMULATE (+=) into parameter gradients; for input
//   gradients the comment of each op says whether it overwrites (=) or accumulates (+=).
// Determinism: every op produces bit-identical results for identical inputs and an identical
// thread count (reductions have a fixed order; no atomics).
//
// Streams and events: ops run on the backend's compute stream in submission order. A stream
// orders work; an event marks a point in a stream: record(e, s) completes e when everything
// submitted to s before it has completed; wait(s, e) makes later work on s wait for e;
// synchronize(e) blocks the host until e. The trainer records an event when a unit's gradients
// are final and the data-parallel reduction waits for it before a collective reads them (on a
// GPU: a communication stream waiting on the compute stream). The CPU backends run every op to
// completion in the calling thread, so their streams are trivially ordered: record marks the
// event done, wait and synchronize only check that it was recorded.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace exatrain {

class Stream {
 public:
  virtual ~Stream() = default;
};

class Event {
 public:
  virtual ~Event() = default;
  bool recorded = false;  // host-synchronous backends: set by record()
};

// The scalars of one lamb_update (Backend): bc_i = 1 - beta_i^step.
struct LambStep {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-6f, weight_decay = 0, bc1 = 1, bc2 = 1, grad_scale = 1;
};
// The scalars of one adafactor_update (Backend): beta2t = 1 - step^decay_rate.
struct AdafactorStep {
  float lr = 0, beta1 = 0, beta2t = 0, eps1 = 1e-30f, clip = 1, weight_decay = 0, grad_scale = 1;
};

// 16-bit floating-point storage, one element per uint16_t: bfloat16 (the upper 16 bits of a float:
// 8 exponent bits, 7 mantissa bits) or IEEE 754 binary16 (5 exponent bits, 10 mantissa bits).
// Mixed-precision training (docs/precision.md) keeps a 16-bit copy of the weights and of the GEMM
// inputs it saves for backward; every product of two 16-bit values and every sum is in float32.
enum class Half { bf16, f16 };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // ---- streams and events (see the header comment; defaults: host-synchronous) -------------
  virtual Stream& compute_stream() { return compute_; }
  virtual std::unique_ptr<Stream> create_stream() { return std::make_unique<Stream>(); }
  virtual std::unique_ptr<Event> create_event() { return std::make_unique<Event>(); }
  virtual void record(Event& e, Stream&) { e.recorded = true; }
  virtual void wait(Stream& s, const Event& e);   // checks that e was recorded
  virtual void synchronize(const Event& e);       // likewise
  virtual void synchronize() {}                    // every stream

  // ---- memory ------------------------------------------------------------------------------
  // alloc_bytes returns zeroed, 64-byte aligned device memory; free_bytes(nullptr) is a no-op.
  virtual void* alloc_bytes(size_t bytes) = 0;
  virtual void free_bytes(void* p) = 0;
  // Zeroed, 64-byte aligned memory whose pages need not be resident until first written (CPU:
  // fresh anonymous mmap pages, never touched here). For arenas a caller fills only in part, e.g.
  // ZeRO 3's parameter arena (gathered one layer at a time) and ZeRO 2/3's gradient arena; freed
  // with free_bytes. Default: alloc_bytes.
  virtual void* alloc_bytes_lazy(size_t bytes) { return alloc_bytes(bytes); }
  virtual void upload(void* dst_device, const void* src_host, size_t bytes) = 0;
  virtual void download(void* dst_host, const void* src_device, size_t bytes) = 0;
  virtual void copy(void* dst_device, const void* src_device, size_t bytes) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  float* alloc(int64_t n) { return static_cast<float*>(alloc_bytes(sizeof(float) * size_t(n))); }
  // Names an allocation for error messages (e.g. "gradient arena"); a no-op unless the backend
  // reports on its memory (the guarded backend names it when host code touches it).
  virtual void label(const void* p, const std::string& what) {}
  // x[n] = value.
  virtual void fill(float* x, float value, int64_t n) = 0;
  // Returns the memory of x[0, n) to the system (CPU: madvise(MADV_DONTNEED) of the whole pages;
  // they read 0 until written again). A page that [x, x+n) shares with other data is released
  // too when it lies inside [free_begin, free_end), memory the caller says is free as well (e.g.
  // the neighbouring gradient buckets already reduced); otherwise only the part of it inside
  // [x, x+n) is set to partial_fill (0 for gradients that must read 0 again, NaN for released
  // ZeRO-3 parameters so that a pass using one poisons the loss).
  virtual void release(float* x, int64_t n, float partial_fill, const float* free_begin,
                       const float* free_end) = 0;
  void release(float* x, int64_t n, float partial_fill) { release(x, n, partial_fill, x, x + n); }

  // Host staging memory (CPU: plain aligned memory; CUDA: pinned), for copies between device
  // memory and files, the host's own arrays or a host-only library; freed with free_host.
  virtual void* alloc_host(size_t bytes);
  virtual void free_host(void* p);

  // Host access for a communication library that reads and writes device memory itself (MPI):
  // between begin_host_access(p, bytes) and end_host_access(token), [p, p+bytes) may be read and
  // written outside an op. Pointers that are not device memory are ignored. Returns a token.
  virtual int64_t begin_host_access(const void* p, size_t bytes) { return 0; }
  virtual void end_host_access(int64_t token) {}
  // Whether a communication library may be handed device pointers (with the access above).
  virtual bool host_accessible() const { return true; }

  // ---- GEMM --------------------------------------------------------------------------------
  // C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C[M,N]; op(X) = X^T when trans_x.
  // lda/ldb/ldc are the row strides of A, B, C as stored.
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                    float* C, int64_t ldc) = 0;
  // `batch` independent GEMMs; matrix i starts at A + i*stride_a (likewise B, C).
  virtual void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                    float alpha, const float* A, int64_t lda, int64_t stride_a,
                                    const float* B, int64_t ldb, int64_t stride_b, float beta,
                                    float* C, int64_t ldc, int64_t stride_c, int64_t batch) = 0;

  // ---- 16-bit GEMM and conversions (mixed precision) ------------------------------------------
  // C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C[M,N]; A, B 16-bit floats of `type`, C
  // float32, products and sums in float32 (fp32 accumulation). Strides as gemm(). beta = 0:
  // C is only written (NaN in C does not propagate), as gemm().
  virtual void gemm_half(Half type, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
                         int64_t ldc) = 0;
  // dst[n] = src rounded to nearest even (NaN stays NaN; fp16: beyond its range -> +-inf).
  virtual void f32_to_half(Half type, uint16_t* dst, const float* src, int64_t n) = 0;
  virtual void half_to_f32(Half type, float* dst, const uint16_t* src, int64_t n) = 0;  // exact
  // Which kernel gemm_half runs for `type` on this machine, decided when the backend was created
  // (one line for the run's log, e.g. "oneDNN bf16 matmul (avx512_core_bf16)").
  virtual std::string gemm_half_path(Half type) const { return "unspecified"; }
  // Working memory the backend holds itself, outside alloc_bytes (CPU: the conversion path's
  // float32 copies of gemm_half's operands, grown to the largest GEMM so far; CUDA: cuBLASLt's
  // workspace), for the trainer's accounted bytes. Default: none.
  virtual int64_t scratch_bytes() const { return 0; }

  // ---- elementwise and reductions -----------------------------------------------------------
  virtual void add_inplace(float* y, const float* x, int64_t n) = 0;                 // y += x
  virtual void add(float* out, const float* a, const float* b, int64_t n) = 0;       // out = a+b
  virtual void scale(float* x, float alpha, int64_t n) = 0;                          // x *= a
  virtual void add_bias(float* out, const float* bias, int64_t N, int64_t O) = 0;    // out[N,O] += bias[O]
  virtual void bias_backward(float* dbias, const float* dout, int64_t N, int64_t O) = 0;  // dbias[O] += sum_n dout[N,O]
  // sum of squares in double, fixed summation order independent of the thread count.
  virtual double sum_squares(const float* x, int64_t n) = 0;
  virtual double dot(const float* a, const float* b, int64_t n) = 0;  // sum a[i] b[i], in double
  // bfloat16 storage (the upper 16 bits of a float): f32 -> bf16 rounds to nearest even (NaN
  // stays NaN), bf16 -> f32 is exact.
  virtual void f32_to_bf16(uint16_t* dst, const float* src, int64_t n) = 0;
  virtual void bf16_to_f32(float* dst, const uint16_t* src, int64_t n) = 0;

  // ---- norms (statistics saved for backward) -------------------------------------------------
  // out[N,C] = (inp - mean) * rstd * w[C] + b[C]; mean[N], rstd[N] saved.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* w, const float* b, int64_t N, int64_t C,
                                 float eps) = 0;
  // dinp[N,C] += ..., dw[C] += ..., db[C] += ...
  virtual void layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                  const float* inp, const float* w, const float* mean,
                                  const float* rstd, int64_t N, int64_t C) = 0;
  // out[N,C] = inp * rstd * w[C]; rstd[N] = 1/sqrt(mean(inp^2) + eps) saved.
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w,
                               int64_t N, int64_t C, float eps) = 0;
  virtual void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                                const float* w, const float* rstd, int64_t N, int64_t C) = 0;

  // ---- activations -------------------------------------------------------------------------
  // GELU, tanh approximation (GPT-2). dinp = gelu'(inp) * dout (overwrites).
  virtual void gelu_forward(float* out, const float* inp, int64_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) = 0;
  // SwiGLU: inp[N, 2F] = [gate | up]; out[N,F] = silu(gate) * up. dinp[N,2F] overwritten.
  virtual void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F) = 0;
  virtual void swiglu_backward(float* dinp, const float* inp, const float* dout, int64_t N,
                               int64_t F) = 0;

  // ---- rotary position embedding (in place) --------------------------------------------------
  // x: [B, T, row_stride]; the first n_heads*D floats of each row are n_heads heads of size D.
  // Rotates pairs (i, i + D/2) of each head by angle t * theta^(-2i/D) ("rotate_half", as in
  // Hugging Face Llama). inverse=true rotates by the negative angle (= the backward pass).
  virtual void rope(float* x, int64_t B, int64_t T, int64_t row_stride, int64_t n_heads,
                    int64_t D, float theta, bool inverse) = 0;

  // ---- causal self-attention (grouped-query) ------------------------------------------------
  // qkv[B,T,(Hq+2*Hkv)*D]: per row Hq query heads, then Hkv key heads, then Hkv value heads.
  // out[B,T,Hq*D] = softmax_causal(q k^T / sqrt(D)) @ v; query head h reads key/value head
  // h / (Hq/Hkv). `operands`: nullopt, float32 products; a Half, mixed precision: the products may
  // take 16-bit operands (q, k, v, the probabilities, dout, dS) with float32 accumulation and softmax
  // statistics, as autocast's scaled_dot_product_attention runs (the model's q, k, v are already
  // rounded to that format). The CPU backend computes float32 either way; the CUDA backend runs its
  // fused flash kernel for a Half (cuda/flash_attention.hpp), its float32 GEMMs otherwise.
  // What the backward needs besides qkv is the backend's own: `saved`, of
  // attention_saved_floats(B, T, Hq, D, operands) floats, written by the forward and read by the
  // backward (the CPU backend, and CUDA for float32: the probabilities [B,Hq,T,T]; CUDA's flash
  // kernel: per-row log-sum-exp [B,Hq,T] and the output in 16 bits, [B,T,Hq*D]). out == nullptr:
  // only `saved` is computed (selective recomputation refills it before the backward), the same
  // bits as with out. Forward and backward of one tensor take the same `operands`.
  virtual int64_t attention_saved_floats(int64_t B, int64_t T, int64_t Hq, int64_t D,
                                         std::optional<Half> operands) const = 0;
  virtual void attention_forward(float* out, float* saved, const float* qkv, int64_t B,
                                 int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
                                 std::optional<Half> operands) = 0;
  // dqkv[B,T,(Hq+2*Hkv)*D] overwritten.
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv,
                                  const float* saved, int64_t B, int64_t T, int64_t Hq,
                                  int64_t Hkv, int64_t D, std::optional<Half> operands) = 0;

  // ---- embeddings ----------------------------------------------------------------------------
  // Vocabulary-parallel lookup: out[N,C] = wte[tok - vocab_start] when the token lies in
  // [vocab_start, vocab_start + V), else 0 (the tensor-parallel hooks then sum across ranks).
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                 int64_t vocab_start, int64_t V, int64_t N, int64_t C) = 0;
  virtual void embedding_backward(float* dwte, const float* dout, const int32_t* tokens,
                                  int64_t vocab_start, int64_t V, int64_t N, int64_t C) = 0;
  // out[B,T,C] += wpe[T,C] (broadcast over B); dwpe[T,C] += sum_b dout[B,T,C].
  virtual void positional_forward(float* out, const float* wpe, int64_t B, int64_t T,
                                  int64_t C) = 0;
  virtual void positional_backward(float* dwpe, const float* dout, int64_t B, int64_t T,
                                   int64_t C) = 0;
  // Mixed precision: the same two lookups from the 16-bit copy (format `type`) of wte [V,C] and
  // wpe [T,C], each element widened exactly (Megatron's bf16 embedding: the embeddings' fp32
  // masters are then needed by the optimizer only, so ZeRO can shard them like the matrices).
  virtual void embedding_forward_half(Half type, float* out, const int32_t* tokens, const uint16_t* wte,
                                      int64_t vocab_start, int64_t V, int64_t N, int64_t C) = 0;
  virtual void positional_forward_half(Half type, float* out, const uint16_t* wpe, int64_t B, int64_t T,
                                       int64_t C) = 0;

  // ---- fused cross-entropy over a (possibly vocabulary-sharded) logits matrix ----------------
  // The three steps are separate so the tensor-parallel hooks can all-reduce between them:
  //   1. xent_max:   rowmax[N] = max_v logits[N,V]                      (then all-reduce MAX)
  //   2. xent_stats: sumexp[N] = sum_v exp(logits - rowmax),
  //                  target_logit[N] = logits[n, target-vocab_start] or 0 if not in this slice
  //                                                                    (then all-reduce SUM)
  //   3. xent_backward (in place): logits[N,V] <- scale * (softmax - onehot(target)).
  // The loss of row n is log(sumexp) + rowmax - target_logit (computed on the host).
  // Row n starts at logits + n*ld (ld >= V): the model pads its logits' rows to an aligned width
  // (Gpt::logits_ld) so that the head's GEMMs get aligned rows; columns [V, ld) are neither read
  // nor written.
  virtual void xent_max(float* rowmax, const float* logits, int64_t N, int64_t V, int64_t ld) = 0;
  virtual void xent_stats(float* sumexp, float* target_logit, const float* logits,
                          const float* rowmax, const int32_t* targets, int64_t vocab_start,
                          int64_t N, int64_t V, int64_t ld) = 0;
  virtual void xent_backward(float* logits, const float* rowmax, const float* sumexp,
                             const int32_t* targets, int64_t vocab_start, float scale, int64_t N,
                             int64_t V, int64_t ld) = 0;

  // ---- optimizer -----------------------------------------------------------------------------
  // AdamW with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW:
  //   p -= lr*wd*p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
  //   p -= lr * (m/bc1) / (sqrt(v/bc2) + eps),  bc_i = 1 - b_i^step.
  // grad_scale multiplies g first (used for global-norm clipping).
  virtual void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            float bias_correction1, float bias_correction2,
                            float grad_scale) = 0;
  // Heavy-ball momentum with an optional Nesterov look-ahead (torch.optim.SGD's, as Muon uses it;
  // optim/muon.hpp): g = grad_scale * grad;  buf = momentum * buf + g;
  //   out = nesterov ? g + momentum * buf : buf.   out[n] is overwritten; buf[n] is updated.
  virtual void momentum_update(float* out, float* buf, const float* grad, int64_t n, float momentum,
                               bool nesterov, float grad_scale) = 0;
  // torch.optim.SGD (dampening 0, L2 weight decay): g = grad_scale grad + wd p;
  //   buf = momentum buf + g;  d = nesterov ? g + momentum buf : buf;  p -= lr d.
  virtual void sgd_update(float* param, const float* grad, float* buf, int64_t n, float lr, float momentum,
                          bool nesterov, float weight_decay, float grad_scale) = 0;
  // Lion (Chen et al. 2023, arXiv 2302.06675, Algorithm 2): g = grad_scale grad;
  //   c = b1 m + (1 - b1) g;  p = p (1 - lr wd) - lr sign(c);  m = b2 m + (1 - b2) g.
  virtual void lion_update(float* param, const float* grad, float* m, int64_t n, float lr, float beta1,
                           float beta2, float weight_decay, float grad_scale) = 0;
  // LAMB (You et al. 2019, arXiv 1904.00962, Algorithm 2) on one whole entry of n elements:
  //   Adam's m, v (as adamw_update);  r = (m / bc1) / (sqrt(v / bc2) + eps) + wd p   (into scratch[n]);
  //   p -= lr t r,  trust ratio t = |p| / |r| (2-norms of the entry; 1 when either is 0).
  virtual void lamb_update(float* param, const float* grad, float* m, float* v, float* scratch, int64_t n,
                           const LambStep& s) = 0;
  // Adafactor (Shazeer & Stern 2018, arXiv 1804.04235) as Hugging Face's (relative_step = false) on
  // one whole entry of rows x cols elements (rows = 1 for a vector); g = grad_scale grad:
  //   factored (row [rows], col [cols], v null): row = b2t row + (1 - b2t) mean_j (g^2 + eps1),
  //     col likewise over i;  U = g / sqrt(row_i / mean(row) * col_j);
  //   else (v [rows cols], row = col = null): v = b2t v + (1 - b2t)(g^2 + eps1);  U = g / sqrt(v);
  //   U = lr U / max(1, RMS(U) / clip);  with m [rows cols] (beta1 > 0): m = b1 m + (1 - b1) U, U = m;
  //   p = p (1 - lr wd) - U.   scratch [rows cols] holds U.
  virtual void adafactor_update(float* param, const float* grad, float* row, float* col, float* v, float* m,
                                float* scratch, int64_t rows, int64_t cols, const AdafactorStep& s) = 0;
  // Adam's direction without the step (Shampoo's grafting): m, v as adamw_update (g = grad_scale grad);
  //   out = (m / bc1) / (sqrt(v / bc2) + eps).
  virtual void adam_direction(float* out, const float* grad, float* m, float* v, int64_t n, float beta1,
                              float beta2, float eps, float bc1, float bc2, float grad_scale) = 0;
  // The inverse p-th root of a symmetric positive semi-definite A [n, n] (Shampoo's L^{-1/4}): with A = Q diag(λ) Qᵀ, out = Q diag((max(λ, 0) + eps)^{-1/p}) Qᵀ, computed
  // in double. Returns false, leaving out untouched, when the eigendecomposition fails or the
  // result is not finite (the caller keeps its previous root and counts the fallback).
  virtual bool sym_inverse_root(float* out, const float* A, int64_t n, double eps, int p) = 0;
  // SOAP's eigenbasis (Vyas et al. 2024, arXiv 2409.11321; its get_orthogonal_matrix) of a symmetric
  // A [n, n]: Q [n, n] with A's eigenvectors in its columns, eigenvalues descending, in double
  // (LAPACK dsyevd). Returns false, leaving Q untouched, when that fails or is not finite.
  virtual bool sym_eigenbasis(float* Q, const float* A, int64_t n) = 0;
  // SOAP's refresh of an eigenbasis Q [n, n] of A [n, n] (its get_orthogonal_matrix_QR): Q's columns
  // sorted by their Rayleigh quotients diag(Q^T A Q), descending (stable), then one power-iteration
  // step and a QR factorisation: Q = qr(A Q_sorted).Q (Householder: LAPACK dgeqrf + dorgqr, in
  // double). order [n] (host memory) receives the sort: sorted column j is old column order[j].
  // Returns false, leaving Q and order untouched, when that fails or is not finite.
  virtual bool power_qr_refresh(float* Q, const float* A, int64_t n, int64_t* order) = 0;
  // a [rows, cols] <- a[row_order[i], col_order[j]] (host index arrays, each a permutation; null:
  // that axis unchanged). SOAP's second moment follows its basis's sorted columns.
  virtual void permute_matrix(float* a, int64_t rows, int64_t cols, const int64_t* row_order,
                              const int64_t* col_order) = 0;
  // K-FAC's eigendecomposition of a factor A [n, n], symmetric positive semi-definite (kfac-pytorch's
  // torch.linalg.eigh followed by clamp(min=0)): Q [n, n] with A's eigenvectors in its columns, d [n]
  // its eigenvalues ascending and clamped at 0 (negative ones are rounding), in double (LAPACK
  // dsyevd). Returns false, leaving Q and d untouched, when that fails or is not finite.
  virtual bool sym_eigh(float* Q, float* d, const float* A, int64_t n) = 0;
  // K-FAC's preconditioning in the factors' eigenbasis: V [rows, cols],
  //   V[i, j] /= dg[i] * da[j] + damping      (dg [rows], da [cols]: the factors' eigenvalues).
  virtual void eigen_damped_divide(float* V, const float* dg, const float* da, int64_t rows, int64_t cols,
                                   float damping) = 0;

  // ---- gradient compression (parallel/compressors.hpp, docs/compression.md) -----------------
  // Indices are int32 positions inside the buffer they refer to (a gradient bucket holds fewer
  // than 2^31 floats). An index outside [0, n) is an Error naming the op (indices arrive from other
  // ranks). Every op is deterministic: the same inputs give the same bits on every rank.
  // The k entries of x[n] of largest magnitude (a NaN counts as the largest; ties: the lower
  // index first), in ascending index order: idx[k] = base + position, val[k] = x[position].
  // 0 <= k <= n (base places a piece's indices in the bucket it belongs to).
  virtual void topk_abs(int32_t* idx, float* val, const float* x, int64_t n, int64_t k, int64_t base) = 0;
  // s magnitudes of x[n], stratified (DGC's sampled threshold): out[j] = |x[i_j]| with i_j drawn
  // from [floor(j n / s), floor((j+1) n / s)) by splitmix64(seed, j). 1 <= s <= n.
  virtual void sample_abs(float* out, const float* x, int64_t n, int64_t s, uint64_t seed) = 0;
  // The entries of x[n] with |x| >= threshold (NaN included), ascending: the first min(count, cap)
  // of them into idx (base + position) and val; returns count (which may exceed cap).
  virtual int64_t select_abs_at_least(int32_t* idx, float* val, const float* x, int64_t n, float threshold,
                                      int64_t cap, int64_t base) = 0;
  // out[i] = x[idx[i]], i < k (x has n elements).
  virtual void gather(float* out, const float* x, int64_t n, const int32_t* idx, int64_t k) = 0;
  // x[idx[i] - base] += val[i] for i = 0, 1, ..., k-1 in that order (repeated indices add up in
  // order); base: the first index x holds (a region of a larger index space).
  virtual void scatter_add(float* x, int64_t n, const int32_t* idx, const float* val, int64_t k, int64_t base) = 0;
  // x[idx[i]] = value, i < k.
  virtual void scatter_fill(float* x, int64_t n, const int32_t* idx, int64_t k, float value) = 0;
  // Blocks of x[n]: block b = x[b B, min(n, (b+1) B)) with B = block, nb = ceil(n / B) of them.
  // out[nb] = each block's sum of squares (in double, rounded to float).
  virtual void block_sum_squares(float* out, const float* x, int64_t n, int64_t block) = 0;
  // out[j B + i] = x[blocks[j] B + i] (0 past x's end), j < kb, i < B.
  virtual void gather_blocks(float* out, const float* x, int64_t n, const int32_t* blocks, int64_t kb,
                             int64_t block) = 0;
  // x[blocks[j] B + i] += val[j B + i] inside x, for j = 0 .. kb-1 in order.
  virtual void scatter_add_blocks(float* x, int64_t n, const int32_t* blocks, const float* val, int64_t kb,
                                  int64_t block) = 0;
  // x[blocks[j] B + i] = value inside x.
  virtual void fill_blocks(float* x, int64_t n, const int32_t* blocks, int64_t kb, int64_t block, float value) = 0;
  // Sum of |x| in double, fixed order.
  virtual double sum_abs(const float* x, int64_t n) = 0;
  // 1-bit signs: bits[ceil(n / 32)], bit j of word w set when x[32 w + j] >= 0 (unset for x < 0
  // and past n).
  virtual void sign_pack(int32_t* bits, const float* x, int64_t n) = 0;
  // x[i] += bit i set ? scale : -scale, i < n.
  virtual void sign_unpack_add(float* x, const int32_t* bits, int64_t n, float scale) = 0;
  // Gram-Schmidt on the columns of P [rows, cols] (row-major), in double, as PyTorch's PowerSGD
  // hook (_orthogonalize_gram_schmidt, its default epsilon 0): column i /= |column i| (a zero
  // column stays 0, where PyTorch's would be NaN), then its projection is removed from the later
  // columns. An epsilon added to the norm would leave the columns of a rank-deficient P visibly
  // non-orthogonal (the nearly dependent column is rounding noise, normalised).
  virtual void orthonormalize_columns(float* P, int64_t rows, int64_t cols) = 0;
  // |a ∩ b| of two ascending index lists.
  virtual int64_t count_common(const int32_t* a, int64_t ka, const int32_t* b, int64_t kb) = 0;
  // below[r] (host) = how many of the ascending idx[k] are < bounds[r] (host), r < nb.
  virtual void count_below(int64_t* below, const int32_t* idx, int64_t k, const int64_t* bounds, int64_t nb) = 0;

  // ---- instrumentation -----------------------------------------------------------------------
  // Seconds and floating-point operations spent in gemm / gemm_strided_batched / gemm_half since reset.
  double gemm_seconds = 0, gemm_flops = 0;

 private:
  Stream compute_;
};

// A device allocation of n floats that frees itself (move-only). Empty when n == 0.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& be, int64_t n, const char* label = nullptr, bool lazy = false);
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  float* data() const { return p_; }
  int64_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  void reset();

 private:
  Backend* be_ = nullptr;
  float* p_ = nullptr;
  int64_t n_ = 0;
};

// Host staging memory of n elements of T from Backend::alloc_host (move-only).
template <class T>
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(Backend& be, int64_t n)
      : be_(&be), p_(static_cast<T*>(be.alloc_host(sizeof(T) * size_t(n > 0 ? n : 1)))), n_(n) {}
  ~HostBuffer() {
    if (be_) be_->free_host(p_);
  }
  HostBuffer(HostBuffer&& o) noexcept : be_(o.be_), p_(o.p_), n_(o.n_) { o.be_ = nullptr, o.p_ = nullptr, o.n_ = 0; }
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    std::swap(be_, o.be_), std::swap(p_, o.p_), std::swap(n_, o.n_);
    return *this;
  }
  T* data() const { return p_; }
  int64_t size() const { return n_; }
  T& operator[](int64_t i) const { return p_[i]; }

 private:
  Backend* be_ = nullptr;
  T* p_ = nullptr;
  int64_t n_ = 0;
};

// The CPU backend (OpenBLAS sgemm + OpenMP kernels). `threads` <= 0: all cores.
// Kernels smaller than parallel_min_work elements run single-threaded (0: always parallel).
std::unique_ptr<Backend> make_cpu_backend(int threads = 0, int64_t parallel_min_work = 1 << 15);

// Whether this build has the CUDA backend (CMake's EXATRAIN_CUDA; docs/cuda.md), and how many CUDA
// devices this process sees (cudaGetDeviceCount). 0 without the CUDA backend, a driver or a device;
// `why` (optional) then says which, e.g. "no CUDA device visible: cudaGetDeviceCount = 0 (...)".
bool cuda_backend_built();
int visible_cuda_devices(std::string* why = nullptr);

// The backend named in the job ([train] backend): "cpu", "cpu-guarded" (the CPU backend with
// device memory the host cannot touch outside an op: cpu/guarded_backend.hpp) or "cuda" (one GPU:
// the node-local rank's, cuda/cuda_backend.hpp; an error naming the reason when this build has no
// CUDA backend or no device is visible). Unknown names are an error listing the known ones.
std::unique_ptr<Backend> make_backend(const std::string& name, int threads = 0,
                                      int64_t parallel_min_work = 1 << 15);

}  // namespace exatrain

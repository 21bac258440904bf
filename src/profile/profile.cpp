#include "profile/profile.hpp"

#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "core/check.hpp"
#include "core/profile_cache.hpp"

namespace exatrain::profile {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The fastest of `reps` runs of f.
template <class F>
double fastest(int reps, F f) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// The twelve GEMMs of one layer (QKV, out-projection, fc1, fc2 of a GELU layer, f = 4h: forward,
// weight gradient, input gradient) on a tp rank's shard; returns GFLOP/s.
double layer_gemm_gflops(Backend& be, int64_t h, int64_t tp, int64_t tokens, int reps) {
  const int64_t f = 4 * h, N = tokens;
  struct Lin { int64_t out, in; };
  const Lin lins[] = {{3 * h / tp, h}, {h, h / tp}, {f / tp, h}, {h, f / tp}};
  const int64_t big = std::max(f, 3 * h);
  float* x = be.alloc(N * big);
  float* y = be.alloc(N * big);
  float* w = be.alloc(big * h);
  float* dw = be.alloc(big * h);
  for (float* p : {x, y, w, dw}) be.fill(p, 0.01f, p == x || p == y ? N * big : big * h);
  double flops = 0;
  for (const Lin& l : lins) flops += 3 * 2.0 * double(N) * double(l.out) * double(l.in);
  const double s = fastest(reps, [&] {
    for (const Lin& l : lins) {
      be.gemm(false, true, N, l.out, l.in, 1.0f, x, l.in, w, l.in, 0.0f, y, l.out);
      be.gemm(true, false, l.out, l.in, N, 1.0f, y, l.out, x, l.in, 1.0f, dw, l.in);
      be.gemm(false, false, N, l.in, l.out, 1.0f, y, l.out, w, l.in, 0.0f, x, l.in);
    }
  });
  for (float* p : {x, y, w, dw}) be.free_bytes(p);
  return flops / s / 1e9;
}

double square_gemm_gflops(Backend& be, int64_t n, int reps) {
  float* a = be.alloc(n * n);
  float* b = be.alloc(n * n);
  float* c = be.alloc(n * n);
  for (float* p : {a, b, c}) be.fill(p, 0.01f, n * n);
  const double s = fastest(reps, [&] { be.gemm(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); });
  for (float* p : {a, b, c}) be.free_bytes(p);
  return 2.0 * double(n) * double(n) * double(n) / s / 1e9;
}

// The planner's smooth shape model fitted in log space: log rate = log(peak e) - log(1 + dh/w) -
// log(1 + th/t), w = h/tp; a grid over (dh, th), e in closed form (the mean residual).
void fit_shape(DeviceProfile& d) {
  // Points far below the others were disturbed by other work (a shared machine): left out.
  std::vector<double> rates;
  for (const GemmPoint& p : d.gemms) rates.push_back(p.gflops);
  std::nth_element(rates.begin(), rates.begin() + long(rates.size() / 2), rates.end());
  const double median = rates[rates.size() / 2];
  std::vector<GemmPoint> kept;
  for (const GemmPoint& p : d.gemms)
    if (p.gflops >= median / 3) kept.push_back(p);
  d.dropped = int(d.gemms.size() - kept.size());
  double best = 1e300;
  for (int i = 0; i <= 60; ++i)
    for (int j = 0; j <= 60; ++j) {
      const double dh = i == 0 ? 0 : std::pow(2.0, (i - 1) * 0.2), th = j == 0 ? 0 : std::pow(2.0, (j - 1) * 0.2);
      double mean = 0;
      for (const GemmPoint& p : kept)
        mean += std::log(p.gflops) + std::log(1 + dh * p.tp / p.hidden) + std::log(1 + th / p.tokens);
      mean /= double(kept.size());
      double sq = 0;
      for (const GemmPoint& p : kept) {
        const double r = std::log(p.gflops) - (mean - std::log(1 + dh * p.tp / p.hidden) - std::log(1 + th / p.tokens));
        sq += r * r;
      }
      if (sq < best) {
        best = sq;
        d.dim_half = dh, d.tokens_half = th;
        d.gemm_efficiency = std::min(1.0, std::exp(mean) / d.peak_gflops);
        d.fit_rms = std::sqrt(sq / double(kept.size()));
      }
    }
}

// The backend's attention forward + backward as a fraction of peak on plan/compute.hpp's executed
// FLOPs: (3.5 x 4 s h x causal share) per token, the share (s + 128) / (2 s) capped at 1.
double attention_efficiency(Backend& be, double peak_gflops, int reps) {
  const int64_t B = 2, H = 8, D = 32, h = H * D;
  double total = 0;
  int n = 0;
  for (int64_t T : {128, 256}) {
    float* qkv = be.alloc(B * T * 3 * h);
    float* out = be.alloc(B * T * h);
    float* saved = be.alloc(be.attention_saved_floats(B, T, H, D, std::nullopt));
    float* dqkv = be.alloc(B * T * 3 * h);
    be.fill(qkv, 0.01f, B * T * 3 * h);
    be.fill(out, 0.01f, B * T * h);
    const double s = fastest(reps, [&] {
      be.attention_forward(out, saved, qkv, B, T, H, H, D, std::nullopt);
      be.attention_backward(dqkv, out, qkv, saved, B, T, H, H, D, std::nullopt);
    });
    const double share = std::min(1.0, (double(T) + 128) / (2.0 * double(T)));
    const double flops = 3.5 * 4.0 * double(T) * double(h) * share * double(B * T);
    total += flops / s / 1e9 / peak_gflops;
    ++n;
    for (float* p : {qkv, out, saved, dqkv}) be.free_bytes(p);
  }
  return std::min(1.0, total / n);
}

// GB/s of a large copy (bytes read + written) and of the layers' element-wise kernels.
void bandwidths(Backend& be, DeviceProfile& d, int reps) {
  const int64_t n = int64_t(32) << 20;  // 32 Mi floats = 128 MiB per buffer
  float* a = be.alloc(n);
  float* b = be.alloc(n);
  be.fill(a, 1.0f, n);
  be.fill(b, 1.0f, n);
  d.copy_gbs = 2.0 * 4.0 * double(n) / fastest(reps, [&] { be.copy(b, a, size_t(n) * 4); }) / 1e9;
  const double gelu = 2.0 * 4.0 * double(n) / fastest(reps, [&] { be.gelu_forward(b, a, n); }) / 1e9;
  const int64_t h = 1024, rows = n / h;
  float* w = be.alloc(h);
  float* bias = be.alloc(h);
  float* mean = be.alloc(rows);
  float* rstd = be.alloc(rows);
  be.fill(w, 1.0f, h);
  be.fill(bias, 0.0f, h);
  const double ln = 2.0 * 4.0 * double(n) /
                    fastest(reps, [&] { be.layernorm_forward(b, mean, rstd, a, w, bias, rows, h, 1e-5f); }) / 1e9;
  d.elementwise_gbs = std::min(d.copy_gbs, 0.5 * (gelu + ln));
  for (float* p : {a, b, w, bias, mean, rstd}) be.free_bytes(p);
}

// Released memory written again (refault_gbs, catalog/device.hpp): a buffer given back to the OS
// with Backend::release (as ZeRO 2 and 3 do every micro-batch) and filled, against the same fill of
// the mapped buffer; bytes per second of the difference, the fastest of the repetitions. 64 MiB
// (8 MiB with --quick), of the order of a layer's gradients at hidden 1024 (48 MiB). 0 where the
// difference is under 5% of the plain fill: nothing measurable to pay.
double refault_gbs(Backend& be, int reps, bool quick) {
  const int64_t n = int64_t(quick ? 2 : 16) << 20;  // floats
  float* a = be.alloc(n);
  be.fill(a, 1.0f, n);
  const double plain = fastest(reps + 2, [&] { be.fill(a, 2.0f, n); });
  const double released = fastest(reps + 2, [&] {
    be.release(a, n, 0.0f);
    be.fill(a, 2.0f, n);
  });
  be.free_bytes(a);
  if (released - plain < 0.05 * plain) return 0;
  return 4.0 * double(n) / (released - plain) / 1e9;
}

DeviceProfile measure_device(const std::string& name, int threads, const ProfileOptions& o, double memory_gib) {
  DeviceProfile d;
  d.name = name, d.threads = threads, d.memory_gib = memory_gib;
  omp_set_num_threads(threads);
  auto be = make_cpu_backend(threads);
  const int reps = o.quick ? 2 : o.reps;
  const std::vector<int64_t> hs = o.quick ? std::vector<int64_t>{256} : std::vector<int64_t>{256, 512};
  const std::vector<int64_t> tps = {1, 4};
  const std::vector<int64_t> toks = o.quick ? std::vector<int64_t>{128, 512} : std::vector<int64_t>{128, 512, 1024};
  for (int64_t h : hs)
    for (int64_t tp : tps)
      for (int64_t t : toks) d.gemms.push_back({h, tp, t, 0});
  // Rounds over all shapes, the best per shape: a burst of other work on shared cores spoils a
  // few consecutive measurements, rarely the same shape in every round.
  for (int round = 0; round < (o.quick ? 1 : 2); ++round)
    for (GemmPoint& p : d.gemms) p.gflops = std::max(p.gflops, layer_gemm_gflops(*be, p.hidden, p.tp, p.tokens, reps));
  d.peak_gflops = square_gemm_gflops(*be, o.quick ? 512 : 1024, reps);
  for (const GemmPoint& p : d.gemms) d.peak_gflops = std::max(d.peak_gflops, p.gflops);
  fit_shape(d);
  d.attention_efficiency = attention_efficiency(*be, d.peak_gflops, reps);
  bandwidths(*be, d, reps);
  d.refault_gbs = refault_gbs(*be, reps, o.quick);
  return d;
}

NetworkProfile measure_network(int world, int rank, const ProfileOptions& o) {
  NetworkProfile net;
  net.ranks = world;
  const int reps = o.quick ? 3 : 10;
  std::vector<char> buf(size_t(64) << 20);
  auto pingpong = [&](int bytes) {
    double best = 1e300;
    for (int r = 0; r < reps; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if (rank == 0) {
        MPI_Send(buf.data(), bytes, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
        MPI_Recv(buf.data(), bytes, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else if (rank == 1) {
        MPI_Recv(buf.data(), bytes, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(buf.data(), bytes, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
      }
      best = std::min(best, (MPI_Wtime() - t0) / 2);
    }
    MPI_Bcast(&best, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return best;
  };
  net.latency_us = pingpong(8) * 1e6;
  const int big = o.quick ? (4 << 20) : (64 << 20);
  net.pingpong_gbs = double(big) / pingpong(big) / 1e9;
  std::vector<float> data(size_t(big) / 4, 1.0f), out(size_t(big) / 4);
  for (int64_t bytes = 4096; bytes <= big; bytes *= 8) {
    double best = 1e300;
    for (int r = 0; r < reps; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allreduce(data.data(), out.data(), int(bytes / 4), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double t = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      best = std::min(best, t);
    }
    net.all_reduce.push_back({double(bytes), 2.0 * (world - 1) / world * double(bytes) / best / 1e9});
  }
  // plan/comm.hpp's ring all-reduce moves 2 (p-1)/p n bytes at intra_node_bw_gbs * kBusEfficiency
  // (0.8): the figure that reproduces the largest measured all-reduce.
  net.intra_node_bw_gbs = net.all_reduce.back().second / 0.8;
  return net;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

double memory_gib() {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? double(pages) * double(size) / double(1 << 30) : 1;
}

}  // namespace

MachineProfile profile_machine(const ProfileOptions& o) {
  const auto t0 = Clock::now();
  int init = 0, world = 1, rank = 0;
  MPI_Initialized(&init);
  if (init) {
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  MachineProfile p;
  p.fingerprint = machine_fingerprint();
  p.measured_at = utc_now();
  // Rank 0 measures the devices alone (the others wait: no contention for the cores), then every
  // rank takes part in the network measurements.
  if (rank == 0) {
    const int cores = std::max(1u, std::thread::hardware_concurrency());
    const double mem = memory_gib();
    p.devices.push_back(measure_device("cpu-local", 1, o, mem / cores));
    p.devices.push_back(measure_device("cpu-local-2c", cores, o, mem));
    // One core's share of the memory bandwidth when every core runs a rank.
    p.devices[0].copy_gbs = std::min(p.devices[0].copy_gbs, p.devices[1].copy_gbs / cores);
    p.devices[0].elementwise_gbs = std::min(p.devices[0].elementwise_gbs, p.devices[1].elementwise_gbs / cores);
    // Page faults too: the all-core rate is faulting threads of one process (one core's share here
    // 0.26 GB/s, where two single-thread processes at once measured 0.29 each: the share is within
    // 12% of what separate ranks pay, on the slow side). Not measurable on all cores: none for one.
    if (p.devices[1].refault_gbs > 0)
      p.devices[0].refault_gbs = std::min(p.devices[0].refault_gbs, p.devices[1].refault_gbs / cores);
    else
      p.devices[0].refault_gbs = 0;
  }
  if (world > 1) {
    MPI_Barrier(MPI_COMM_WORLD);
    p.network = measure_network(world, rank, o);
  }
  p.seconds = seconds_since(t0);
  return p;
}

std::string profile_toml(const MachineProfile& p) {
  std::string s = fmt::format(
      "# This machine as `exatrain profile` measured it ({}, {:.0f} s). Read by the catalog and the job parser\n"
      "# while its fingerprint matches this machine (core/profile_cache.hpp); refresh: run `exatrain profile` again.\n"
      "[profile]\nfingerprint = \"{}\"\nmeasured_at = \"{}\"\n",
      p.measured_at, p.seconds, p.fingerprint, p.measured_at);
  for (const DeviceProfile& d : p.devices) {
    const double peak = d.peak_gflops / 1e3;
    s += fmt::format("\n[{}]\ndescription = \"this machine, measured by exatrain profile: one rank on {} thread{}\"\n",
                     d.name, d.threads, d.threads == 1 ? "" : "s");
    s += fmt::format("# GEMMs: {} layer shapes ({} left out as disturbed), {:.0f}..{:.0f} GFLOP/s; shape fit rms {:.1f}%\n",
                     d.gemms.size(), d.dropped,
                     std::min_element(d.gemms.begin(), d.gemms.end(), [](auto& a, auto& b) { return a.gflops < b.gflops; })->gflops,
                     d.peak_gflops, 100 * d.fit_rms);
    s += fmt::format("peak_tflops_fp32 = {:.6g}\npeak_tflops_fp16 = {:.6g}\npeak_tflops_bf16 = {:.6g}\npeak_tflops_fp8 = {:.6g}\n",
                     peak, peak, peak, peak);
    s += fmt::format("hbm_gib = {:.4g}\nhbm_bw_gbs = {:.4g}\ngemm_efficiency = {:.4g}\ngemm_dim_half = {:.4g}\n"
                     "gemm_tokens_half = {:.4g}\nflash2_efficiency = {:.4g}\nbw_efficiency = {:.4g}\nrefault_gbs = {:.4g}\n"
                     "measured = true\n",
                     d.memory_gib, d.copy_gbs, d.gemm_efficiency, d.dim_half, d.tokens_half,
                     std::max(1e-3, d.attention_efficiency), std::min(1.0, d.elementwise_gbs / d.copy_gbs),
                     d.refault_gbs);
  }
  if (p.network) {
    const NetworkProfile& n = *p.network;
    s += fmt::format("\n[machine]\n# {} ranks: ping-pong {:.1f} us, {:.2f} GB/s; all-reduce bus bandwidth {:.2f} GB/s at {:.0f} MiB\n"
                     "intra_node_bw_gbs = {:.4g}\nintra_node_latency_us = {:.4g}\n",
                     n.ranks, n.latency_us, n.pingpong_gbs, n.all_reduce.back().second, n.all_reduce.back().first / (1 << 20),
                     n.intra_node_bw_gbs, std::max(0.01, n.latency_us));
  }
  return s;
}

std::string profile_summary(const MachineProfile& p) {
  std::string s = fmt::format("profile of this machine ({:.1f} s)\n", p.seconds);
  for (const DeviceProfile& d : p.devices)
    s += fmt::format("  {:<13} {} thread{}: GEMM peak {:.1f} GFLOP/s, shape fit e={:.3f} dim_half={:.3g} tokens_half={:.3g} "
                     "(rms {:.1f}%), attention {:.1f}% of peak, copy {:.1f} GB/s, element-wise {:.1f} GB/s, released memory "
                     "written again {:.2f} GB/s\n",
                     d.name, d.threads, d.threads == 1 ? "" : "s", d.peak_gflops, d.gemm_efficiency, d.dim_half,
                     d.tokens_half, 100 * d.fit_rms, 100 * d.attention_efficiency, d.copy_gbs, d.elementwise_gbs,
                     d.refault_gbs);
  if (p.network)
    s += fmt::format("  network       {} ranks: latency {:.2f} us, ping-pong {:.2f} GB/s, all-reduce bus {:.2f} GB/s\n",
                     p.network->ranks, p.network->latency_us, p.network->pingpong_gbs, p.network->all_reduce.back().second);
  else
    s += "  network       not measured (one rank: run `mpirun -np N exatrain profile` to measure the collectives)\n";
  return s;
}

}  // namespace exatrain::profile

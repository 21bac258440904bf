// Exhaustive search over valid plans for a model, a machine, a GPU count and a global batch:
// every field of [parallel] left `auto` ranges over all values that satisfy plan_error's rules;
// plans that do not fit in memory, less a `memory_headroom` fraction kept free, are discarded; the rest are ranked by predicted step time.
//
// Pruning (exact, never sampling): weights + gradients + optimizer state depend only on
// (tp, cp, pp, dp, zero), so a subtree whose activation-free memory already exceeds the device is
// skipped whole; and for fixed other fields memory grows with micro_batch, so the first
// micro_batch that does not fit ends that loop. Pruned plans count as searched, not feasible.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "job/job.hpp"
#include "plan/predict.hpp"

namespace exatrain::plan {

struct SearchResult {
  std::vector<Prediction> top;  // best first (at most top_k)
  // The best plan whose layout (tp, pp, dp, cp) differs from the winner's: the near-ties in `top`
  // often differ only in recompute or micro-batch, this one shows what the layout choice is worth.
  std::optional<Prediction> best_other_layout;
  int64_t searched = 0;         // plans in the space (valid by the rules), pruned ones included
  int64_t evaluated = 0;        // plans whose memory model ran (the rest were pruned)
  int64_t feasible = 0;         // plans that fit in memory
  double seconds = 0;
};

// Plans for AdamW at `precision`.
SearchResult search_plans(const ModelSpec& m, const MachineSpec& mach, const ParallelSpec& fixed,
                          Precision precision, int top_k,
                          const Calibration& cal = default_calibration(),
                          double memory_headroom = 0);
// Plans for the job's [train] optimizer (its state, its ZeRO rule, its step cost: Plan::set_optimizer)
// at its precision.
SearchResult search_plans(const ModelSpec& m, const MachineSpec& mach, const ParallelSpec& fixed,
                          const TrainSpec& train, int top_k,
                          const Calibration& cal = default_calibration(),
                          double memory_headroom = 0);

// `train`'s own choice of its "auto" fields (plan/resolve.cpp): the search above with every
// candidate as this trainer runs it (plan.hpp as_run_here), so that the ranking credits only what
// this trainer overlaps (on the `local` machine the search is given, with the shipped constants).
SearchResult search_runnable_plans(const ModelSpec& m, const MachineSpec& mach, const ParallelSpec& fixed,
                                   const TrainSpec& train, int top_k);

// Reference for tests: enumerates the same space with no pruning and predicts every plan (AdamW).
SearchResult brute_force_search(const ModelSpec& m, const MachineSpec& mach,
                                const ParallelSpec& fixed, Precision precision, int top_k,
                                const Calibration& cal = default_calibration(),
                                double memory_headroom = 0);

// `plan --optimizers`: the search once per optimizer of `optimizers`, each with the job's
// [optimizer] values where that optimizer has them (TrainSpec keeps every optimizer's; the
// parser fills only the job's) and its defaults otherwise. A per-step comparison: time and
// memory, not the steps each optimizer needs to reach a loss.
struct OptimizerSearch {
  std::string optimizer;
  SearchResult result;  // result.top: at most top_k, best first (empty: no plan fits)
};
std::vector<OptimizerSearch> compare_optimizers(const ModelSpec& m, const MachineSpec& mach, const ParallelSpec& fixed,
                                                const TrainSpec& train, const std::vector<std::string>& optimizers,
                                                int top_k, const Calibration& cal = default_calibration(),
                                                double memory_headroom = 0);

// Why `best` beats `runner_up`, in a few lines (field differences and the time components that
// differ most).
std::string explain_choice(const Prediction& best, const Prediction& runner_up);

}  // namespace exatrain::plan

// Validation machinery and the calibrated model's accuracy on the published runs.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "plan/validate.hpp"

using namespace exatrain;
using namespace exatrain::plan;

TEST(Validate, Spearman) {
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
  // Ties take the average rank: ranks (1.5,1.5,3) vs (1,2,3): rho = 0.866...
  EXPECT_NEAR(spearman({1, 1, 2}, {1, 2, 3}), std::sqrt(3.0) / 2, 1e-12);
}

TEST(Validate, PublishedRunsHeldOutBySourceWithinTarget) {
  // The guard of the planner is OUT OF SAMPLE: each source predicted with the constants fitted on
  // the other sources (leave-one-source-out). Thresholds: the figures of this model with a margin
  // (docs/planner.md "Validation": held out 7.00% overall, worst source 7.41%, rho 0.95, memory
  // 3.8%); the goals are 8% / 15% / 0.85 / 15%. The vendored copy
  // (bench/validation/README.md) makes this run in every checkout.
  std::string csv = std::string(EXATRAIN_SOURCE_DIR) + "/bench/validation/published_runs.csv";
  ASSERT_TRUE(std::filesystem::exists(csv)) << csv << " is missing";
  ValidationReport rep = validate_runs(csv);
  EXPECT_GE(rep.results.size(), 250u);
  EXPECT_LE(rep.held_out_mape_pct, 7.5) << format_report(rep, false);
  EXPECT_LE(rep.worst_held_out_pct, 9.0) << format_report(rep, false);
  EXPECT_GE(rep.held_out_rho, 0.90) << format_report(rep, false);
  EXPECT_LE(rep.memory_held_out.mape_pct, 4.5) << format_report(rep, false);
  // Every measured peak within 15% (the goal): 40 of 40 since FSDP under pipelining was
  // counted (torchtitan's 405B rows 90-95; row 108 the largest at +11.5%, row 91 +11.4%).
  EXPECT_EQ(rep.memory_held_out.points, 40) << format_report(rep, false);
  EXPECT_EQ(rep.memory_held_out.within_15, rep.memory_held_out.points) << format_report(rep, false);
  for (const auto& s : rep.sources) EXPECT_LE(s.held_out_mape_pct, 9.0) << s.source;
  // The shipped constants are the all-data fit (nothing tuned by hand): within 2%.
  for (const std::string& c : rep.fitted)
    EXPECT_NEAR(default_calibration().get(c) / rep.all_data_fit.get(c), 1.0, 0.02) << c;
  EXPECT_NEAR(default_calibration().fragmentation / rep.all_data_fit.fragmentation, 1.0, 0.02) << "fragmentation";
  EXPECT_NEAR(default_calibration().fragmentation_at_capacity, rep.all_data_fit.fragmentation_at_capacity, 0.002)
      << "fragmentation_at_capacity";
  // Fit calls over every row that ran (a measured peak or step) or failed out of memory. Every run
  // with a step time ran, so the 245 rows without a memory figure count: 273 of 288 right held out (272 before
  // Transformer Engine's fp8 linears were counted saving their fp8 inputs: one llm-foundry fp8 row),
  // 286 in-sample (docs/planner.md; 265 held out before BLOOM's eager CUDA context was counted);
  // 136 of 282 when llm-foundry's loss was read as eager PyTorch's (12 bytes a logit), 218 of 282
  // when `fits` compared the peak a monitor reports.
  EXPECT_EQ(rep.memory_held_out.calls(), 288) << format_report(rep, false);
  EXPECT_GE(rep.memory_held_out.calls_right(), 270) << format_report(rep, false);
  EXPECT_GE(rep.memory_stats.calls_right(), 283) << format_report(rep, false);
  EXPECT_EQ(rep.memory_held_out.oom_rows, 3);
  EXPECT_GE(rep.memory_held_out.oom_predicted, 1) << format_report(rep, false);  // row 47
  // --json lists every run that ran but is called too big held out (they are what the figure misses).
  int listed = 0;
  const nlohmann::json report = report_json(rep, default_calibration());
  for (const auto& m : report["memory"])
    listed += !m["measured_oom"].get<bool>() && !m["held_out_fits"].get<bool>();
  const MemoryStats& h = rep.memory_held_out;
  EXPECT_EQ(listed, (h.fit_rows - h.fit_predicted) + (h.ran_rows - h.ran_predicted));
  // Every fit behind these figures (the all-data fit and each fold) converged: none stopped at the
  // sweep cap, which the report would name.
  EXPECT_TRUE(rep.unconverged.empty()) << format_report(rep, false);
}

TEST(Validate, FrameworkBehaviourComesFromTheSourceAndNotes) {
  std::string csv = std::string(EXATRAIN_SOURCE_DIR) + "/bench/validation/published_runs.csv";
  std::vector<CsvRow> rows = read_csv(csv);
  int rowwise = 0, op = 0, triton = 0, compiled_loss = 0, async_tp = 0, early_stop = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    RunCase rc = case_from_row(rows[i], int(i) + 1);
    if (rc.skip_reason.find("float8 rowwise") == 0) ++rowwise;
    if (!rc.skip_reason.empty()) continue;
    if (rc.source == "bigscience-workshop/bigscience") {
      EXPECT_EQ(rc.plan.attention, Attention::unfused) << i + 1;
      EXPECT_FALSE(rc.plan.overlap_grad_reduce) << i + 1;  // DeepSpeed's engine reduces after the schedule
      EXPECT_FALSE(rc.plan.pp_scatter_gather) << i + 1;
    }
    // CUDA loaded its modules eagerly before PyTorch 1.13 (Oct 2022): the 2021-22 sources only.
    const bool before_lazy_loading = rc.source == "bigscience-workshop/bigscience" || rc.source == "Narayanan" ||
                                     rc.source == "Korthikanti" || rc.source == "Smith" || rc.source == "Zhang";
    EXPECT_EQ(rc.plan.cuda_modules_eager, before_lazy_loading) << i + 1;
    if (rc.source == "pytorch/torchtitan" && rc.plan.recompute == Recompute::op) ++op;
    // torchtitan's async TP ("AsyncTP" in row 89's notes and rows 90-95's precision, "async TP"
    // in the June 2025 table's) overlaps the forward passes' collectives only (job/job.hpp
    // TpCommOverlap); no other usable row states a tensor-parallel overlap.
    const int row = int(i) + 1;
    const bool async_tp_row =
        row == 89 || (row >= 90 && row <= 95) || row == 97 || row == 99 || row == 103 || row == 105;
    EXPECT_EQ(rc.plan.tp_comm_overlap, async_tp_row ? TpCommOverlap::forward : TpCommOverlap::none) << i + 1;
    async_tp += async_tp_row;
    // torchtitan's loss, by row: eager without compile (rows 78, 85: Dec 2024 eager); the Dec
    // 2024 compiled rows read with the fused class as a stand-in (docs/planner.md caveat); the
    // June 2025 asyncTP rows (96-109 less the rowwise ones, refused) and the trainy-whitefiber
    // H200 rows 108-109 (its command runs --training.compile) compiled.
    if (rc.source == "pytorch/torchtitan") {
      const CrossEntropy want = row == 78 || row == 85 ? CrossEntropy::eager
                                : row >= 96          ? CrossEntropy::compiled
                                                     : CrossEntropy::fused;
      EXPECT_EQ(rc.plan.cross_entropy, want) << row;
      EXPECT_EQ(rc.plan.fused_kernels, want != CrossEntropy::eager) << row;
      if (want == CrossEntropy::compiled) ++compiled_loss;
    }
    if (rc.source == "mosaicml/llm-foundry") {
      EXPECT_EQ(rc.plan.cross_entropy, CrossEntropy::flash_attn) << i + 1;  // loss_fn's default
    }
    if (rc.source == "Narayanan") {
      EXPECT_EQ(rc.plan.cross_entropy, CrossEntropy::fused) << i + 1;
    }
    if (rc.source == "mosaicml/llm-foundry" && rc.plan.attention == Attention::flash1) ++triton;
    // Only the H200 rows state torchao's float8 all-gather ("float8 linears + fp8 all-gather").
    EXPECT_EQ(rc.plan.fp8_all_gather, rc.source == "pytorch/torchtitan" && (i + 1 == 108 || i + 1 == 109)) << i + 1;
    // composer's FSDP is torch's FullyShardedDataParallel (FSDP1); no other source's framework is.
    EXPECT_EQ(rc.plan.fsdp_grad_pass, rc.source == "mosaicml/llm-foundry") << i + 1;
    // FSDP2 under torch.distributed.pipelining keeps the units gathered and the gradients unsharded
    // for the step: torchtitan's pipelined 405B rows 90-95, and no other row.
    EXPECT_EQ(rc.plan.fsdp_unsharded_in_pipeline, row >= 90 && row <= 95) << row;
    // Full recomputation stops before the last GEMM under PyTorch's non-reentrant checkpoint only:
    // never on Megatron's or DeepSpeed's rows, nor on llm-foundry's 2023 (Triton, PURE) sweep.
    if (rc.source != "mosaicml/llm-foundry" && rc.source != "pytorch/torchtitan") {
      EXPECT_FALSE(rc.plan.recompute_early_stop) << row;
    }
    if (rc.plan.attention == Attention::flash1) {
      EXPECT_FALSE(rc.plan.recompute_early_stop) << row;
    }
    early_stop += rc.plan.recompute_early_stop && rc.plan.recompute == Recompute::full;
    // No published row states Megatron-Core's overlapped pipeline sends (the never-fitted ones do).
    EXPECT_FALSE(rc.plan.overlap_p2p_comm) << row;
  }
  // llm-foundry's 2024 sweep's 49 recomputing bf16 runs (its one recomputing TE fp8 run, row 180,
  // saves after its forward) and torchtitan's 16 (compiled, so eager float8's exception takes none).
  EXPECT_EQ(early_stop, 49 + 16);
  EXPECT_EQ(rowwise, 4);  // refused with the reason: no rowwise fp8 GEMM rate in the catalog
  EXPECT_EQ(op, 12);      // torchtitan's "selective" is its op-level policy
  EXPECT_EQ(triton, 80);  // llm-foundry's older benchmark script: Triton attention, PURE precision
  EXPECT_EQ(compiled_loss, 10);  // the June 2025 asyncTP bf16/tensorwise rows (8) and the two H200 rows
  EXPECT_EQ(async_tp, 11);       // 70B rows 89, 97, 99, 405B rows 90-95 and 8B rows 103, 105
}

// The never-fitted runs (Megatron-Core with Transformer Engine) get what their recipes state:
// TE's cuDNN attention (flash3 class), current scaling for FP8-CS and delayed for NeMo 24.07's
// fp8_hybrid, 16-bit gradients (grad_reduce_in_fp32=False), the fp8 parameter gather under
// Megatron-FSDP, and the 405B's embedding and loss pipeline slots.
TEST(Validate, NeverFittedRowsTakeTheirRecipes) {
  const std::string csv = std::string(EXATRAIN_SOURCE_DIR) + "/bench/validation/never_fitted_runs.csv";
  const std::vector<CsvRow> rows = read_csv(csv);
  int bridge = 0, nemo = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const RunCase rc = case_from_row(rows[i], int(i) + 1);
    ASSERT_EQ(rc.skip_reason, "") << i + 1;
    EXPECT_EQ(rc.plan.attention, Attention::flash3) << i + 1;
    EXPECT_TRUE(rc.plan.grads_16bit) << i + 1;
    EXPECT_EQ(rc.plan.overlap_p2p_comm, rc.plan.vp > 1) << i + 1;  // the interleaved rows' recipes set it
    EXPECT_TRUE(rc.plan.fp8_saves_quantized_inputs && rc.plan.swiglu_saves_input_only) << i + 1;  // TE, fused SwiGLU
    const bool is_bridge = rc.source == "NVIDIA-NeMo/Megatron-Bridge";
    bridge += is_bridge, nemo += rc.source == "NVIDIA/NeMo";
    EXPECT_EQ(rc.plan.fp8_recipe, is_bridge ? Fp8Recipe::tensorwise : Fp8Recipe::delayed) << i + 1;
    EXPECT_EQ(rc.plan.fp8_all_gather, is_bridge) << i + 1;  // every Megatron-Bridge recipe sets fp8_param_gather
    if (rc.model.layers == 126) {  // 126 + 2 slots over pp 8 x vp 8: first and last virtual stage one layer
      std::vector<int64_t> stages(64, 2);
      stages.front() = stages.back() = 1;
      EXPECT_EQ(rc.plan.layers_per_stage, stages) << i + 1;
    } else {
      EXPECT_TRUE(rc.plan.layers_per_stage.empty()) << i + 1;
    }
  }
  EXPECT_EQ(bridge, 5);
  EXPECT_EQ(nemo, 2);
}

// What the Megatron-Core / TE reading cannot model is refused with the reason, never guessed: a
// block-scaled fp8 recipe, an fp8 row that states no recipe, a device without the flash3 class,
// embedding and loss slots that do not divide into the virtual stages.
TEST(Validate, NeverFittedRowsRefuseWhatTheirRecipesDoNotDetermine) {
  const std::string csv = std::string(EXATRAIN_SOURCE_DIR) + "/bench/validation/never_fitted_runs.csv";
  const std::vector<CsvRow> rows = read_csv(csv);
  CsvRow r = rows.at(2);  // Llama 3.1 405B, FP8-CS, account_for_* slots
  ASSERT_EQ(case_from_row(r, 3).skip_reason, "");
  auto refused = [&](const std::string& key, const std::string& value) {
    CsvRow c = r;
    c[key] = value;
    return case_from_row(c, 3).skip_reason;
  };
  EXPECT_EQ(refused("precision", "fp8 (FP8-MX)"), "fp8 block scaling (FP8-MX): no measured rate of block-scaled fp8 GEMMs in the catalog");
  CsvRow unstated = r;  // neither the precision cell nor the notes name the scaling
  unstated["precision"] = "fp8";
  unstated["notes"] = "Llama 3 shapes. account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split.";
  EXPECT_EQ(case_from_row(unstated, 3).skip_reason, "fp8 recipe not stated (current or delayed scaling)");
  EXPECT_NE(refused("gpu_type", "A100-SXM4-80GB (Selene)").find("flash3 class, which the catalog has for Hopper devices only, not a100-80g"),
            std::string::npos);
  EXPECT_EQ(refused("layers", "125"), "account_for_embedding/loss_in_pipeline_split: 125 layers + 2 slots do not divide into "
                                      "pp * vp = 64 virtual stages");
  CsvRow one_slot = r;
  one_slot["notes"] = "Transformer Engine fp8 current scaling. account_for_embedding_in_pipeline_split only.";
  EXPECT_EQ(case_from_row(one_slot, 3).skip_reason.find("only one of account_for_embedding_in_pipeline_split"), 0u);
  // A note that states a flag off does not turn it on.
  CsvRow off = r;
  off["notes"] += " overlap_p2p_comm=False.";
  EXPECT_FALSE(case_from_row(off, 3).plan.overlap_p2p_comm);
  EXPECT_TRUE(case_from_row(r, 3).plan.overlap_p2p_comm);
}

TEST(Validate, MissingCellsAreSkippedNotGuessed) {
  CsvRow row = {{"source", "x"}, {"model_name", "m"}, {"layers", "24"}, {"hidden", "2048"},
                {"heads", ""}, {"seq_len", "2048"}, {"vocab", "50257"}, {"notes", ""}};
  RunCase rc = case_from_row(row, 1);
  EXPECT_EQ(rc.skip_reason, "heads not stated");
}

TEST(Validate, UnstatedUnevenStagesAreAssumedBalanced) {
  // BLOOM-candidate 195B: 106 layers on pp 12, partition not stated -> balanced stages, reported.
  std::string csv = std::string(EXATRAIN_SOURCE_DIR) + "/bench/validation/published_runs.csv";
  std::vector<CsvRow> rows = read_csv(csv);
  // Rows whose notes state Megatron-DeepSpeed's transformer|embedding partition get the same
  // stages without an assumption.
  int assumed = 0;
  const std::vector<int64_t> balanced = {8, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 8};
  for (size_t i = 0; i < rows.size(); ++i) {
    RunCase rc = case_from_row(rows[i], int(i) + 1);
    if (rc.model.layers != 106 || rc.plan.pp != 12) continue;
    EXPECT_EQ(rc.skip_reason, "") << "row " << i + 1;
    EXPECT_EQ(rc.plan.layers_per_stage, balanced) << "row " << i + 1;
    if (rc.assumption.empty()) continue;
    ++assumed;
    EXPECT_EQ(rc.assumption, "stages not stated; assumed balanced [8,9,9,9,9,9,9,9,9,9,9,8]");
  }
  EXPECT_EQ(assumed, 2);  // rows 41 and 42
}

// A fit that stopped at its sweep cap is named in the report (the figures are then the best found,
// not a converged optimum), and only then.
TEST(Validate, ReportNamesFitsThatStoppedAtTheSweepCap) {
  ValidationReport rep;
  rep.fitted = {"a100.sustained"};
  rep.all_data_fit = default_calibration();
  EXPECT_EQ(format_report(rep, false).find("sweep cap"), std::string::npos);
  rep.unconverged = {"all sources", "Narayanan"};
  EXPECT_NE(format_report(rep, false).find("these fits stopped at their sweep cap while still improving (the best "
                                           "constants found, not a converged optimum): all sources, Narayanan"),
            std::string::npos)
      << format_report(rep, false);
  EXPECT_EQ(report_json(rep, default_calibration())["unconverged_fits"].size(), 2u);
}

// --rows prints every plan whole, whatever its length (a BLOOM row's ends in its 12 stages), and
// the columns after the plan start at the same place on every row.
TEST(Validate, RowsTableShowsEveryPlanWhole) {
  const std::string dir = ::testing::TempDir();
  const std::string src = std::string(EXATRAIN_SOURCE_DIR) + "/bench/validation/published_runs.csv";
  std::vector<std::string> lines;
  {
    std::ifstream in(src);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  const std::string csv = dir + "/rows_table.csv";
  {
    std::ofstream out(csv);
    out << lines[0] << "\n" << lines[1] << "\n" << lines[36] << "\n";  // SC21's row 1, BLOOM's row 36
  }
  const ValidationReport rep = validate_runs(csv, default_calibration(), {.held_out = false});
  ASSERT_EQ(rep.results.size(), 2u);
  const std::string table = format_report(rep, true);
  const std::string longest = plan_summary(rep.results[1].run.plan);
  ASSERT_GT(longest.size(), 66u) << longest;  // the old column's width, which cut it
  EXPECT_NE(table.find(longest), std::string::npos) << table;
  // The measured column, right-aligned: rows 1 and 36 end it at the same place.
  const size_t a = table.find("3.528"), b = table.find("105.2");
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(b, std::string::npos);
  EXPECT_EQ(a - table.rfind('\n', a), b - table.rfind('\n', b)) << table;
}

TEST(Validate, NeverFittedSourcesWithinTarget) {
  // Runs from sources no constant was ever fitted to (bench/validation/never_fitted_runs.csv:
  // Megatron-Bridge's and NeMo's published H100 fp8 throughput, Megatron-Core with Transformer
  // Engine), predicted with the shipped constants: the out-of-sample figure the issue names. Today
  // 7.3% over 7 rows, Megatron-Bridge 10.1% (+10.1% bias: its 2025-26 containers run the 8B 20%
  // faster than the model), NeMo 24.07 0.5%; 24.1% for Megatron-Bridge before TE's cuDNN attention,
  // 16-bit gradients, the embedding and loss pipeline slots, the overlapped pipeline sends and the
  // fp8 weight gather were
  // read from the recipes (docs/planner.md "Sources never fitted"). Thresholds: the goal
  // overall (8%), this figure with a margin per source (the goal is 15%).
  const std::string csv = std::string(EXATRAIN_SOURCE_DIR) + "/bench/validation/never_fitted_runs.csv";
  ASSERT_TRUE(std::filesystem::exists(csv)) << csv << " is missing";
  const ValidationReport rep = validate_runs(csv, default_calibration(), {.held_out = false});
  EXPECT_EQ(rep.skipped.size(), 0u) << format_report(rep, true);
  EXPECT_EQ(rep.results.size(), 7u);
  EXPECT_LE(rep.mape_pct, 8.0) << format_never_fitted(rep, csv);
  for (const auto& s : rep.sources) EXPECT_LE(s.mape_pct, 12.0) << s.source;
  // Every one of these runs ran: each is called fitting.
  EXPECT_EQ(rep.memory_stats.ran_predicted, rep.memory_stats.ran_rows) << format_report(rep, true);
  const std::string text = format_never_fitted(rep, csv);
  EXPECT_NE(text.find(fmt::format("\nnever_fitted_mape_pct={:.2f} never_fitted_worst_source_pct=", rep.mape_pct)),
            std::string::npos) << text;
}

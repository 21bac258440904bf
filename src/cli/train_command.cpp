// `exatrain train JOB.toml [--set k=v ...] [--resume auto|DIR]` and
// `exatrain sample CKPT --prompt TEXT`: argument parsing, then one call into train/.
#include <cmath>

#include <fmt/format.h>

#include "cli/commands.hpp"
#include "cli/job_plan.hpp"
#include "job/parse.hpp"
#include "report/report.hpp"
#include "train/sample.hpp"
#include "train/every_rank.hpp"
#include "train/session.hpp"

namespace exatrain::cli {

void add_train_command(CLI::App& app) {
  struct Args {
    std::string job, resume;
    std::vector<std::string> sets;
    bool plain = false;
    std::string trace;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("train", "train the job's model (metrics, checkpoints and a report in run_dir)");
  cmd->add_option("job", a->job, "the job file (TOML)")->required();
  cmd->add_option("--set", a->sets, "override a key: section.key=value (repeatable)");
  cmd->add_option("--resume", a->resume, "auto (newest valid checkpoint in run_dir), none, or a checkpoint directory");
  cmd->add_flag("--plain", a->plain, "plain log lines instead of a progress bar");
  cmd->add_option("--trace", a->trace, "write a Chrome/Perfetto trace of the first 3 steps of every rank");
  cmd->callback([a] {
    init_mpi();  // first: the job's checks need the number of ranks it runs on
    // The trainer's own requirements are reported together with the file's problems.
    // Every rank reads the same file and --set values: a problem there is printed once.
    Job job = on_every_rank([&] {
      return load_job(a->job, a->sets, [](const Job& j, std::vector<std::string>& errors) {
        check_job_catalog(j, errors);  // an unknown device is refused by every command
        check_training_job(j, errors);
      });
    });
    TrainRunOptions o;
    o.resume = a->resume;
    if (a->plain) o.interactive = 0;
    o.trace = a->trace;
    TrainRunResult r = run_training(job, o);  // on 1..N ranks (mpirun, srun, or none)
    if (!r.run_dir.empty()) {                 // rank 0
      report::RunSummary s = report::write_report(r.run_dir);
      fmt::print("\n{}", report::format_summary(s, r.run_dir));
      if (!r.last_checkpoint.empty()) fmt::print("  checkpoint        {}\n", r.last_checkpoint);
      fmt::print("  metrics           {}/metrics.jsonl\n", r.run_dir);
    }
    finalize_mpi();
  });
}

void add_sample_command(CLI::App& app) {
  auto so = std::make_shared<SampleOptions>();
  auto dir = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("sample", "generate text from a checkpoint");
  cmd->add_option("checkpoint", *dir, "a checkpoint directory (RUN_DIR/checkpoints/step_N)")->required();
  cmd->add_option("--prompt", so->prompt, "the text to continue")->required();
  cmd->add_option("--tokens", so->max_new_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", so->temperature, "softmax temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-k", so->top_k, "sample among the k most likely tokens (0 = all)")->capture_default_str();
  cmd->add_option("--seed", so->seed, "random seed")->capture_default_str();
  cmd->add_flag("--allow-nonfinite", so->allow_nonfinite,
                "sample even when the weights hold NaN or Inf (a loud warning instead of an error)");
  cmd->callback([so, dir] {
    SampleResult r = sample_from_checkpoint(*dir, *so);
    fmt::print("{}\n", r.text);
  });
}

}  // namespace exatrain::cli

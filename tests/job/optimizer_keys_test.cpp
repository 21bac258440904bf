// The [optimizer] table: Muon's, SGD's, Lion's and Adafactor's keys and defaults, the round
// trip, and the refusals (unknown key, a key of an optimizer the job does not use, impossible
// values) naming file, key and value; and
// the plan refusing ZeRO 2/3 at dp > 1 for Muon.
#include <gtest/gtest.h>

#include "core/check.hpp"
#include "job/parse.hpp"
#include "plan/resolve.hpp"
#include "../test_util/error_of.hpp"
#include "job_errors.hpp"

using namespace exatrain;

using job_test::contains;
using job_test::parse_error;

TEST(JobOptimizer, MuonDefaultsAndKeys) {
  Job d = parse_job("[train]\noptimizer = \"muon\"\n", "job.toml");
  EXPECT_EQ(d.train.optimizer, "muon");
  EXPECT_EQ(d.train.muon, MuonSpec{});
  EXPECT_DOUBLE_EQ(d.train.muon.momentum, 0.95);
  EXPECT_TRUE(d.train.muon.nesterov);
  EXPECT_EQ(d.train.muon.ns_steps, 5);
  EXPECT_EQ(d.train.muon.scale, "rms_match");
  Job j = parse_job("[train]\noptimizer = \"muon\"\n[optimizer]\nmomentum = 0.9\nnesterov = false\nns_steps = 3\n"
                    "scale = \"shape\"\n", "job.toml");
  EXPECT_DOUBLE_EQ(j.train.muon.momentum, 0.9);
  EXPECT_FALSE(j.train.muon.nesterov);
  EXPECT_EQ(j.train.muon.ns_steps, 3);
  EXPECT_EQ(j.train.muon.scale, "shape");
  // --set reaches the table too.
  Job s = parse_job("[train]\noptimizer = \"muon\"\n", "job.toml", {"optimizer.ns_steps=7"});
  EXPECT_EQ(s.train.muon.ns_steps, 7);
}

TEST(JobOptimizer, MuonRoundTripsThroughToml) {
  Job a = parse_job("[train]\noptimizer = \"muon\"\n[optimizer]\nmomentum = 0.8\nnesterov = false\nns_steps = 4\n"
                    "scale = \"shape\"\n", "job.toml");
  Job b = parse_job(job_to_toml(a), "roundtrip.toml");
  EXPECT_EQ(b.train.muon, a.train.muon);
  EXPECT_EQ(job_to_toml(a), job_to_toml(b));
  EXPECT_FALSE(contains(job_to_toml(parse_job("", "job.toml")), "[optimizer]"));  // adamw has no table
}

TEST(JobOptimizer, UnknownKeyIsNamed) {
  const std::string e = parse_error("[train]\noptimizer = \"muon\"\n[optimizer]\nmomentun = 0.9\n");
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] unknown key \"momentun\" (did you mean \"momentum\"?)")) << e;
}

TEST(JobOptimizer, KeyOfAnotherOptimizerIsRefused) {
  std::string e = parse_error("[optimizer]\nmomentum = 0.9\n");  // optimizer = "adamw" (the default)
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] momentum = 0.9: a key of train.optimizer = \"muon\" or \"sgd\" or "
                          "\"kfac\", but train.optimizer is \"adamw\" (whose keys are [train] beta1, beta2, eps and "
                          "weight_decay)")) << e;
  e = parse_error("[train]\noptimizer = \"sgd\"\n[optimizer]\nbeta2 = 0.9\nns_steps = 3\n");
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] beta2 = 0.9: a key of train.optimizer = \"lion\", but "
                          "train.optimizer is \"sgd\" (whose [optimizer] keys are momentum, nesterov)")) << e;
  EXPECT_TRUE(contains(e, "[optimizer] ns_steps = 3: a key of train.optimizer = \"muon\"")) << e;
  e = parse_error("[train]\noptimizer = \"lamb\"\n[optimizer]\nfactored = false\n");
  EXPECT_TRUE(contains(e, "[optimizer] factored = false: a key of train.optimizer = \"adafactor\", but "
                          "train.optimizer is \"lamb\" (whose keys are [train]")) << e;
  e = parse_error("[train]\noptimizer = \"adamw\"\n", {"optimizer.ns_steps=5"});
  EXPECT_TRUE(contains(e, "--set: [optimizer] ns_steps = 5: a key of train.optimizer = \"muon\"")) << e;
}

TEST(JobOptimizer, ImpossibleValuesAreRefused) {
  auto muon = [](const std::string& kv) { return "[train]\noptimizer = \"muon\"\n[optimizer]\n" + kv + "\n"; };
  std::string e = parse_error(muon("momentum = 1.0"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] momentum = 1.0: expected a number in [0, 1)")) << e;
  e = parse_error(muon("momentum = -0.1"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] momentum = -0.1: expected a number in [0, 1)")) << e;
  e = parse_error(muon("ns_steps = 0"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] ns_steps = 0: expected an integer in [1, 100]")) << e;
  e = parse_error(muon("scale = \"spectral\""));
  EXPECT_TRUE(contains(e, "[optimizer] scale = \"spectral\": expected one of \"rms_match\" \"shape\"")) << e;
  e = parse_error(muon("nesterov = 1"));
  EXPECT_TRUE(contains(e, "[optimizer] nesterov = 1: expected true or false")) << e;
  e = parse_error("[train]\noptimizer = \"adam\"\n");
  EXPECT_TRUE(contains(e, "[train] optimizer = \"adam\": expected one of \"adamw\" \"sgd\" \"lamb\" \"lion\" "
                          "\"adafactor\" \"muon\" \"shampoo\" \"soap\"")) << e;
}

TEST(JobOptimizer, FirstOrderDefaultsKeysAndRoundTrip) {
  EXPECT_EQ(parse_job("[train]\noptimizer = \"sgd\"\n", "job.toml").train.sgd, SgdSpec{});
  EXPECT_DOUBLE_EQ(SgdSpec{}.momentum, 0.9);
  EXPECT_FALSE(SgdSpec{}.nesterov);
  EXPECT_DOUBLE_EQ(LionSpec{}.beta1, 0.9);
  EXPECT_DOUBLE_EQ(LionSpec{}.beta2, 0.99);
  EXPECT_DOUBLE_EQ(AdafactorSpec{}.decay_rate, -0.8);
  EXPECT_DOUBLE_EQ(AdafactorSpec{}.beta1, 0);
  const char* jobs[] = {
      "[train]\noptimizer = \"sgd\"\n[optimizer]\nmomentum = 0.5\nnesterov = true\n",
      "[train]\noptimizer = \"lion\"\n[optimizer]\nbeta1 = 0.95\nbeta2 = 0.98\n",
      "[train]\noptimizer = \"adafactor\"\n[optimizer]\nbeta1 = 0.9\ndecay_rate = -0.5\neps1 = 1e-20\n"
      "clip_threshold = 2.0\nfactored = false\n",
      "[train]\noptimizer = \"lamb\"\neps = 1e-6\n",
      "[train]\noptimizer = \"shampoo\"\n[optimizer]\nfactor_decay = 0.99\nepsilon = 1e-8\nmax_preconditioner_dim = 512\n"
      "precondition_frequency = 10\nstart_preconditioning_step = 5\n"};
  for (const char* text : jobs) {
    const Job a = parse_job(text, "job.toml");
    const Job b = parse_job(job_to_toml(a), "roundtrip.toml");
    EXPECT_EQ(a.train, b.train) << text;
  }
  const Job s = parse_job(jobs[0], "job.toml");
  EXPECT_DOUBLE_EQ(s.train.sgd.momentum, 0.5);
  EXPECT_TRUE(s.train.sgd.nesterov);
  const Job l = parse_job(jobs[1], "job.toml");
  EXPECT_DOUBLE_EQ(l.train.lion.beta1, 0.95);
  EXPECT_DOUBLE_EQ(l.train.lion.beta2, 0.98);
  const Job f = parse_job(jobs[2], "job.toml", {"optimizer.clip_threshold=3"});
  EXPECT_DOUBLE_EQ(f.train.adafactor.beta1, 0.9);
  EXPECT_DOUBLE_EQ(f.train.adafactor.decay_rate, -0.5);
  EXPECT_DOUBLE_EQ(f.train.adafactor.eps1, 1e-20);
  EXPECT_DOUBLE_EQ(f.train.adafactor.clip_threshold, 3);
  EXPECT_FALSE(f.train.adafactor.factored);
  const Job h = parse_job(jobs[4], "job.toml");
  EXPECT_DOUBLE_EQ(h.train.shampoo.factor_decay, 0.99);
  EXPECT_DOUBLE_EQ(h.train.shampoo.epsilon, 1e-8);
  EXPECT_EQ(h.train.shampoo.max_preconditioner_dim, 512);
  EXPECT_EQ(h.train.shampoo.precondition_frequency, 10);
  EXPECT_EQ(h.train.shampoo.start_preconditioning_step, 5);
}

TEST(JobOptimizer, FirstOrderImpossibleValuesAreRefused) {
  auto job = [](const char* o, const std::string& kv) {
    return fmt::format("[train]\noptimizer = \"{}\"\n[optimizer]\n{}\n", o, kv);
  };
  std::string e = parse_error(job("sgd", "momentum = 1.0"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] momentum = 1.0: expected a number in [0, 1)")) << e;
  e = parse_error(job("lion", "beta2 = 1.5"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] beta2 = 1.5: expected a number in [0, 1)")) << e;
  e = parse_error(job("adafactor", "decay_rate = 0.0"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] decay_rate = 0.0: expected a number in [-1, 0)")) << e;
  e = parse_error(job("adafactor", "clip_threshold = 0.0"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] clip_threshold = 0.0: expected a number in [1e-06, 1000000]")) << e;
  e = parse_error(job("adafactor", "eps1 = 0.0"));  // 0 / sqrt(0) on a zero gradient
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] eps1 = 0.0: expected a number in [1e-37, 1]")) << e;
  e = parse_error(job("sgd", "momentum = 0.0\nnesterov = true"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] nesterov = true: Nesterov momentum needs momentum > 0, and "
                          "[optimizer] momentum is 0")) << e;
  e = parse_error(job("shampoo", "precondition_frequency = 0"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] precondition_frequency = 0: expected an integer in [1, ")) << e;
  e = parse_error(job("shampoo", "max_preconditioner_dim = 0"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] max_preconditioner_dim = 0: expected an integer in [1, 8192]")) << e;
  e = parse_error(job("shampoo", "factor_decay = 1.5"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] factor_decay = 1.5: expected a number in [0, 1]")) << e;
  e = parse_error(job("sgd", "momentun = 0.9"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] unknown key \"momentun\" (did you mean \"momentum\"?)")) << e;
  e = parse_error("[train]\noptimizer = \"lion\"\nlr = -1.0\n");
  EXPECT_TRUE(contains(e, "job.toml: [train] lr = -1.0: expected a number in [0, 10]")) << e;
}

TEST(JobOptimizer, SoapDefaultsKeysAndRoundTrip) {
  EXPECT_EQ(parse_job("[train]\noptimizer = \"soap\"\n", "job.toml").train.soap, SoapSpec{});
  EXPECT_DOUBLE_EQ(SoapSpec{}.factor_decay, 0.95);  // soap.py's shampoo_beta = its beta2
  EXPECT_EQ(SoapSpec{}.precondition_frequency, 10);
  EXPECT_EQ(SoapSpec{}.max_preconditioner_dim, 10000);
  const char* text = "[train]\noptimizer = \"soap\"\n[optimizer]\nfactor_decay = 0.9\nmax_preconditioner_dim = 512\n"
                     "precondition_frequency = 5\n";
  const Job a = parse_job(text, "job.toml");
  EXPECT_EQ(a.train.soap, (SoapSpec{0.9, 512, 5}));
  EXPECT_EQ(parse_job(job_to_toml(a), "roundtrip.toml").train, a.train);
  auto soap = [](const std::string& kv) { return "[train]\noptimizer = \"soap\"\n[optimizer]\n" + kv + "\n"; };
  std::string e = parse_error(soap("precondition_frequency = 0"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] precondition_frequency = 0: expected an integer in [1, ")) << e;
  e = parse_error(soap("max_preconditioner_dim = 0"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] max_preconditioner_dim = 0: expected an integer in [1, 65536]")) << e;
  e = parse_error(soap("factor_decay = 1.0"));
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] factor_decay = 1.0: expected a number in [0, 1)")) << e;
  e = parse_error(soap("epsilon = 1e-12"));  // Shampoo's, not SOAP's
  EXPECT_TRUE(contains(e, "[optimizer] epsilon")) << e;
  EXPECT_TRUE(contains(e, "a key of train.optimizer = \"shampoo\", but train.optimizer is \"soap\"")) << e;
}

TEST(JobOptimizer, KfacDefaultsKeysAndRoundTrip) {
  EXPECT_EQ(parse_job("[train]\noptimizer = \"kfac\"\n", "job.toml").train.kfac, KfacSpec{});
  EXPECT_DOUBLE_EQ(KfacSpec{}.damping, 0.001);  // kfac-pytorch's KFAC defaults
  EXPECT_DOUBLE_EQ(KfacSpec{}.factor_decay, 0.95);
  EXPECT_EQ(KfacSpec{}.factor_update_steps, 10);
  EXPECT_EQ(KfacSpec{}.inv_update_steps, 100);
  EXPECT_DOUBLE_EQ(KfacSpec{}.kl_clip, 0.001);
  EXPECT_DOUBLE_EQ(KfacSpec{}.grad_worker_fraction, 1.0);
  const char* text = "[train]\noptimizer = \"kfac\"\n[optimizer]\nmomentum = 0.8\nnesterov = true\ndamping = 0.01\n"
                     "factor_decay = 0.9\nfactor_update_steps = 2\ninv_update_steps = 20\nkl_clip = 0\n"
                     "grad_worker_fraction = 0.25\nothers = \"adamw\"\n";
  const Job a = parse_job(text, "job.toml");
  EXPECT_EQ(a.train.kfac, (KfacSpec{0.8, true, 0.01, 0.9, 2, 20, 0.0, 0.25}));
  EXPECT_EQ(a.train.mixed.others, "adamw");
  EXPECT_EQ(parse_job(job_to_toml(a), "roundtrip.toml").train, a.train);
  auto kfac = [](const std::string& kv) { return "[train]\noptimizer = \"kfac\"\n[optimizer]\n" + kv + "\n"; };
  const std::pair<const char*, const char*> bad[] = {
      {"damping = 0", "[optimizer] damping = 0: expected a number in (0, 1000000]"},
      {"momentum = 1.0", "[optimizer] momentum = 1.0: expected a number in [0, 1)"},
      {"factor_decay = 0.0", "[optimizer] factor_decay = 0.0: expected a number in (0, 1]"},
      {"factor_update_steps = 0", "[optimizer] factor_update_steps = 0: expected an integer in [1, "},
      {"inv_update_steps = 0", "[optimizer] inv_update_steps = 0: expected an integer in [1, "},
      {"kl_clip = -1.0", "[optimizer] kl_clip = -1.0: expected a number in [0, 1000000]"},
      {"grad_worker_fraction = 0", "[optimizer] grad_worker_fraction = 0: expected a number in (0, 1]"},
      {"grad_worker_fraction = 1.5", "[optimizer] grad_worker_fraction = 1.5: expected a number in (0, 1]"},
      {"momentum = 0\nnesterov = true", "[optimizer] nesterov = true: Nesterov momentum needs momentum > 0"},
      {"ns_steps = 5", "[optimizer] ns_steps = 5: a key of train.optimizer = \"muon\", but train.optimizer is \"kfac\""}};
  for (const auto& [kv, want] : bad) {
    const std::string e = parse_error(kfac(kv));
    EXPECT_TRUE(contains(e, std::string("job.toml: ") + want)) << kv << ": " << e;
  }
  // K-FAC keeps no Adam: [train] beta1 is refused unless a mixed order gives the rest to AdamW.
  EXPECT_TRUE(contains(parse_error("[train]\noptimizer = \"kfac\"\nbeta1 = 0.8\n"), "[train] beta1 = 0.8")) << "";
  EXPECT_NO_THROW(parse_job("[train]\noptimizer = \"kfac\"\nbeta1 = 0.8\n[optimizer]\nothers = \"adamw\"\n", "job.toml"));
}

TEST(JobOptimizer, MixedOrderKeysOfTheMatrixOptimizers) {
  for (const char* m : {"muon", "shampoo", "soap", "kfac"}) {
    const Job a = parse_job(fmt::format("[train]\noptimizer = \"{}\"\n[optimizer]\nothers = \"lion\"\n"
                                        "first_order_steps = 100\n", m), "job.toml");
    EXPECT_EQ(a.train.mixed, (MixedSpec{"lion", 100})) << m;
    EXPECT_EQ(parse_job(job_to_toml(a), "roundtrip.toml").train, a.train) << m;
    const OptimizerState s = optimizer_state(a.train);  // the matrices keep Lion's buffer through the schedule
    EXPECT_EQ(s.per_other_element, 1) << m;
    EXPECT_TRUE(s.whole_entries) << m;
  }
  EXPECT_EQ(optimizer_state(parse_job("[train]\noptimizer = \"soap\"\n[optimizer]\nothers = \"sgd\"\n", "job.toml").train),
            (OptimizerState{6, 1, true}));
  EXPECT_EQ(optimizer_state(parse_job("[train]\noptimizer = \"muon\"\n[optimizer]\nfirst_order_steps = 10\n",
                                      "job.toml").train), (OptimizerState{3, 2, true}));  // Muon's 1 + AdamW's 2
  std::string e = parse_error("[train]\noptimizer = \"soap\"\n[optimizer]\nothers = \"muon\"\n");
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] others = \"muon\": expected one of \"adamw\" \"lamb\" \"sgd\" "
                          "\"lion\" \"adafactor\"")) << e;
  e = parse_error("[train]\noptimizer = \"muon\"\n[optimizer]\nfirst_order_steps = -1\n");
  EXPECT_TRUE(contains(e, "job.toml: [optimizer] first_order_steps = -1: expected an integer in [0, ")) << e;
  e = parse_error("[train]\noptimizer = \"adamw\"\n[optimizer]\nothers = \"sgd\"\n");
  EXPECT_TRUE(contains(e, "a key of train.optimizer = \"muon\" or \"shampoo\" or \"soap\" or \"kfac\", but train.optimizer is "
                          "\"adamw\"")) << e;
}

// [train] beta1, beta2, eps reach only an Adam: an optimizer without one refuses them rather than
// ignoring them, and a resolved job.toml (job_to_toml) does not write them for it.
TEST(JobOptimizer, AdamKeysOfTrainAreRefusedWhereNoAdamRuns) {
  for (const char* o : {"sgd", "lion", "adafactor"}) {
    const std::string e = parse_error(fmt::format("[train]\noptimizer = \"{}\"\nbeta2 = 0.9\n", o));
    EXPECT_TRUE(contains(e, fmt::format("job.toml: [train] beta2 = 0.9: train.optimizer = \"{}\" keeps no Adam moments, "
                                        "so this would be ignored", o))) << e;
    const Job j = parse_job(fmt::format("[train]\noptimizer = \"{}\"\n", o), "job.toml");
    EXPECT_EQ(job_to_toml(j).find("\neps = "), std::string::npos) << o;  // not [train]'s (Adafactor's is eps1)
  }
  std::string e = parse_error("[train]\noptimizer = \"muon\"\neps = 1e-6\n[optimizer]\nothers = \"lion\"\n");
  EXPECT_TRUE(contains(e, "[train] eps = 1e-06: train.optimizer = \"muon\" with [optimizer] others = \"lion\" keeps no "
                          "Adam moments")) << e;
  for (const char* text : {"[train]\noptimizer = \"muon\"\nbeta1 = 0.8\n",  // its AdamW off the matrices
                           "[train]\noptimizer = \"shampoo\"\nbeta1 = 0.8\n[optimizer]\nothers = \"sgd\"\n",  // grafting
                           "[train]\noptimizer = \"soap\"\nbeta1 = 0.8\n", "[train]\noptimizer = \"lamb\"\nbeta1 = 0.8\n"}) {
    const Job j = parse_job(text, "job.toml");
    EXPECT_DOUBLE_EQ(j.train.beta1, 0.8) << text;
    EXPECT_EQ(parse_job(job_to_toml(j), "roundtrip.toml").train, j.train) << text;
  }
}

// A job with every degree set (plan_from_job plans only resolved jobs).
static Job muon_job(int gpus, int dp, int zero) {
  return parse_job(fmt::format("[parallel]\ngpus = {}\ntp = 1\npp = 1\ncp = 1\nvp = 1\ndp = {}\nzero = {}\n"
                               "micro_batch = 1\nglobal_batch = 4\nrecompute = \"none\"\nseq_parallel = false\n"
                               "schedule = \"1f1b\"\n[train]\noptimizer = \"muon\"\n", gpus, dp, zero), "job.toml");
}

TEST(JobOptimizer, MuonRefusesZero2And3AtDpAboveOne) {
  for (int zero : {2, 3}) {
    const Job j = muon_job(2, 2, zero);
    const std::string e = error_of([&] { plan::plan_from_job(j, 2); });
    EXPECT_TRUE(contains(e, fmt::format("job.toml: [parallel] zero = {} with [train] optimizer = \"muon\" at dp = 2", zero)))
        << e;
    EXPECT_TRUE(contains(e, "expected zero = 0 or 1")) << e;
  }
  // ZeRO 1 at dp 2, and ZeRO 2 at dp 1, plan.
  EXPECT_EQ(error_of([] { plan::plan_from_job(muon_job(2, 2, 1), 2); }), "");
  EXPECT_EQ(error_of([] { plan::plan_from_job(muon_job(1, 1, 2), 1); }), "");
}

// The walk's plan for each kind of model (step order, candidates, what is not measured and why, what the
// doctor's verdict rules out), the SLO judgement with TTFT/TPOT, --url's advice, and the files' decoder keys:
// made-up figures and verdicts, no server, no timing.
#include "tools/tune/walk.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tools/bench/aggregate.h"
#include "tools/tune/tune_output.h"

namespace stoke::tune {
namespace {

using nlohmann::json;

WalkContext Decoder(double concurrency = 16) {
  WalkContext c;
  c.kind = ModelKind::kDecoder;
  c.load = concurrency;
  c.max_num_seqs = {8, 16, 32, 64, 128};
  c.max_num_batched_tokens = {8, 512, 2048, 4096};
  c.max_input_tokens = 128;
  c.own = {.max_num_seqs = 64, .max_num_batched_tokens = 2048};
  return c;
}

json Verdict(const std::string& bottleneck, bool gpu = false) {
  return json::array({{{"bottleneck", bottleneck}, {"summary", "made up"}, {"gpu_evidence", gpu}}});
}

std::string Joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += x + "|";
  return s;
}

TEST(TunePlanTest, DecoderStepsComeInTheSeedsOrder) {
  EXPECT_EQ(
      StepOrder(ModelKind::kDecoder),
      (std::vector<std::string>{"max_num_seqs", "max_num_batched_tokens", "chunked_prefill", "target_step_ms",
                                "cuda_graphs", "async_output", "kv_cache_dtype", "weight_precision"}));
  EXPECT_EQ(StepOrder(ModelKind::kBatched),
            (std::vector<std::string>{"max_batch_size", "max_queue_delay_us", "instances", "precision"}));
}

TEST(TunePlanTest, MaxNumSeqsSkipsTheBaselinesAndWhatTheLoadCannotFill) {
  const WalkContext c = Decoder(16);
  StepPlan p = PlanStep("max_num_seqs", c, c.own, json());
  // 64 is the baseline's; 32 and 128 exceed the 16 in flight while 16 already holds them all.
  EXPECT_EQ(Joined(p.names), "seqs 8|seqs 16|");
  EXPECT_TRUE(p.ordered);
  EXPECT_EQ(p.not_measured.size(), 3u);
  EXPECT_NE(Joined(p.not_measured).find("64 (the baseline's)"), std::string::npos);
  EXPECT_EQ(p.candidates[1].max_num_seqs, 16);
  EXPECT_EQ(p.candidates[1].max_num_batched_tokens, 2048);  // the other knobs stay where they are
}

TEST(TunePlanTest, KvCapacityBoundRulesOutMoreSequences) {
  WalkContext c = Decoder(256);
  Knobs cur = c.own;
  cur.max_num_seqs = 32;
  StepPlan p = PlanStep("max_num_seqs", c, cur, Verdict("kv_capacity_bound"));
  // 32 is where it stands, 64 the baseline's, 128 ruled out; fewer are still tried.
  EXPECT_EQ(Joined(p.names), "seqs 8|seqs 16|");
  EXPECT_NE(p.doctor_note.find("more max-num-seqs will not help without more KV"), std::string::npos);
  EXPECT_NE(Joined(p.not_measured).find("128 (kv_capacity_bound)"), std::string::npos);
  c.max_num_seqs = {64, 128};
  p = PlanStep("max_num_seqs", c, cur, Verdict("kv_capacity_bound"));
  EXPECT_TRUE(p.candidates.empty());
  EXPECT_NE(p.skip.find("kv_capacity_bound"), std::string::npos) << p.skip;
}

TEST(TunePlanTest, BatchedTokensNeedATokenPerRunningSequence) {
  const WalkContext c = Decoder(16);
  StepPlan p = PlanStep("max_num_batched_tokens", c, c.own, json());
  EXPECT_EQ(Joined(p.names), "tokens 512|tokens 4096|");
  EXPECT_NE(Joined(p.not_measured).find("8 (< 16 running sequences"), std::string::npos)
      << Joined(p.not_measured);
}

TEST(TunePlanTest, ChunkedPrefillOffOnlyWhenThePromptsFitOneStep) {
  WalkContext c = Decoder();
  StepPlan p = PlanStep("chunked_prefill", c, c.own, json());
  ASSERT_EQ(p.candidates.size(), 1u);
  EXPECT_EQ(p.candidates[0].chunked_prefill, 0);
  EXPECT_FALSE(p.ordered);
  c.max_input_tokens = 3000;  // longer than the 2048-token budget
  p = PlanStep("chunked_prefill", c, c.own, json());
  EXPECT_TRUE(p.candidates.empty());
  EXPECT_NE(p.skip.find("could not be admitted"), std::string::npos);
}

TEST(TunePlanTest, StepTargetAimsBelowTheTpotSlo) {
  WalkContext c = Decoder();
  StepPlan p = PlanStep("target_step_ms", c, c.own, json());
  EXPECT_NE(p.skip.find("no TPOT SLO"), std::string::npos) << p.skip;
  c.tpot_slo_ms = 50;
  p = PlanStep("target_step_ms", c, c.own, json());
  ASSERT_EQ(p.candidates.size(), 1u);
  EXPECT_EQ(p.candidates[0].target_step_ms, 40);
  EXPECT_EQ(p.candidates[0].max_num_batched_tokens, 2048);  // the other knobs stay
  EXPECT_EQ(Joined(p.names), "step target 40 ms|");
  EXPECT_EQ(p.candidates[0].Flags(ModelKind::kDecoder).back(), "40");
  Knobs cur = p.candidates[0];  // already there: nothing to try
  EXPECT_TRUE(PlanStep("target_step_ms", c, cur, json()).candidates.empty());
}

TEST(TunePlanTest, CudaGraphsOnlyOnCuda) {
  WalkContext c = Decoder();
  c.device = "cpu";
  EXPECT_EQ(PlanStep("cuda_graphs", c, c.own, json()).skip, "CPU");
  c.device = "";
  EXPECT_NE(PlanStep("cuda_graphs", c, c.own, json()).skip.find("--device cuda was not given"),
            std::string::npos);
  c.device = "cuda";
  StepPlan p = PlanStep("cuda_graphs", c, c.own, Verdict("launch_bound", true));
  ASSERT_EQ(p.candidates.size(), 1u);
  EXPECT_EQ(p.candidates[0].cuda_graphs, 0);  // own is on: try off
  EXPECT_NE(p.doctor_note.find("launch_bound"), std::string::npos);
}

TEST(TunePlanTest, AsyncOutputOnlyOnCudaAndCitesTheDoctorsHostGap) {
  WalkContext c = Decoder();
  c.device = "cpu";
  EXPECT_NE(PlanStep("async_output", c, c.own, json()).skip.find("CPU"), std::string::npos);
  c.device = "";
  EXPECT_NE(PlanStep("async_output", c, c.own, json()).skip.find("--device cuda was not given"),
            std::string::npos);
  c.device = "cuda";
  json v = Verdict("compute_bound", true);
  v[0]["evidence"] = json::array({{{"signal", "step.host_share"}, {"value", 0.056}}});
  StepPlan p = PlanStep("async_output", c, c.own, v);
  ASSERT_EQ(p.candidates.size(), 1u);
  EXPECT_EQ(p.candidates[0].async_output, 0);  // own is on (auto, on a GPU): try off
  EXPECT_NE(Joined(p.candidates[0].Flags(ModelKind::kDecoder)).find("--async-output|off|"),
            std::string::npos);
  EXPECT_NE(p.doctor_note.find("host at 6% of each step"), std::string::npos) << p.doctor_note;
  EXPECT_TRUE(PlanStep("async_output", c, c.own, Verdict("compute_bound", true)).doctor_note.empty());
}

TEST(TunePlanTest, KvCacheDtypeStepTriesTheGatedEightBitCaches) {
  WalkContext c = Decoder();
  EXPECT_NE(PlanStep("kv_cache_dtype", c, c.own, json()).skip.find("no --kv-cache-dtype"), std::string::npos);
  c.has_kv_cache_dtype = true;
  StepPlan p = PlanStep("kv_cache_dtype", c, c.own, json());
  EXPECT_TRUE(p.skip.empty()) << p.skip;
  EXPECT_FALSE(p.ordered);
  ASSERT_EQ(p.candidates.size(), 2u);
  EXPECT_EQ(p.candidates[0].kv_cache_dtype, "int8");
  EXPECT_EQ(p.candidates[1].kv_cache_dtype, "fp8");
  // The flag reaches the server (which runs the consistency gate at load), and the other knobs stay.
  const std::vector<std::string> f = p.candidates[1].Flags(ModelKind::kDecoder);
  ASSERT_GE(f.size(), 2u);
  EXPECT_EQ(std::vector<std::string>(f.end() - 2, f.end()), (std::vector<std::string>{"--kv-cache-dtype", "fp8"}));
  EXPECT_EQ(std::vector<std::string>(f.begin(), f.end() - 2), c.own.Flags(ModelKind::kDecoder));
  EXPECT_EQ(KnobValue("kv_cache_dtype", p.candidates[1]), 2);
  EXPECT_NE(p.candidates[0].Describe(ModelKind::kDecoder).find("kv int8"), std::string::npos);
  // From an int8 best only fp8 is left; a KV-bound server is told why the step matters.
  Knobs int8 = c.own;
  int8.kv_cache_dtype = "int8";
  p = PlanStep("kv_cache_dtype", c, int8, Verdict("kv_capacity_bound", true));
  ASSERT_EQ(p.candidates.size(), 1u);
  EXPECT_EQ(p.candidates[0].kv_cache_dtype, "fp8");
  EXPECT_NE(p.doctor_note.find("kv_capacity_bound"), std::string::npos);
}

TEST(TunePlanTest, WeightPrecisionStepTriesGatedFp8Weights) {
  WalkContext c = Decoder();
  c.has_kv_cache_dtype = true;
  EXPECT_NE(PlanStep("weight_precision", c, c.own, json()).skip.find("no --quantization"), std::string::npos);
  c.has_quantization = true;
  Knobs cur = c.own;
  cur.kv_cache_dtype = "int8";  // the KV step's winner stays
  StepPlan p = PlanStep("weight_precision", c, cur, json());
  EXPECT_TRUE(p.skip.empty()) << p.skip;
  EXPECT_FALSE(p.ordered);
  ASSERT_EQ(p.candidates.size(), 1u);
  EXPECT_EQ(Joined(p.names), "weights fp8 (gated)|");
  EXPECT_EQ(p.candidates[0].quantization, "fp8");
  EXPECT_EQ(p.candidates[0].kv_cache_dtype, "int8");
  // The flag reaches the server (which runs the consistency gate at load), after the other knobs.
  const std::vector<std::string> f = p.candidates[0].Flags(ModelKind::kDecoder);
  ASSERT_GE(f.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(f.end() - 4, f.end()),
            (std::vector<std::string>{"--kv-cache-dtype", "int8", "--quantization", "fp8"}));
  EXPECT_EQ(KnobValue("weight_precision", p.candidates[0]), 1);
  EXPECT_EQ(KnobValue("weight_precision", cur), 0);
  EXPECT_NE(p.candidates[0].Describe(ModelKind::kDecoder).find("kv int8, weights fp8"), std::string::npos);
  EXPECT_EQ(KnobsJson(p.candidates[0], ModelKind::kDecoder)["quantization"], "fp8");
  EXPECT_EQ(KnobsJson(cur, ModelKind::kDecoder)["quantization"], "own");
  // Nothing left to try from fp8 weights.
  EXPECT_FALSE(PlanStep("weight_precision", c, p.candidates[0], json()).skip.empty());
}

TEST(TunePlanTest, BatchedPrecisionStepTriesGatedFp8WeightsForEncodersOnly) {
  WalkContext c;
  c.kind = ModelKind::kBatched;
  c.own = {.max_batch_size = 32, .max_queue_delay_us = 0, .instances = 1};
  c.has_quantization = true;
  // A synthetic model file (or an image classifier): nothing to lower.
  EXPECT_NE(PlanStep("precision", c, c.own, json()).skip.find("no lower precision"), std::string::npos);
  c.encoder = true;
  c.has_quantization = false;
  EXPECT_NE(PlanStep("precision", c, c.own, json()).skip.find("no --quantization"), std::string::npos);
  c.has_quantization = true;
  Knobs cur = c.own;
  cur.max_batch_size = 8;  // the earlier steps' winners stay
  StepPlan p = PlanStep("precision", c, cur, json());
  EXPECT_TRUE(p.skip.empty()) << p.skip;
  EXPECT_FALSE(p.ordered);
  ASSERT_EQ(p.candidates.size(), 1u);
  EXPECT_EQ(Joined(p.names), "weights fp8 (gated)|");
  EXPECT_EQ(p.candidates[0].quantization, "fp8");
  EXPECT_EQ(p.candidates[0].max_batch_size, 8);
  const std::vector<std::string> f = p.candidates[0].Flags(ModelKind::kBatched);
  ASSERT_GE(f.size(), 2u);
  EXPECT_EQ(std::vector<std::string>(f.end() - 2, f.end()),
            (std::vector<std::string>{"--quantization", "fp8"}));
  EXPECT_EQ(KnobValue("precision", p.candidates[0]), 1);
  EXPECT_EQ(KnobValue("precision", cur), 0);
  EXPECT_NE(p.candidates[0].Describe(ModelKind::kBatched).find("instances 1, weights fp8"),
            std::string::npos);
  EXPECT_EQ(KnobsJson(p.candidates[0], ModelKind::kBatched)["quantization"], "fp8");
  EXPECT_EQ(KnobsJson(cur, ModelKind::kBatched)["quantization"], "own");
  EXPECT_NE(PlanStep("precision", c, p.candidates[0], json()).skip.find("fp8 already"), std::string::npos);
}

// With tune's --calibration-data an encoder's precision step also tries int8 weights calibrated on that file
// (its server gets --calibration-data; stoke.toml gets the key); a decoder's weight step never does (a decoder
// refuses int8 weights).
TEST(TunePlanTest, CalibrationDataAddsAnInt8PointForEncodersOnly) {
  WalkContext c;
  c.kind = ModelKind::kBatched;
  c.own = {.max_batch_size = 32, .max_queue_delay_us = 0, .instances = 1};
  c.has_quantization = true;
  c.encoder = true;
  c.calibration_data = "/data/samples.txt";
  StepPlan p = PlanStep("precision", c, c.own, json());
  ASSERT_EQ(p.candidates.size(), 2u) << p.skip;
  EXPECT_EQ(Joined(p.names), "weights fp8 (gated)|weights int8, calibrated (gated)|");
  EXPECT_TRUE(p.candidates[0].calibration_data.empty()) << "fp8 needs no samples";
  const Knobs& i8 = p.candidates[1];
  EXPECT_EQ(i8.quantization, "int8");
  const std::vector<std::string> f = i8.Flags(ModelKind::kBatched);
  ASSERT_GE(f.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(f.end() - 4, f.end()),
            (std::vector<std::string>{"--quantization", "int8", "--calibration-data", "/data/samples.txt"}));
  EXPECT_EQ(KnobValue("precision", i8), 2);
  EXPECT_NE(i8.Describe(ModelKind::kBatched).find("weights int8"), std::string::npos);
  EXPECT_NE(PlanStep("precision", c, i8, json()).skip.find("int8 already"), std::string::npos);
  // Decoders: fp8 only, whatever the calibration data.
  WalkContext d;
  d.kind = ModelKind::kDecoder;
  d.has_quantization = true;
  d.calibration_data = "/data/samples.txt";
  const StepPlan w = PlanStep("weight_precision", d, d.own, json());
  ASSERT_EQ(w.candidates.size(), 1u) << w.skip;
  EXPECT_EQ(w.candidates[0].quantization, "fp8");
}

TEST(TunePlanTest, BandwidthBoundFromGpuCountersSkipsInstances) {
  WalkContext c;
  c.kind = ModelKind::kBatched;
  c.instance_counts = {1, 2, 4};
  const Knobs cur{.max_batch_size = 8, .max_queue_delay_us = 1000, .instances = 1};
  StepPlan p = PlanStep("instances", c, cur, Verdict("bandwidth_bound", /*gpu=*/true));
  EXPECT_TRUE(p.candidates.empty());
  EXPECT_NE(p.skip.find("bandwidth_bound"), std::string::npos);
  // Without GPU counters the verdict says nothing about another instance: measured.
  p = PlanStep("instances", c, cur, Verdict("compute_bound", /*gpu=*/false));
  EXPECT_EQ(Joined(p.names), "2 instances|4 instances|");
}

TEST(TunePlanTest, ThrottledIsNotedOnTheStep) {
  const WalkContext c = Decoder();
  json v = Verdict("none");
  v.push_back({{"bottleneck", "throttled"}, {"summary", "power cap"}});
  EXPECT_NE(PlanStep("max_num_seqs", c, c.own, v).doctor_note.find("throttled"), std::string::npos);
}

TEST(TuneJudgeTest, EachGivenSloIsAP99Target) {
  Measurement m;
  m.ok = true;
  m.succeeded = 10;
  m.p99_ms = 900;
  m.ttft_p99_ms = 120;
  m.tpot_p99_ms = 40;
  Judge({.tpot_ms = 50}, &m);
  EXPECT_TRUE(m.accepted) << m.why;
  Judge({.ttft_ms = 100, .tpot_ms = 50}, &m);
  EXPECT_FALSE(m.accepted);
  EXPECT_EQ(m.why, "TTFT p99 120.0 ms > SLO 100.0 ms");
  Judge({.p99_ms = 800}, &m);
  EXPECT_EQ(m.why, "p99 900.0 ms > SLO 800.0 ms");
  m.errors = 2;
  Judge({.tpot_ms = 50}, &m);
  EXPECT_EQ(m.why, "2 failed requests");
}

// Goodput is bench's: requests meeting every SLO, per request. Four requests of 5 tokens in a 1 s window.
TEST(TuneJudgeTest, GoodputCountsRequestsMeetingTtftAndTpot) {
  const Nanos ms = 1'000'000;
  auto req = [&](Nanos ttft_ms, Nanos tpot_ms) {
    bench::RequestRecord r;
    r.scheduled = 100 * ms;
    r.sent = r.scheduled;
    r.first_token = r.scheduled + ttft_ms * ms;
    r.done = r.first_token + 4 * tpot_ms * ms;
    r.output_tokens = 5;
    return r;
  };
  // ok | TTFT too long | TPOT too long | ok
  std::vector<bench::RequestRecord> rs = {req(50, 20), req(300, 20), req(50, 80), req(90, 45)};
  bench::PointResult p;
  bench::AggregatePoint(rs, 0, 1000 * ms, Slos{.ttft_ms = 100, .tpot_ms = 50}.ForBench(), &p);
  EXPECT_EQ(p.succeeded, 4);
  EXPECT_DOUBLE_EQ(p.requests_per_s, 4);
  EXPECT_DOUBLE_EQ(p.goodput_rps, 2);
  bench::PointResult q;
  bench::AggregatePoint(rs, 0, 1000 * ms, Slos{.tpot_ms = 50}.ForBench(), &q);
  EXPECT_DOUBLE_EQ(q.goodput_rps, 3);
}

TEST(TuneAdviceTest, UrlModeNamesTheNextFlag) {
  WalkContext c = Decoder(16);
  c.own = {};  // a server tune did not start: its settings are unknown
  Advice a = AdviseNext(c, c.own, Verdict("queue_bound"));
  EXPECT_EQ(a.step, "max_num_seqs");
  EXPECT_EQ(a.flag, "--max-num-seqs 16");  // the smallest value that holds the 16 requests in flight
  a = AdviseNext(c, c.own, Verdict("kv_capacity_bound"));
  EXPECT_NE(a.flag.find("--kv-cache-bytes"), std::string::npos);
  WalkContext b;
  b.kind = ModelKind::kBatched;
  b.batch_sizes = {1, 4, 8};
  b.queue_delays_us = {1000, 0};
  b.instance_counts = {1, 2};
  b.own = {.max_batch_size = 1, .max_queue_delay_us = 0, .instances = 1};
  a = AdviseNext(b, b.own, json());
  EXPECT_EQ(a.flag, "--max-batch-size 4 --max-queue-delay-us 1000");
}

TEST(TuneFilesTest, ServeHelpDefaultsAndDecoderToml) {
  const ServeDefaults d = ParseServeHelp(
      "  --max-num-seqs INT=64       Sequences running at once\n  --max-num-batched-tokens INT=2048\n"
      "  --cuda-graphs TEXT:{on,off}=on\n");
  EXPECT_EQ(d.max_num_seqs, 64);
  EXPECT_EQ(d.max_num_batched_tokens, 2048);
  EXPECT_EQ(d.cuda_graphs, 1);
  EXPECT_FALSE(d.has_kv_cache_dtype);
  EXPECT_FALSE(d.has_quantization);
  const ServeDefaults with = ParseServeHelp(
      "  --kv-cache-dtype TEXT:{auto,bf16,int8,fp8}=auto\n  --quantization TEXT:{none,fp8}=none  Weight\n");
  EXPECT_TRUE(with.has_kv_cache_dtype);
  EXPECT_TRUE(with.has_quantization);
  TuneOptions o;
  o.model = "m.gguf";
  o.slos.tpot_ms = 50;
  TuneResult r;
  r.kind = ModelKind::kDecoder;
  r.chosen = {.max_num_seqs = 32, .max_num_batched_tokens = 4096, .chunked_prefill = 0, .cuda_graphs = 0};
  const std::string t = TuneToml(o, r);
  EXPECT_NE(t.find("\nmax-num-seqs = 32\nmax-num-batched-tokens = 4096\nno-chunked-prefill = true\n"
                   "cuda-graphs = \"off\"\n"),
            std::string::npos)
      << t;
  TuneResult step = r;
  step.chosen.target_step_ms = 40;
  const std::string ts = TuneToml(o, step);
  EXPECT_NE(ts.find("cuda-graphs = \"off\"\ntarget-step-ms = 40\n"), std::string::npos) << ts;
  TuneResult fp8 = r;
  fp8.chosen.quantization = "fp8";
  const std::string tq = TuneToml(o, fp8);
  EXPECT_NE(tq.find("cuda-graphs = \"off\"\nquantization = \"fp8\"\n"), std::string::npos) << tq;
  // --serve-args become keys of their own; a knob tune sets is not written twice (TOML allows a key once).
  o.serve_args = {"--gemm-cache", "/x/g.json", "--no-prefix-cache", "--threads=4", "--max-num-seqs", "8"};
  const std::string with_args = TuneToml(o, r);
  EXPECT_NE(with_args.find("cuda-graphs = \"off\"\ngemm-cache = \"/x/g.json\"\nno-prefix-cache = true\n"
                           "threads = \"4\"\n# --serve-args, already set above: max-num-seqs = \"8\"\n"),
            std::string::npos)
      << with_args;
  EXPECT_EQ(r.chosen.Flags(ModelKind::kDecoder),
            (std::vector<std::string>{"--max-num-seqs", "32", "--max-num-batched-tokens", "4096",
                                      "--no-chunked-prefill", "--cuda-graphs", "off"}));
}

}  // namespace
}  // namespace stoke::tune

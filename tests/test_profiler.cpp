// profile::Profiler: op records (names, calls, input shapes), nesting and self time, dotted module
// names, phases adding up to the step, memory per scope, the Chrome trace parsed back (also after
// an exception and with a range left open on another thread), key_averages sorting, the
// step report, the verdict rules on synthetic figures, and misuse errors.
#include "ember/backend/cpu/cpu_backend.hpp"
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include <ember/dist/data_parallel.hpp>
#include <ember/dist/thread_group.hpp>
#include <ember/ember.hpp>
#include <ember/profile/profiler.hpp>

#include "pretend_gpu.hpp"
#include "temp_dir.hpp"

using namespace ember;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

struct Block : nn::ModuleBase<Block> {
  std::shared_ptr<nn::Linear> fc;
  Block(int64_t n) { fc = register_module("fc", std::make_shared<nn::Linear>(n, n)); }
  std::string type_name() const override { return "Block"; }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return relu((*fc)(x));
  }
};

struct Net : nn::ModuleBase<Net> {
  std::shared_ptr<nn::Sequential> layers;
  std::shared_ptr<nn::Linear> head;
  Net() {
    layers = register_module("layers", std::make_shared<nn::Sequential>());
    layers->push_back(std::make_shared<Block>(8));
    layers->push_back(std::make_shared<Block>(8));
    head = register_module("head", std::make_shared<nn::Linear>(8, 2));
  }
  std::string type_name() const override { return "Net"; }
  template <Element T>
  Tensor<T> forward(const Tensor<T>& x) {
    return (*head)((*layers)(x));
  }
};

std::vector<const profile::Event*> named(const profile::Profiler& p, const std::string& name) {
  std::vector<const profile::Event*> out;
  for (const auto& e : p.events())
    if (e.name == name) out.push_back(&e);
  return out;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  REQUIRE(f.good());
  return nlohmann::json::parse(f);  // throws (fails the test) on invalid JSON
}

}  // namespace

TEST_CASE("profiler: off by default, no listener and nothing recorded", "[profile]") {
  REQUIRE(trace::active_listener() == nullptr);
  profile::Profiler p;
  REQUIRE_FALSE(p.is_recording());
  Tensor<float> a = Tensor<float>::ones({2, 3});
  (void)relu(a);
  REQUIRE(p.events().empty());
  REQUIRE(p.key_averages().size() == 0);
}

TEST_CASE("profiler: ops with calls, input shapes and dtypes, grouped by shapes", "[profile]") {
  profile::Profiler p;
  Tensor<float> a = Tensor<float>::ones({4, 8}), b = Tensor<float>::ones({8, 5}), c = Tensor<float>::ones({3, 8});
  p.start();
  REQUIRE(trace::active_listener() != nullptr);
  for (int i = 0; i < 3; ++i) (void)matmul(a, b);
  (void)matmul(c, b);
  (void)relu(a);
  p.stop();
  REQUIRE(trace::active_listener() == nullptr);
  auto ka = p.key_averages();
  const profile::KeyAverage* mm = ka.find("matmul");
  REQUIRE(mm != nullptr);
  CHECK(mm->calls == 4);
  CHECK(mm->kind == profile::EventKind::Op);
  CHECK(mm->total_ns >= mm->self_ns);
  REQUIRE(ka.find("relu") != nullptr);
  CHECK(ka.find("relu")->calls == 1);
  auto by_shape = p.key_averages(/*group_by_input_shapes=*/true);
  const auto* g1 = by_shape.find("matmul", "[[4, 8], [8, 5]]");
  const auto* g2 = by_shape.find("matmul", "[[3, 8], [8, 5]]");
  REQUIRE(g1 != nullptr);
  REQUIRE(g2 != nullptr);
  CHECK(g1->calls == 3);
  CHECK(g2->calls == 1);
  // Events carry the device of their first input.
  CHECK(named(p, "matmul").at(0)->device == Device::cpu());
  // The table names them and its columns.
  std::string t = by_shape.table(profile::SortBy::Calls);
  CHECK_THAT(t, Contains("Self host") && Contains("Calls") && Contains("matmul") && Contains("[[4, 8], [8, 5]]"));
  // Sorted by calls: the 3-call matmul row comes first.
  by_shape.sort(profile::SortBy::Calls);
  CHECK(by_shape.rows().at(0).calls == 3);
}

TEST_CASE("profiler: nested ranges and ops, self time is total minus children", "[profile]") {
  profile::Profiler p;
  Tensor<float> a = Tensor<float>::ones({64, 64});
  p.start();
  {
    profile::Range outer("outer");
    {
      profile::Range inner(std::string("inner"));
      (void)matmul(a, a);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    (void)exp(a);
  }
  p.stop();
  auto outer = named(p, "outer"), inner = named(p, "inner"), mm = named(p, "matmul"), ex = named(p, "exp");
  REQUIRE(outer.size() == 1);
  REQUIRE(inner.size() == 1);
  REQUIRE(mm.size() == 1);
  REQUIRE(ex.size() == 1);
  // Nesting: depth and containment.
  CHECK(inner[0]->depth == outer[0]->depth + 1);
  CHECK(mm[0]->depth == inner[0]->depth + 1);
  CHECK(inner[0]->begin_ns >= outer[0]->begin_ns);
  CHECK(inner[0]->end_ns <= outer[0]->end_ns);
  CHECK(mm[0]->begin_ns >= inner[0]->begin_ns);
  CHECK(mm[0]->end_ns <= inner[0]->end_ns);
  // Self time: exact arithmetic on the recorded integers.
  CHECK(outer[0]->self_ns == outer[0]->duration_ns() - inner[0]->duration_ns() - ex[0]->duration_ns());
  CHECK(inner[0]->self_ns == inner[0]->duration_ns() - mm[0]->duration_ns());
  CHECK(inner[0]->self_ns >= 2'000'000);  // the sleep is the inner range's own time
  CHECK(mm[0]->self_ns == mm[0]->duration_ns());
}

TEST_CASE("profiler: dotted module names from the module tree", "[profile]") {
  Net net;
  Tensor<float> x = Tensor<float>::ones({3, 8});
  profile::Profiler p;
  p.start();
  (void)net(x);
  (void)net(x);
  p.stop();
  auto ka = p.key_averages();
  for (const char* name : {"Net", "layers (Sequential)", "layers.0 (Block)", "layers.1 (Block)", "layers.0.fc (Linear)",
                           "layers.1.fc (Linear)", "head (Linear)"}) {
    INFO(name);
    const auto* r = ka.find(name);
    REQUIRE(r != nullptr);
    CHECK(r->kind == profile::EventKind::Module);
    CHECK(r->calls == 2);  // operator() and forward of the same call count once
  }
  // Nesting: a block's linear inside the block, inside layers, inside the net.
  auto fc = named(p, "layers.1.fc (Linear)");
  auto blk = named(p, "layers.1 (Block)");
  REQUIRE(fc.size() == 2);
  REQUIRE(blk.size() == 2);
  CHECK(fc[0]->depth == blk[0]->depth + 1);
  CHECK(fc[0]->begin_ns >= blk[0]->begin_ns);
  CHECK(fc[0]->end_ns <= blk[0]->end_ns);
  // A module's ops nest inside it: the matmul of head's linear.
  const auto* head = named(p, "head (Linear)").at(0);
  bool op_inside = false;
  for (const auto& e : p.events())
    if (e.kind == profile::EventKind::Op && e.begin_ns >= head->begin_ns && e.end_ns <= head->end_ns &&
        e.depth > head->depth)
      op_inside = true;
  CHECK(op_inside);
}

TEST_CASE("profiler: phases of a training step add up to the step", "[profile]") {
  Net net;
  optim::SGD opt(net.parameters(), {.lr = 0.01});
  Tensor<float> x = Tensor<float>::randn({16, 8}), y = Tensor<float>::randn({16, 2});
  profile::Profiler p;
  p.start();
  for (int step = 0; step < 3; ++step) {
    {
      trace::PhaseScope wait(trace::Phase::DataWait);
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    opt.zero_grad();
    Tensor<float> loss = nn::functional::mse_loss(net(x), y);
    loss.backward();
    opt.step();
    p.step(16);
  }
  p.stop();
  REQUIRE(p.steps().size() == 3);
  for (const auto& s : p.steps()) {
    int64_t sum = s.rest_ns;
    for (int64_t v : s.phase_ns) sum += v;
    CHECK(sum == s.duration_ns());  // exclusive phases plus the rest: the whole step, to the nanosecond
    CHECK(s.phase_ns[static_cast<size_t>(trace::Phase::DataWait)] >= 3'000'000);
    CHECK(s.phase_ns[static_cast<size_t>(trace::Phase::Forward)] > 0);
    CHECK(s.phase_ns[static_cast<size_t>(trace::Phase::Backward)] > 0);
    CHECK(s.phase_ns[static_cast<size_t>(trace::Phase::Optimizer)] > 0);
    CHECK(s.samples == 16);
  }
  // Steps follow each other.
  CHECK(p.steps()[1].begin_ns == p.steps()[0].end_ns);
  // Backward nodes appear as ops of their own.
  auto ka = p.key_averages();
  REQUIRE(ka.find("linear_backward") != nullptr);
  CHECK(ka.find("linear_backward")->kind == profile::EventKind::BackwardOp);
  CHECK(ka.find("linear_backward")->calls == 9);  // three linears, three steps
  // The step report: the table, samples/s, and a data-bound verdict (3 ms of a short step).
  profile::StepFigures avg = p.average_figures();
  CHECK(avg.samples_per_second > 0);
  CHECK(avg.data_wait_ms >= 3.0);
  std::string rep = p.step_report();
  CHECK_THAT(rep, Contains("Step breakdown") && Contains("avg") && Contains("Verdict") && Contains("Peak memory cpu"));
  if (avg.data_wait_ms / avg.step_ms > 0.10) CHECK_THAT(rep, Contains("data-bound"));
}

TEST_CASE("profiler: the step report's average is over the last `window` steps", "[profile]") {
  // Eight steps of different lengths and sample counts, a window of three: every figure of the
  // average comes from steps 5, 6 and 7 only, the reference computed here from their records.
  profile::Profiler p({.window = 3});
  p.start();
  for (int i = 0; i < 8; ++i) {
    {
      trace::PhaseScope wait(trace::Phase::DataWait);
      std::this_thread::sleep_for(std::chrono::milliseconds(i < 5 ? 6 : 1));
    }
    (void)relu(Tensor<float>::ones({64}));
    p.step(10 * (i + 1));
  }
  p.stop();
  const auto& steps = p.steps();
  REQUIRE(steps.size() == 8);
  double step_ms = 0, data_ms = 0, rest_ms = 0;
  int64_t samples = 0, window_ns = 0;
  for (size_t i = 5; i < 8; ++i) {
    step_ms += static_cast<double>(steps[i].duration_ns()) * 1e-6 / 3.0;
    data_ms += static_cast<double>(steps[i].phase_ns[static_cast<size_t>(trace::Phase::DataWait)]) * 1e-6 / 3.0;
    rest_ms += static_cast<double>(steps[i].rest_ns) * 1e-6 / 3.0;
    samples += steps[i].samples;
    window_ns += steps[i].duration_ns();
  }
  const profile::StepFigures avg = p.average_figures();
  CHECK(avg.step_ms == Approx(step_ms).epsilon(1e-12));
  CHECK(avg.data_wait_ms == Approx(data_ms).epsilon(1e-12));
  CHECK(avg.rest_ms == Approx(rest_ms).epsilon(1e-12));
  CHECK(samples == 60 + 70 + 80);
  CHECK(avg.samples_per_second == Approx(static_cast<double>(samples) / (static_cast<double>(window_ns) * 1e-9)).epsilon(1e-12));
  // The report's rows are the same three steps, and its avg row shows the average above.
  const std::string rep = p.step_report();
  CHECK_THAT(rep, Contains("\n5 ") && Contains("\n7 ") && !Contains("\n4 "));
  char total[32];
  std::snprintf(total, sizeof total, "%9.3f", avg.step_ms);
  CHECK_THAT(rep, Contains(std::string("avg     ") + total));
  // The span the device monitor averages its GPU utilisation over: the same three steps.
  CHECK(p.average_begin_ns() == p.origin_ns() + steps[5].begin_ns);
  CHECK(p.average_end_ns() == p.origin_ns() + steps[7].end_ns);

  // n steps of one small op each, recorded by a profiler; the mean duration in ms of its steps
  // [first, end), summed as the profiler's average.
  auto record_steps = [](profile::Profiler& s, int n) {
    s.start();
    for (int i = 0; i < n; ++i) {
      (void)relu(Tensor<float>::ones({64}));
      s.step(1);
    }
    s.stop();
  };
  auto mean_step_ms = [](const profile::Profiler& s, size_t first, size_t end) {
    double ms = 0;
    for (size_t i = first; i < end; ++i)
      ms += static_cast<double>(s.steps()[i].duration_ns()) * 1e-6 / static_cast<double>(end - first);
    return ms;
  };

  // Fewer steps than the window: all of them but the first (warm-up).
  profile::Profiler q({.window = 10});
  record_steps(q, 4);
  REQUIRE(q.steps().size() == 4);
  CHECK(q.average_figures().step_ms == Approx(mean_step_ms(q, 1, 4)).epsilon(1e-12));
  CHECK(q.average_begin_ns() == q.origin_ns() + q.steps()[1].begin_ns);
  CHECK(q.average_end_ns() == q.origin_ns() + q.steps()[3].end_ns);

  // A session that starts after the caller's own warm-up (the Trainer's profile window): its
  // first step counts, so a window of 3 steps averages 3.
  profile::Profiler r({.window = 3, .first_step_is_warmup = false});
  record_steps(r, 3);
  REQUIRE(r.steps().size() == 3);
  CHECK(r.average_figures().step_ms == Approx(mean_step_ms(r, 0, 3)).epsilon(1e-12));
  CHECK(r.average_begin_ns() == r.origin_ns() + r.steps()[0].begin_ns);
  // The breakdown is the report without its verdict.
  const std::string full = r.step_report(), breakdown = r.step_breakdown();
  CHECK(full.rfind(breakdown, 0) == 0);
  CHECK_THAT(full.substr(breakdown.size()), Contains("Verdict:"));
  CHECK(breakdown.find("Verdict:") == std::string::npos);
}

TEST_CASE("profiler: nested phases are exclusive, collectives total and exposed", "[profile]") {
  profile::Profiler p;
  p.start();
  {
    trace::PhaseScope back(trace::Phase::Backward);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    {
      trace::PhaseScope comm(trace::Phase::Communication);  // the wait at the end of backward
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  const int64_t t0 = trace::now_ns();
  trace::interval(trace::Phase::Communication, "all_reduce", t0 - 5'000'000, t0);  // 5 ms, measured elsewhere
  p.step();
  p.stop();
  REQUIRE(p.steps().size() == 1);
  const auto& s = p.steps()[0];
  const int64_t back = s.phase_ns[static_cast<size_t>(trace::Phase::Backward)];
  const int64_t comm = s.phase_ns[static_cast<size_t>(trace::Phase::Communication)];
  CHECK(back >= 2'000'000);
  CHECK(comm >= 2'000'000);
  // The nested wait is not counted twice: backward's share is its scope minus the wait's, exactly.
  auto back_ev = named(p, "backward"), comm_ev = named(p, "communication");
  REQUIRE(back_ev.size() == 1);
  REQUIRE(comm_ev.size() == 1);
  CHECK(back == back_ev[0]->duration_ns() - comm_ev[0]->duration_ns());
  CHECK(comm == comm_ev[0]->duration_ns());
  CHECK(s.communication_total_ns == 5'000'000);
  auto f = p.figures(s);
  CHECK(f.communication_total_ms == Approx(5.0));
  CHECK(f.communication_exposed_ms == Approx(static_cast<double>(comm) * 1e-6));
  CHECK_THAT(p.step_report(), Contains("hidden behind backward"));
}

TEST_CASE("profiler: memory peak per range and per phase", "[profile]") {
  profile::Profiler p;
  const int64_t before = memory_stats().current_bytes;
  p.start();
  {
    profile::Range r("alloc");
    trace::PhaseScope fwd(trace::Phase::Forward);
    Tensor<float> big = Tensor<float>::zeros({1 << 20});  // 4 MiB
    (void)exp(big);                                       // an op end reads memory: big and its result
  }
  p.step();
  p.stop();
  auto r = named(p, "alloc");
  REQUIRE(r.size() == 1);
  CHECK(r[0]->peak_bytes >= before + 8 * (1 << 20));
  CHECK(r[0]->device == Device::cpu());
  const auto& m = p.steps().at(0).memory.at(0);
  CHECK(m.device == Device::cpu());
  CHECK(m.phase_peak[static_cast<size_t>(trace::Phase::Forward)] >= before + 8 * (1 << 20));
  CHECK(m.peak_bytes >= m.phase_peak[static_cast<size_t>(trace::Phase::Forward)]);
  CHECK(m.capacity_bytes > 0);  // the host's memory size
  // The trace has the memory counter.
  bool counter = false;
  for (const auto& c : p.counters()) counter = counter || c.name == "memory cpu";
  CHECK(counter);
}

TEST_CASE("profiler: the Chrome trace parses back, with thread tracks and nested events", "[profile][trace]") {
  const testing::TempDir tmp("ember_test_profiler_trace");
  const fs::path& dir = tmp.path;
  Net net;
  Tensor<float> x = Tensor<float>::ones({2, 8});
  profile::Profiler p({.trace_path = (dir / "trace.json").string()});
  p.start();
  {
    profile::Range r("quote\" back\\slash \n newline \xff bad utf8");
    (void)net(x);
  }
  std::thread worker([] {
    profile::Range r("worker range");
    (void)relu(Tensor<float>::ones({4}));
  });
  worker.join();
  p.step();
  p.stop();
  nlohmann::json j = read_json(dir / "trace.json");
  REQUIRE(j.contains("traceEvents"));
  REQUIRE(j["traceEvents"].is_array());
  std::set<int> tids_with_events;
  std::map<std::string, nlohmann::json> by_name;
  int thread_names = 0;
  for (const auto& e : j["traceEvents"]) {
    REQUIRE(e.contains("ph"));
    if (e["ph"] == "M" && e["name"] == "thread_name") ++thread_names;
    if (e["ph"] == "X") {
      REQUIRE(e["ts"].is_number());
      REQUIRE(e["dur"].is_number());
      tids_with_events.insert(e["tid"].get<int>());
      by_name[e["name"].get<std::string>()] = e;
    }
  }
  CHECK(thread_names >= 2);
  CHECK(tids_with_events.size() >= 2);  // the training thread and the worker
  REQUIRE(by_name.count("worker range"));
  REQUIRE(by_name.count("relu"));
  CHECK(by_name["worker range"]["tid"] == by_name["relu"]["tid"]);
  // The awkward name came through escaped (the bad byte as U+FFFD).
  REQUIRE(by_name.count("quote\" back\\slash \n newline \xEF\xBF\xBD bad utf8"));
  // Nesting survives: layers.0.fc inside layers.0 on the same track.
  const auto& outer = by_name.at("layers.0 (Block)");
  const auto& inner = by_name.at("layers.0.fc (Linear)");
  CHECK(inner["tid"] == outer["tid"]);
  CHECK(inner["ts"].get<double>() >= outer["ts"].get<double>());
  CHECK(inner["ts"].get<double>() + inner["dur"].get<double>() <=
        outer["ts"].get<double>() + outer["dur"].get<double>() + 0.002);
  CHECK(by_name.count("ProfilerStep#0"));
}

namespace {
void profiled_work_that_throws(profile::Profiler& p) {
  profile::ProfileScope scope(p);
  profile::Range r("doomed");
  (void)relu(Tensor<float>::ones({4}));
  throw ValueError("boom");
}
}  // namespace

TEST_CASE("profiler: the trace is valid JSON when the program throws mid-profile", "[profile][trace]") {
  const testing::TempDir tmp("ember_test_profiler_throw");
  const fs::path& dir = tmp.path;
  profile::Profiler p({.trace_path = (dir / "t.json").string()});
  REQUIRE_THROWS_AS(profiled_work_that_throws(p), ValueError);
  REQUIRE_FALSE(p.is_recording());
  REQUIRE(trace::active_listener() == nullptr);
  nlohmann::json j = read_json(dir / "t.json");
  bool doomed = false, relu_seen = false;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("name", "") == "doomed") doomed = true;
    if (e.value("name", "") == "relu") relu_seen = true;
  }
  CHECK(doomed);
  CHECK(relu_seen);
  // No temporary file is left beside it.
  int files = 0;
  for (auto& f : fs::directory_iterator(dir)) {
    (void)f;
    ++files;
  }
  CHECK(files == 1);
}

TEST_CASE("profiler: a range open on another thread at stop() is closed as unfinished", "[profile][trace]") {
  profile::Profiler p;
  std::mutex m;
  std::condition_variable cv;
  bool opened = false, stopped = false;
  p.start();
  std::thread t([&] {
    profile::Range r("long");
    {
      std::unique_lock<std::mutex> lock(m);
      opened = true;
      cv.notify_all();
      cv.wait(lock, [&] { return stopped; });
    }
    (void)relu(Tensor<float>::ones({2}));  // after stop: dropped, not mismatched
  });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return opened; });
  }
  p.stop();
  {
    std::lock_guard<std::mutex> lock(m);
    stopped = true;
  }
  cv.notify_all();
  t.join();
  auto ev = named(p, "long");
  REQUIRE(ev.size() == 1);
  CHECK(ev[0]->unfinished);
  CHECK(named(p, "relu").empty());
  nlohmann::json j = nlohmann::json::parse(p.chrome_trace_json());
  bool flagged = false;
  for (const auto& e : j["traceEvents"])
    if (e.value("name", "") == "long") flagged = e["args"].value("unfinished", false);
  CHECK(flagged);
}

TEST_CASE("profiler: a second session starts clean, scopes straddling start are dropped", "[profile]") {
  profile::Profiler p;
  p.start();
  (void)relu(Tensor<float>::ones({2}));
  p.stop();
  REQUIRE(named(p, "relu").size() == 1);
  {
    profile::Range before("before start");  // sees no listener: records nothing, ends nothing
    p.start();
    (void)exp(Tensor<float>::ones({2}));
  }
  p.stop();
  CHECK(named(p, "relu").empty());
  CHECK(named(p, "exp").size() == 1);
  CHECK(named(p, "before start").empty());
  CHECK(p.steps().size() == 1);  // no step(): the session is one step
}

TEST_CASE("profiler: misuse errors name the problem", "[profile][errors]") {
  profile::Profiler p;
  REQUIRE_THROWS_WITH(p.stop(), Contains("Profiler::stop: not recording"));
  REQUIRE_THROWS_AS(p.step(), ValueError);
  REQUIRE_THROWS_WITH(p.step(), Contains("call start() first"));
  p.start();
  REQUIRE_THROWS_WITH(p.start(), Contains("already recording"));
  profile::Profiler other;
  REQUIRE_THROWS_AS(other.start(), ValueError);
  REQUIRE_THROWS_WITH(other.start(), Contains("another profiler is recording"));
  p.stop();
  REQUIRE_THROWS_WITH(profile::Profiler({.window = 0}), Contains("window must be >= 1"));
  // An unwritable trace path is an IOError from stop(), and the session still ends.
  profile::Profiler bad({.trace_path = "/nonexistent_dir_ember/trace.json"});
  bad.start();
  REQUIRE_THROWS_AS(bad.stop(), IOError);
  CHECK_FALSE(bad.is_recording());
  CHECK(trace::active_listener() == nullptr);
}

TEST_CASE("verdict: each rule on synthetic figures", "[profile][verdict]") {
  using profile::VerdictKind;
  auto kinds = [](const profile::StepFigures& f) {
    std::vector<VerdictKind> out;
    for (const auto& v : profile::verdict(f)) out.push_back(v.kind);
    return out;
  };
  auto has = [&](const profile::StepFigures& f, VerdictKind k) {
    auto v = kinds(f);
    return std::find(v.begin(), v.end(), k) != v.end();
  };
  profile::StepFigures base;
  base.step_ms = 100;
  base.device = "cuda:0";
  // Nothing known beyond the step: no rule.
  CHECK(kinds(base) == std::vector<VerdictKind>{VerdictKind::NoBottleneck});

  auto f = base;
  f.data_wait_ms = 10.0;  // exactly 10%: not over
  CHECK_FALSE(has(f, VerdictKind::DataBound));
  f.data_wait_ms = 10.5;
  CHECK(has(f, VerdictKind::DataBound));
  CHECK_THAT(profile::verdict(f)[0].message, Contains("10.5%") && Contains("DataLoader workers") && Contains("packed"));

  f = base;
  f.device_busy = 0.4;
  CHECK(has(f, VerdictKind::HostBound));
  f.data_wait_ms = 30;  // a data-bound step is not called host-bound
  CHECK_FALSE(has(f, VerdictKind::HostBound));
  CHECK(has(f, VerdictKind::DataBound));
  f = base;
  f.device_busy = 0.5;
  CHECK_FALSE(has(f, VerdictKind::HostBound));
  f.device_busy = -1;  // unknown
  CHECK_FALSE(has(f, VerdictKind::HostBound));

  f = base;
  f.capacity_bytes = 1000;
  f.peak_bytes = 499;
  CHECK(has(f, VerdictKind::MemoryHeadroom));
  CHECK_THAT(profile::verdict(f)[0].message, Contains("find_max_batch_size"));
  f.peak_bytes = 500;
  CHECK_FALSE(has(f, VerdictKind::MemoryHeadroom));
  CHECK_FALSE(has(f, VerdictKind::MemoryLimit));
  f.peak_bytes = 900;
  CHECK(has(f, VerdictKind::MemoryLimit));
  CHECK_THAT(profile::verdict(f)[0].message, Contains("mixed precision") && Contains("nn::recompute"));
  f.capacity_bytes = -1;  // unknown capacity
  CHECK_FALSE(has(f, VerdictKind::MemoryLimit));

  f = base;
  f.communication_exposed_ms = 12;
  f.communication_total_ms = 40;
  CHECK(has(f, VerdictKind::CommunicationBound));
  CHECK_THAT(profile::verdict(f)[0].message, Contains("gradient_as_bucket_view") && Contains("no_sync"));
  f.communication_exposed_ms = 9;  // most of it hidden
  CHECK_FALSE(has(f, VerdictKind::CommunicationBound));

  // Several at once, in the documented order.
  f = base;
  f.data_wait_ms = 50;
  f.communication_exposed_ms = 20;
  f.capacity_bytes = 100;
  f.peak_bytes = 95;
  CHECK(kinds(f) == std::vector<VerdictKind>{VerdictKind::DataBound, VerdictKind::CommunicationBound,
                                              VerdictKind::MemoryLimit});
  // Thresholds are settable.
  f = base;
  f.data_wait_ms = 6;
  CHECK(has(f, VerdictKind::NoBottleneck));
  CHECK(kinds(f).size() == 1);
  profile::VerdictThresholds strict;
  strict.data_wait_fraction = 0.05;
  auto v = profile::verdict(f, strict);
  CHECK(v.at(0).kind == VerdictKind::DataBound);
}

TEST_CASE("profiler: step report uses the device monitor's figures for a GPU-less verdict", "[profile][verdict]") {
  // A CPU run has no device utilisation: no host-bound line, whatever the monitor says about GPUs.
  profile::Profiler p;
  p.set_device_utilisation({.busy_fraction = 0.1, .total_bytes = int64_t{1} << 34});
  p.start();
  (void)relu(Tensor<float>::ones({8}));
  p.step(8);
  p.stop();
  auto f = p.average_figures();
  CHECK(f.device == "cpu");
  CHECK(f.device_busy < 0);
  CHECK_THAT(p.step_report(), !Contains("host/launch-bound"));
}

namespace {
// A pretend cuda:0 (CPU kernels) whose timing events are host timestamps, to exercise the
// profiler's device-time path (record per op, read back at the step's end, release) without a GPU.
class TimedPretendGpu : public cpu::CpuBackend {
 public:
  Device device() const override { return Device::cuda(0); }
  uint64_t timing_event_record() override {
    std::lock_guard<std::mutex> lock(mu_);
    stamps_.push_back(trace::now_ns());
    ++recorded_;
    return stamps_.size();
  }
  double timing_event_elapsed_ms(uint64_t a, uint64_t b) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++reads_;
    if (a == 0 || b == 0 || a > stamps_.size() || b > stamps_.size()) return -1;
    return static_cast<double>(stamps_[b - 1] - stamps_[a - 1]) * 1e-6;
  }
  void timing_events_release() override {
    std::lock_guard<std::mutex> lock(mu_);
    stamps_.clear();
    ++releases_;
  }
  std::mutex mu_;
  std::vector<int64_t> stamps_;
  int recorded_ = 0, reads_ = 0, releases_ = 0;
};
TimedPretendGpu& timed_gpu() {
  static TimedPretendGpu g;
  return g;
}
struct InstallTimedGpu {
  Backend* (*saved)(int) = detail::cuda_backend_factory();
  int count = detail::cuda_device_count_slot();
  InstallTimedGpu() {
    register_cuda_backend([](int) -> Backend* { return &timed_gpu(); }, 1);
  }
  ~InstallTimedGpu() { register_cuda_backend(saved, count); }
};

// The tests that install a pretend cuda:0 skip (and say so) where a real GPU is present.
bool skip_on_real_gpu() {
  if (!cuda::is_available()) return false;
  std::printf("SKIPPED: a real GPU is present (this test installs a pretend cuda:0)\n");
  return true;
}
}  // namespace

TEST_CASE("profiler: device time from timing events, read back once per step", "[profile][device]") {
  if (skip_on_real_gpu()) return;
  InstallTimedGpu install;
  Tensor<float> a = Tensor<float>::ones({32, 32}).to(Device::cuda(0));
  const testing::TempDir tmp("ember_test_profiler_device");
  const fs::path& dir = tmp.path;
  profile::Profiler p({.trace_path = (dir / "t.json").string()});
  p.start();
  for (int step = 0; step < 2; ++step) {
    const int reads_before = timed_gpu().reads_;
    (void)matmul(a, a);
    (void)relu(a);
    CHECK(timed_gpu().reads_ == reads_before);  // nothing read (no synchronisation) mid-step
    p.step();
    CHECK(timed_gpu().reads_ > reads_before);   // read back at the step's end
  }
  p.stop();
  CHECK(timed_gpu().releases_ >= 2);  // events returned to the pool at each step's end
  auto mm = named(p, "matmul");
  REQUIRE(mm.size() == 2);
  // The pretend device's events are host timestamps taken just after the op's own begin and end
  // times, so its device time can exceed the op's host time by how long the thread waited between
  // the two reads of the clock at the end (a preemption on a loaded machine: 1.9 us seen in CI).
  // The bound allows 2 ms of that.
  constexpr int64_t kClockSlackNs = 2'000'000;
  for (const auto* e : mm) {
    CHECK(e->device == Device::cuda(0));
    CHECK(e->device_ns >= 0);
    CHECK(e->device_ns <= e->duration_ns() + kClockSlackNs);
    CHECK(e->device_begin_ns >= e->begin_ns - 1000);
  }
  for (const auto& s : p.steps()) {
    CHECK(s.device_ns >= 0);
    CHECK(s.device_ns <= s.duration_ns() + kClockSlackNs);
  }
  auto f = p.figures(p.steps()[1]);
  CHECK(f.device == "cuda:0");
  CHECK(f.device_busy >= 0);
  CHECK(f.device_busy <= 1.01);  // the same clock slack, over a whole step
  auto ka = p.key_averages();
  REQUIRE(ka.find("matmul") != nullptr);
  CHECK(ka.find("matmul")->device_ns >= 0);
  CHECK_THAT(ka.table(), Contains("Device"));
  CHECK_THAT(p.step_report(), Contains("Device busy"));
  // The trace has a device track with the ops.
  nlohmann::json j = read_json(dir / "t.json");
  int device_events = 0;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X" && e["pid"] == 1) ++device_events;
  CHECK(device_events == 4);
}

TEST_CASE("profiler: tensor methods that copy or cast are ops with names, shapes and dtypes", "[profile]") {
  Tensor<float> a = Tensor<float>::ones({3, 4});
  Tensor<double> d = Tensor<double>::zeros({3, 4});
  Tensor<float> dst = Tensor<float>::zeros({3, 4});
  profile::Profiler p;
  p.start();
  (void)a.clone();
  (void)a.to<half>();
  (void)a.to(DType::Float64);
  (void)a.to<float>();                // same dtype: no work, no op
  (void)a.to(Device::cpu());          // same device: no work, no op
  dst.copy_(d);                       // a cast of the source nests as to_dtype
  dst.copy_(a);
  p.stop();
  auto clone = named(p, "clone");
  REQUIRE(clone.size() == 1);
  CHECK(clone[0]->kind == profile::EventKind::Op);
  CHECK(clone[0]->shapes == "[[3, 4]]");
  CHECK(clone[0]->dtypes == "[float32]");
  CHECK(clone[0]->device == Device::cpu());
  auto casts = named(p, "to_dtype");
  REQUIRE(casts.size() == 3);  // to<half>, to(Float64), and the cast inside copy_(d)
  CHECK(casts[0]->dtypes == "[float32]");
  CHECK(casts[1]->dtypes == "[float32]");
  CHECK(casts[2]->dtypes == "[float64]");
  for (const auto* e : casts) CHECK(e->shapes == "[[3, 4]]");
  auto copies = named(p, "copy_");
  REQUIRE(copies.size() == 2);
  CHECK(copies[0]->dtypes == "[float64]");  // the source's
  CHECK(copies[1]->dtypes == "[float32]");
  CHECK(casts[2]->depth == copies[0]->depth + 1);  // nested in the copy
  CHECK(casts[2]->begin_ns >= copies[0]->begin_ns);
  CHECK(casts[2]->end_ns <= copies[0]->end_ns);
  CHECK(copies[0]->self_ns <= copies[0]->duration_ns() - casts[2]->duration_ns());
  CHECK(named(p, "to_device").empty());
  auto ka = p.key_averages();
  REQUIRE(ka.find("to_dtype") != nullptr);
  CHECK(ka.find("to_dtype")->calls == 3);
  REQUIRE(ka.find("copy_") != nullptr);
  CHECK(ka.find("copy_")->calls == 2);
  CHECK(ka.find("clone")->calls == 1);
}

TEST_CASE("profiler: device copies are to_device ops, in the trace with dtypes", "[profile][device]") {
  if (skip_on_real_gpu()) return;
  testing::PretendGpu gpu;
  REQUIRE(gpu.active);
  Tensor<float> a = Tensor<float>::ones({2, 5});
  const testing::TempDir tmp("ember_test_profiler_to_device");
  const fs::path& dir = tmp.path;
  profile::Profiler p({.trace_path = (dir / "t.json").string()});
  p.start();
  Tensor<float> g = a.to(Device::cuda(0));
  Tensor<float> back = g.to(Device::cpu());
  p.stop();
  auto up = named(p, "to_device");
  REQUIRE(up.size() == 2);
  CHECK(up[0]->device == Device::cpu());      // the source of the upload
  CHECK(up[1]->device == Device::cuda(0));    // the source of the download
  CHECK(up[0]->shapes == "[[2, 5]]");
  CHECK(up[0]->dtypes == "[float32]");
  CHECK(back.to_vector() == std::vector<float>(10, 1.0f));
  nlohmann::json j = read_json(dir / "t.json");
  int found = 0;
  for (const auto& e : j["traceEvents"])
    if (e.value("name", "") == "to_device") {
      ++found;
      CHECK(e["args"]["input_shapes"] == "[[2, 5]]");
      CHECK(e["args"]["input_dtypes"] == "[float32]");
    }
  CHECK(found == 2);
}

TEST_CASE("profiler: GPU ops on other threads have no device time and leave the step's alone", "[profile][device]") {
  // Device time is measured for the thread that called start() only. A timing event is recorded
  // on the device's one compute stream, which every thread's ops share: the time between two
  // events of a worker's op includes whatever other threads queued in between, so it cannot be
  // attributed, and a worker recording events would also race with the step thread returning the
  // pool at the step's end. So workers record none; their ops keep host times only.
  if (skip_on_real_gpu()) return;
  InstallTimedGpu install;
  Tensor<float> a = Tensor<float>::ones({16, 16}).to(Device::cuda(0));
  profile::Profiler p;
  p.start();
  for (int step = 0; step < 2; ++step) {
    const int recorded_before = timed_gpu().recorded_;
    std::thread worker([&] {
      (void)sigmoid(a);
      (void)sigmoid(a);
    });
    worker.join();
    CHECK(timed_gpu().recorded_ == recorded_before);  // the worker recorded no timing event
    (void)matmul(a, a);
    CHECK(timed_gpu().recorded_ > recorded_before);   // the step thread's op did
    p.step();
  }
  p.stop();
  auto sg = named(p, "sigmoid");
  REQUIRE(sg.size() == 4);
  for (const auto* e : sg) {
    CHECK(e->thread != 0);
    CHECK(e->device == Device::cuda(0));
    CHECK(e->device_ns == -1);
    CHECK(e->duration_ns() > 0);
  }
  auto mm = named(p, "matmul");
  REQUIRE(mm.size() == 2);
  for (const auto* e : mm) CHECK(e->device_ns >= 0);
  for (const auto& s : p.steps()) {
    CHECK(s.device_ns >= 0);
    CHECK(s.device_ns <= s.duration_ns());
  }
  auto ka = p.key_averages();
  REQUIRE(ka.find("sigmoid") != nullptr);
  CHECK(ka.find("sigmoid")->device_ns == -1);  // "-" in the table
  CHECK(ka.find("matmul")->device_ns >= 0);
}

TEST_CASE("profiler: DataParallel over 2 thread ranks records total and exposed communication", "[profile][dist]") {
  // Rank 0 trains on the thread that starts the profiler (the step thread), rank 1 on another.
  // Tiny buckets: several all-reduces per backward, some overlapping the rest of backward.
  auto groups = dist::ThreadProcessGroup::create(2);
  auto make = [] {
    auto m = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::Tanh>(),
                                              std::make_shared<nn::Linear>(16, 3));
    Generator gen(7);
    NoGradGuard no_grad;
    for (auto& [n, prm] : m->named_parameters()) {
      AnyTensor t = prm;
      nn::init::uniform_(t, -0.5, 0.5, gen);
    }
    return m;
  };
  dist::DataParallelOptions o;
  o.bucket_cap_bytes = 256;
  o.first_bucket_bytes = 128;
  constexpr int kSteps = 4;
  auto train = [&](int rank, profile::Profiler* prof) {
    auto m = make();
    dist::DataParallel dp(m, *groups[static_cast<size_t>(rank)], o);
    optim::SGD opt(m->parameters(), {.lr = 0.05});
    Generator data(100 + static_cast<uint64_t>(rank));
    for (int step = 0; step < kSteps; ++step) {
      FloatTensor x = FloatTensor::randn({8, 6}, Device::cpu(), 0.0, 1.0, data);
      FloatTensor y = FloatTensor::randn({8, 3}, Device::cpu(), 0.0, 1.0, data);
      opt.zero_grad();
      nn::functional::mse_loss(dp(x), y).backward();
      opt.step();
      if (prof) prof->step(8);
    }
  };
  profile::Profiler p;
  p.start();
  std::exception_ptr error1;
  std::thread rank1([&] {
    try {
      train(1, nullptr);
    } catch (...) {
      error1 = std::current_exception();
    }
  });
  train(0, &p);
  rank1.join();
  p.stop();
  if (error1) std::rethrow_exception(error1);

  REQUIRE(p.steps().size() == kSteps);
  // The step thread's own all-reduces (async events on thread 0), per step.
  std::vector<int64_t> own_total(kSteps, 0);
  int other_rank_async = 0;
  for (const auto& e : p.events()) {
    if (e.kind != profile::EventKind::Async) continue;
    if (e.thread != 0) {
      ++other_rank_async;
      continue;
    }
    for (size_t i = 0; i < p.steps().size(); ++i)
      if (e.end_ns > p.steps()[i].begin_ns && e.end_ns <= p.steps()[i].end_ns) own_total[i] += e.duration_ns();
  }
  CHECK(other_rank_async > 0);  // rank 1's are in the trace too
  for (size_t i = 0; i < p.steps().size(); ++i) {
    const auto& s = p.steps()[i];
    const int64_t exposed = s.phase_ns[static_cast<size_t>(trace::Phase::Communication)];
    CHECK(s.communication_total_ns > 0);
    CHECK(exposed > 0);                                   // the waits at the end of backward
    // (No exposed <= total here: a wait for an all-reduce already seen done during backward lies
    // outside its interval, and on a loaded machine the thread can be descheduled inside it.)
    CHECK(s.communication_total_ns == own_total[i]);      // rank 1's all-reduces are not added
    CHECK(s.phase_ns[static_cast<size_t>(trace::Phase::Backward)] > 0);
    CHECK(s.phase_ns[static_cast<size_t>(trace::Phase::Forward)] > 0);
    CHECK(s.phase_ns[static_cast<size_t>(trace::Phase::Optimizer)] > 0);
    int64_t sum = s.rest_ns;
    for (int64_t v : s.phase_ns) sum += v;
    CHECK(sum == s.duration_ns());                        // the phases add up to the step
    auto f = p.figures(s);
    CHECK(f.communication_exposed_ms == Approx(static_cast<double>(exposed) * 1e-6));
    CHECK(f.communication_total_ms == Approx(static_cast<double>(s.communication_total_ns) * 1e-6));
    const double parts = f.data_wait_ms + f.host_to_device_ms + f.forward_ms + f.backward_ms + f.optimizer_ms +
                         f.communication_exposed_ms + f.checkpoint_save_ms + f.rest_ms;
    CHECK(parts == Approx(f.step_ms).epsilon(1e-9));
  }
  // Rank 1's exposed waits are on its own thread's track, not in the step: the step thread's
  // communication phases are the only ones charged.
  int comm_phases_rank0 = 0;
  for (const auto& e : p.events())
    if (e.kind == profile::EventKind::Phase && e.name == "communication" && e.thread == 0) ++comm_phases_rank0;
  CHECK(comm_phases_rank0 >= kSteps);
  const std::string report = p.step_report();
  CHECK_THAT(report, Contains("comm total") && Contains("Verdict"));
}

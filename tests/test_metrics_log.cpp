// logging::MetricsLogger and its sinks: CRC-32C known answers, TFRecord framing and Event
// encoding read back by ember's own decoder and by the Python tensorboard package's reader
// (SKIPPED when it cannot be imported), JSON lines parsed back with nlohmann-json, CSV quoting,
// hparams.json written atomically, malformed event files rejected with FormatError, misuse errors.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <ember/logging/metrics_logger.hpp>
#include <ember/profile/profiler.hpp>
#include <ember/profile/step_log.hpp>

#include "temp_dir.hpp"
#include "test_util.hpp"

using namespace ember;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {
std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}
}  // namespace

TEST_CASE("crc32c: known answers (RFC 3720 B.4 and the check value)", "[log][crc]") {
  const std::string check = "123456789";
  CHECK(logging::crc32c(check.data(), check.size()) == 0xE3069283u);
  unsigned char zeros[32] = {}, ones[32], inc[32], dec[32];
  for (int i = 0; i < 32; ++i) {
    ones[i] = 0xFF;
    inc[i] = static_cast<unsigned char>(i);
    dec[i] = static_cast<unsigned char>(31 - i);
  }
  CHECK(logging::crc32c(zeros, 32) == 0x8A9136AAu);
  CHECK(logging::crc32c(ones, 32) == 0x62A8AB43u);
  CHECK(logging::crc32c(inc, 32) == 0x46DD794Eu);
  CHECK(logging::crc32c(dec, 32) == 0x113FDB5Cu);
  CHECK(logging::crc32c(nullptr, 0) == 0u);
  // Incremental equals one pass.
  CHECK(logging::crc32c(check.data() + 4, 5, logging::crc32c(check.data(), 4)) == 0xE3069283u);
  // Masking is TensorFlow's, and invertible.
  const uint32_t c = 0xE3069283u;
  CHECK(logging::mask_crc32c(c) == (((c >> 15) | (c << 17)) + 0xA282EAD8u));
  CHECK(logging::unmask_crc32c(logging::mask_crc32c(c)) == c);
}

TEST_CASE("tfrecord: framing round trip and corruption detected", "[log][tfrecord]") {
  std::string stream = logging::tfrecord("hello") + logging::tfrecord("") + logging::tfrecord(std::string(300, 'x'));
  REQUIRE(stream.size() == (12 + 5 + 4) + (12 + 0 + 4) + (12 + 300 + 4));
  auto recs = logging::read_tfrecords(stream);
  REQUIRE(recs.size() == 3);
  CHECK(recs[0] == "hello");
  CHECK(recs[1].empty());
  CHECK(recs[2] == std::string(300, 'x'));
  // A flipped payload byte, a flipped length byte, a truncation: FormatError naming the record.
  std::string bad = stream;
  bad[12] ^= 1;
  REQUIRE_THROWS_AS(logging::read_tfrecords(bad, "f"), FormatError);
  REQUIRE_THROWS_WITH(logging::read_tfrecords(bad, "f"), Contains("f: record 0") && Contains("data CRC mismatch"));
  bad = stream;
  bad[21 + 2] ^= 0x40;  // second record's length
  REQUIRE_THROWS_WITH(logging::read_tfrecords(bad), Contains("record 1") && Contains("length CRC mismatch"));
  REQUIRE_THROWS_WITH(logging::read_tfrecords(stream.substr(0, stream.size() - 3)),
                      Contains("record 2") && Contains("runs past the end"));
  REQUIRE_THROWS_WITH(logging::read_tfrecords(stream.substr(0, 7)), Contains("truncated header"));
  // Every truncation of a valid stream fails cleanly or reads a prefix of whole records.
  for (size_t n = 0; n < stream.size(); ++n) {
    try {
      auto r = logging::read_tfrecords(stream.substr(0, n));
      CHECK(r.size() <= 3);
    } catch (const FormatError&) {
    }
  }
}

TEST_CASE("event encoding: scalars and text decode back, malformed protobuf is a FormatError", "[log][tfrecord]") {
  std::string e = logging::summary_event(1234.5, 42, {logging::scalar_value("loss", 0.25f),
                                                       logging::text_value("note", "hi \xc3\xa9")});
  auto d = logging::decode_event(e);
  CHECK(d.wall_time == 1234.5);
  CHECK(d.step == 42);
  REQUIRE(d.values.size() == 2);
  CHECK(d.values[0].tag == "loss");
  CHECK(d.values[0].has_simple_value);
  CHECK(d.values[0].simple_value == 0.25f);
  CHECK(d.values[1].tag == "note");
  CHECK(d.values[1].plugin_name == "text");
  REQUIRE(d.values[1].string_val.size() == 1);
  CHECK(d.values[1].string_val[0] == "hi \xc3\xa9");
  auto h = logging::decode_event(logging::event_header(1.0));
  CHECK(h.file_version == "brain.Event:2");
  // A large step encodes as a multi-byte varint.
  CHECK(logging::decode_event(logging::summary_event(0, int64_t{1} << 40, {})).step == int64_t{1} << 40);
  // Every truncation is rejected or decodes; none reads out of bounds.
  int rejected = 0;
  for (size_t n = 0; n < e.size(); ++n) {
    try {
      (void)logging::decode_event(std::string_view(e).substr(0, n));
    } catch (const FormatError&) {
      ++rejected;
    }
  }
  CHECK(rejected > 0);
  REQUIRE_THROWS_WITH(logging::decode_event(std::string("\x2a\xff", 2)), Contains("truncated varint"));
  REQUIRE_THROWS_WITH(logging::decode_event(std::string("\x2a\x05\x01", 3)), Contains("runs past"));
}

TEST_CASE("metrics logger: JSON lines, CSV, event file and hparams.json", "[log][metrics]") {
  const testing::TempDir tmp("ember_test_metrics_sinks");
  const fs::path& dir = tmp.path;
  fs::path event_path;
  {
    logging::MetricsLogger log(dir / "run");
    log.log_hparams({{"lr", 0.1}, {"optimizer", std::string("sgd \"momentum\"")}, {"batch_size", 64.0}});
    for (int step = 1; step <= 3; ++step)
      log.log_scalars(step, {{"train/loss", 1.0 / step}, {"odd,tag", static_cast<double>(step)}});
    log.log_scalar(4, "nan metric", std::nan(""));
    log.log_text(3, "notes", "line one\nline two");
    log.flush();
    event_path = log.event_file();
  }
  // hparams.json: parsed back, numbers as numbers.
  auto hp = nlohmann::json::parse(slurp(dir / "run" / "hparams.json"));
  CHECK(hp["lr"] == 0.1);
  CHECK(hp["optimizer"] == "sgd \"momentum\"");
  CHECK(hp["batch_size"] == 64);
  // JSON lines: one object per call, in order.
  std::ifstream jl(dir / "run" / "metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(jl, l);) lines.push_back(nlohmann::json::parse(l));
  REQUIRE(lines.size() == 1 + 3 + 1 + 1);  // hparams text, 3 scalar steps, nan, notes
  CHECK(lines[0]["tag"] == "hparams");
  CHECK_THAT(lines[0]["text"].get<std::string>(), Contains("| lr | 0.1 |"));
  CHECK(lines[1]["step"] == 1);
  CHECK(lines[1]["train/loss"] == 1.0);
  CHECK(lines[3]["train/loss"].get<double>() == Approx(1.0 / 3));
  CHECK(lines[3]["odd,tag"] == 3.0);
  CHECK(lines[1]["wall_time"].get<double>() > 1.6e9);
  CHECK(lines[4]["nan metric"].is_null());
  CHECK(lines[5]["text"] == "line one\nline two");
  // CSV: header, quoted tag, one row per value.
  const std::string csv = slurp(dir / "run" / "metrics.csv");
  CHECK(csv.rfind("step,wall_time,tag,value\n", 0) == 0);
  CHECK_THAT(csv, Contains(",train/loss,0.5\n") && Contains(",\"odd,tag\",2\n") && Contains(",nan metric,nan\n"));
  // The event file: ember's reader checks the CRCs and decodes every event.
  REQUIRE(fs::exists(event_path));
  CHECK(event_path.filename().string().rfind("events.out.tfevents.", 0) == 0);
  auto recs = logging::read_tfrecords(slurp(event_path), event_path.string());
  REQUIRE(recs.size() == 1 + 1 + 3 + 1 + 1);
  CHECK(logging::decode_event(recs[0]).file_version == "brain.Event:2");
  auto e2 = logging::decode_event(recs[2]);
  CHECK(e2.step == 1);
  REQUIRE(e2.values.size() == 2);
  CHECK(e2.values[0].tag == "train/loss");
  CHECK(e2.values[0].simple_value == 1.0f);
  auto txt = logging::decode_event(recs.back());
  CHECK(txt.values.at(0).string_val.at(0) == "line one\nline two");
  // Appending: a second logger on the same folder keeps the CSV header single and adds a new event file.
  {
    logging::MetricsLogger again(dir / "run");
    again.log_scalar(5, "train/loss", 0.1);
  }
  const std::string csv2 = slurp(dir / "run" / "metrics.csv");
  size_t headers = 0;
  for (size_t pos = 0; (pos = csv2.find("step,wall_time", pos)) != std::string::npos; ++pos) ++headers;
  CHECK(headers == 1);
  int event_files = 0;
  for (auto& f : fs::directory_iterator(dir / "run"))
    if (f.path().filename().string().find("tfevents") != std::string::npos) ++event_files;
  CHECK(event_files == 2);
}

TEST_CASE("metrics logger: the Python tensorboard package reads the event file", "[log][metrics][python]") {
  const std::string py = EMBER_PYTHON_EXE;
  if (py.empty()) {
    std::printf("SKIPPED: no Python interpreter configured (EMBER_PYTHON)\n");
    return;
  }
  const testing::TempDir tmp("ember_test_metrics_tensorboard");
  const fs::path& dir = tmp.path;
  {
    logging::MetricsLogger log(dir, {.jsonl = false, .csv = false});
    for (int step = 0; step < 5; ++step) log.log_scalars(step, {{"loss", 2.0 - 0.25 * step}, {"lr", 0.1}});
    log.log_text(2, "notes", "hello tensorboard");
    log.log_hparams({{"lr", 0.1}});
  }
  const fs::path script = dir / "read_events.py";
  {
    std::ofstream s(script);
    s << R"PY(import json, sys
try:
    from tensorboard.backend.event_processing import event_accumulator, event_file_loader
except Exception as e:  # noqa: BLE001
    print("SKIPPED: tensorboard is not importable: %s" % e)
    sys.exit(0)
import glob
path = glob.glob(sys.argv[1] + "/events.out.tfevents.*")[0]
events = []
for ev in event_file_loader.EventFileLoader(path).Load():  # checks both CRCs of every record
    d = {"step": ev.step, "wall_time": ev.wall_time, "file_version": ev.file_version, "values": []}
    for v in ev.summary.value:
        item = {"tag": v.tag}
        if v.HasField("simple_value"):
            item["simple_value"] = v.simple_value
        if v.HasField("tensor"):
            item["text"] = [s.decode("utf-8") for s in v.tensor.string_val]
            item["plugin"] = v.metadata.plugin_data.plugin_name
        d["values"].append(item)
    events.append(d)
acc = event_accumulator.EventAccumulator(sys.argv[1])
acc.Reload()
tags = acc.Tags()
out = {"events": events, "scalar_tags": sorted(tags["scalars"]), "tensor_tags": sorted(tags["tensors"]),
       "loss": [[s.step, s.value] for s in acc.Scalars("loss")]}
print("RESULT " + json.dumps(out))
)PY";
  }
  const std::string cmd = "'" + py + "' '" + script.string() + "' '" + dir.string() + "' 2>&1";
  const auto [out, rc] = testing::run_command(cmd);
  if (out.find("SKIPPED: ") != std::string::npos) {
    std::printf("%s", out.c_str());
    return;
  }
  INFO(out);
  REQUIRE(rc == 0);
  const size_t at = out.find("RESULT ");
  REQUIRE(at != std::string::npos);
  auto j = nlohmann::json::parse(out.substr(at + 7, out.find('\n', at) - at - 7));
  CHECK(j["events"][0]["file_version"] == "brain.Event:2");
  CHECK(j["scalar_tags"] == nlohmann::json::array({"loss", "lr"}));
  CHECK(j["tensor_tags"] == nlohmann::json::array({"hparams", "notes"}));
  REQUIRE(j["loss"].size() == 5);
  for (int s = 0; s < 5; ++s) {
    CHECK(j["loss"][s][0] == s);
    CHECK(j["loss"][s][1].get<double>() == Approx(2.0 - 0.25 * s));
  }
  bool text_seen = false;
  for (const auto& ev : j["events"])
    for (const auto& v : ev["values"])
      if (v["tag"] == "notes") {
        text_seen = true;
        CHECK(v["plugin"] == "text");
        CHECK(v["text"][0] == "hello tensorboard");
        CHECK(ev["step"] == 2);
      }
  CHECK(text_seen);
}

TEST_CASE("metrics logger: step report figures as scalars", "[log][metrics][profile]") {
  const testing::TempDir tmp("ember_test_metrics_figures");
  const fs::path& dir = tmp.path;
  profile::StepFigures f;
  f.step_ms = 10;
  f.data_wait_ms = 2;
  f.forward_ms = 3;
  f.samples_per_second = 640;
  f.peak_bytes = 1 << 20;
  {
    logging::MetricsLogger log(dir, {.csv = false, .tensorboard = false});
    profile::log_step_figures(log, 7, f);
  }
  std::ifstream jl(dir / "metrics.jsonl");
  std::string l;
  REQUIRE(std::getline(jl, l));
  auto j = nlohmann::json::parse(l);
  CHECK(j["step"] == 7);
  CHECK(j["profile/step_ms"] == 10.0);
  CHECK(j["profile/data_wait_ms"] == 2.0);
  CHECK(j["profile/forward_ms"] == 3.0);
  CHECK(j["profile/samples_per_second"] == 640.0);
  CHECK(j["profile/peak_memory_mib"] == 1.0);
  CHECK_FALSE(j.contains("profile/device_busy"));  // unknown figures are not logged
}

TEST_CASE("metrics logger: errors name the folder or the problem", "[log][metrics][errors]") {
  const testing::TempDir tmp("ember_test_metrics_errors");
  const fs::path& dir = tmp.path;
  std::ofstream(dir / "a_file") << "x";
  REQUIRE_THROWS_AS(logging::MetricsLogger(dir / "a_file"), IOError);
  REQUIRE_THROWS_WITH(logging::MetricsLogger(dir / "a_file" / "sub"), Contains("cannot create the log folder") &&
                                                                        Contains("a_file"));
  logging::MetricsLogger log(dir / "ok", {.csv = false, .tensorboard = false});
  REQUIRE_THROWS_WITH(log.log_scalar(0, "", 1.0), Contains("tag must not be empty"));
  log.close();
  REQUIRE_THROWS_WITH(log.log_scalar(0, "x", 1.0), Contains("is closed"));
}

TEST_CASE("metrics logger: concurrent loggers' lines never interleave", "[log][metrics]") {
  const testing::TempDir tmp("ember_test_metrics_threads");
  const fs::path& dir = tmp.path;
  {
    logging::MetricsLogger log(dir, {.csv = false, .tensorboard = false});
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&log, t] {
        for (int i = 0; i < 50; ++i) log.log_scalars(i, {{"thread" + std::to_string(t), static_cast<double>(i)}});
      });
    for (auto& t : ts) t.join();
  }
  std::ifstream jl(dir / "metrics.jsonl");
  int n = 0;
  for (std::string l; std::getline(jl, l); ++n) REQUIRE_NOTHROW(nlohmann::json::parse(l));
  CHECK(n == 200);
}

#pragma once
// A small flag parser shared by the examples: --name value or --name=value, with defaults and
// a usage message for unknown flags.
#include <cstdlib>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>

#include <ember/ember.hpp>
#include <ember/logging/metrics_logger.hpp>

namespace examples {

class Args {
 public:
  Args(int argc, char** argv, std::map<std::string, std::string> defaults) : values_(std::move(defaults)) {
    values_.emplace("save", "");  // every example: --save PATH writes the trained weights
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        usage(argv[0]);
        std::exit(0);
      }
      if (a.rfind("--", 0) != 0) fail(argv[0], "unexpected argument " + a);
      std::string key = a.substr(2), value;
      auto eq = key.find('=');
      if (eq != std::string::npos) {
        value = key.substr(eq + 1);
        key = key.substr(0, eq);
      } else {
        if (i + 1 >= argc) fail(argv[0], "flag --" + key + " needs a value");
        value = argv[++i];
      }
      if (!values_.count(key)) fail(argv[0], "unknown flag --" + key);
      values_[key] = value;
    }
  }
  std::string str(const std::string& k) const { return values_.at(k); }
  int64_t integer(const std::string& k) const { return std::stoll(values_.at(k)); }
  double real(const std::string& k) const { return std::stod(values_.at(k)); }
  // Every flag with its value, for the metrics log's hparams.json (train::TrainerOptions::hparams):
  // a number where the whole value parses as one, else the text.
  ember::logging::HParams hparams() const {
    ember::logging::HParams hp;
    for (const auto& [k, v] : values_) {
      char* end = nullptr;
      const double d = v.empty() ? 0.0 : std::strtod(v.c_str(), &end);
      if (!v.empty() && end == v.c_str() + v.size()) {
        hp.emplace_back(k, d);
      } else {
        hp.emplace_back(k, v);
      }
    }
    return hp;
  }

  // --save PATH: the trained weights as a safetensors file (PyTorch loads it with
  // model.load_state_dict(safetensors.torch.load_file(PATH)) where the names match).
  void save_model(const ember::nn::Module& model) const { save_tensors(model.state_dict()); }
  void save_tensors(const ember::io::TensorList& tensors) const {
    if (str("save").empty()) return;
    ember::io::save_file(str("save"), tensors);
    // One write: std::cerr is unbuffered, so piece by piece the line could be cut by the program's
    // stdout (the JSON line) where both reach one pipe, as under mpirun (example.ddp_train.mpi_save
    // failed so once).
    std::cerr << ("saved " + std::to_string(tensors.size()) + " tensors to " + str("save") + "\n") << std::flush;
  }

  // --device auto|cpu|cuda|cuda:N; auto picks the first GPU when there is one.
  ember::Device device() const {
    std::string d = str("device");
    if (d == "auto") return ember::cuda::is_available() ? ember::Device::cuda(0) : ember::Device::cpu();
    if (d == "cpu") return ember::Device::cpu();
    if (d == "cuda") return ember::Device::cuda(0);
    if (d.rfind("cuda:", 0) == 0) return ember::Device::cuda(std::stoi(d.substr(5)));
    throw std::invalid_argument("--device must be auto, cpu, cuda or cuda:N, got " + d);
  }

 private:
  [[noreturn]] void fail(const char* prog, const std::string& msg) const {
    std::cerr << prog << ": " << msg << "\n";
    usage(prog);
    std::exit(2);
  }
  void usage(const char* prog) const {
    std::cerr << "usage: " << prog;
    for (auto& [k, v] : values_) std::cerr << " [--" << k << " " << v << "]";
    std::cerr << "\n";
  }
  std::map<std::string, std::string> values_;
};

}  // namespace examples

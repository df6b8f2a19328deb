#pragma once
// Triton Inference Server model repositories from ember's ONNX export (not in the umbrella
// ember.hpp). Each model is a folder that Triton's onnxruntime backend serves:
//
//   <repository>/<name>/config.pbtxt            deploy/triton_config.hpp writes it
//   <repository>/<name>/<version>/model.onnx    (and its external data file, if any)
//   <repository>/<name>_int8/...                the INT8 Q/DQ model, when RepositoryOptions::int8 is set
//
//   io::triton::export_model(*model, {example}, "models",
//                            {.config = {.name = "classifier", .max_batch_size = 16,
//                                        .preferred_batch_sizes = {8, 16}}});
//   io::triton::add_onnx_model("exported.onnx", "models", {.config = {.name = "classifier"}});
//   tritonserver --model-repository=models
//
// A model folder is complete or absent: it is built in a hidden temporary folder beside it
// (every file fsynced), then renamed into place; with replace = true an existing folder is
// exchanged for the new one in one rename (Linux's RENAME_EXCHANGE) and then removed, so its
// other versions go with it. The INT8 folder and the float one are built before either is put
// in place: a failure in either (an export error, a batch dimension that is not symbolic, a
// full disk) leaves the repository as it was.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ember/deploy/onnx_export.hpp"
#include "ember/deploy/triton_config.hpp"
#include "ember/deploy/triton_onnx_io.hpp"

namespace ember::io::triton {

struct RepositoryOptions {
  ConfigOptions config;   // the name, batching and instances (deploy/triton_config.hpp)
  int64_t version = 1;    // the version folder
  bool replace = false;   // an existing model folder of this name is replaced (else an error)
  onnx::ExportOptions onnx = {};  // export_model: how the module is exported (opset, dtype, names)
  // export_model: a calibrated INT8 model (quant::prepare, then quant::calibrate: docs/deploy.md),
  // exported with QuantizeLinear/DequantizeLinear pairs as the model "<name>_int8".
  std::shared_ptr<nn::Module> int8;
};

struct RepositoryResult {
  std::filesystem::path model_dir, int8_dir;  // int8_dir empty without an INT8 model
  std::string config, int8_config;            // the config.pbtxt texts
  OnnxSignature signature;                    // the float model's graph inputs and outputs
};

namespace detail {

inline void check_version(const RepositoryOptions& o) {
  EMBER_CHECK(o.version >= 1, ValueError, "Triton repository: model '", o.config.name, "' version ", o.version,
              " must be at least 1 (Triton's version folders are positive integers)");
}

// A model folder under construction: <repository>/.<name>.tmp.<pid>.<n>, removed unless
// committed into <repository>/<name>.
class PendingModel {
 public:
  PendingModel(const std::filesystem::path& repository, const std::string& name, const RepositoryOptions& o)
      : target_(repository / name) {
    static std::atomic<uint64_t> counter{0};
    std::error_code ec;
    std::filesystem::create_directories(repository, ec);
    EMBER_CHECK(!ec, IOError, "Triton repository: cannot create the folder '", repository.string(), "': ", ec.message());
    EMBER_CHECK(o.replace || !std::filesystem::exists(target_), IOError, "Triton repository: '", target_.string(),
                "' already exists; set RepositoryOptions::replace = true to replace it (its other versions go too)");
    temp_ = repository / ::ember::detail::str_cat(".", name, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
    std::filesystem::create_directories(version_dir(o.version), ec);
    EMBER_CHECK(!ec, IOError, "Triton repository: cannot create the folder '", version_dir(o.version).string(),
                "': ", ec.message());
  }
  ~PendingModel() {
    std::error_code ec;  // never throw from a destructor
    if (!temp_.empty()) std::filesystem::remove_all(temp_, ec);
  }
  PendingModel(const PendingModel&) = delete;
  PendingModel& operator=(const PendingModel&) = delete;

  std::filesystem::path version_dir(int64_t version) const { return temp_ / std::to_string(version); }
  std::filesystem::path config_path() const { return temp_ / "config.pbtxt"; }
  const std::filesystem::path& target() const { return target_; }

  // Puts the folder in place; an earlier folder of the name is exchanged for it, then removed.
  void commit() {
    fsync_directory(temp_);
    if (::rename(temp_.c_str(), target_.c_str()) != 0) {
      const int err = errno;
      EMBER_CHECK(err == ENOTEMPTY || err == EEXIST, IOError, "Triton repository: cannot rename '", temp_.string(),
                  "' to '", target_.string(), "': ", std::strerror(err));
      exchange();
    } else {
      temp_.clear();
    }
    fsync_directory(target_.parent_path());
    std::error_code ec;
    if (!temp_.empty()) std::filesystem::remove_all(temp_, ec);  // the previous folder, now at temp_
    temp_.clear();
  }

 private:
  void exchange() {
#ifdef RENAME_EXCHANGE
    if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) return;
    EMBER_CHECK(errno == EINVAL || errno == ENOSYS, IOError, "Triton repository: cannot exchange '", temp_.string(),
                "' with '", target_.string(), "': ", std::strerror(errno));
#endif
    // No atomic exchange on this file system: the old folder steps aside, then the new one moves in.
    const std::filesystem::path old = temp_.string() + ".old";
    if (::rename(target_.c_str(), old.c_str()) != 0 || ::rename(temp_.c_str(), target_.c_str()) != 0)
      throw IOError(::ember::detail::str_cat("Triton repository: cannot replace '", target_.string(), "': ",
                                             std::strerror(errno)));
    temp_ = old;
  }

  std::filesystem::path target_, temp_;
};

// A file copied durably (fsynced) into the folder being built.
inline void copy_file(const std::filesystem::path& from, const std::filesystem::path& to) {
  const io::detail::MappedFile in(from.string(), "ONNX");
  AtomicWriter w(to);
  if (in.size() > 0) w.write(in.data(), static_cast<size_t>(in.size()));
  w.commit();
}

inline ConfigOptions int8_config(const ConfigOptions& c) {
  ConfigOptions q = c;
  q.name += "_int8";
  return q;
}

// Writes the config of the model in `m`'s version folder and returns its text.
inline std::string write_config(PendingModel& m, const OnnxSignature& sig, const ConfigOptions& c) {
  const std::string text = model_config(sig.inputs, sig.outputs, c);
  write_file_atomic(m.config_path(), text);
  return text;
}

}  // namespace detail

// The module exported to ONNX (o.onnx) into a new model folder of the repository, with its
// config.pbtxt; with o.int8, the calibrated INT8 model beside it as "<name>_int8".
inline RepositoryResult export_model(nn::Module& module, const std::vector<AnyTensor>& example_inputs,
                                     const std::filesystem::path& repository, const RepositoryOptions& o) {
  detail::check_options(o.config);
  detail::check_version(o);
  if (o.int8) detail::check_options(detail::int8_config(o.config));
  RepositoryResult r;
  detail::PendingModel m(repository, o.config.name, o);
  const ConfigOptions c8 = detail::int8_config(o.config);
  std::unique_ptr<detail::PendingModel> q;
  if (o.int8) q = std::make_unique<detail::PendingModel>(repository, c8.name, o);
  const auto model_file = m.version_dir(o.version) / "model.onnx";
  onnx::export_model(module, example_inputs, model_file, o.onnx);
  r.signature = read_onnx_signature(model_file);
  r.config = detail::write_config(m, r.signature, o.config);
  if (q) {
    const auto int8_file = q->version_dir(o.version) / "model.onnx";
    onnx::export_model(*o.int8, example_inputs, int8_file, o.onnx);
    r.int8_config = detail::write_config(*q, read_onnx_signature(int8_file), c8);
    r.int8_dir = q->target();
  }
  m.commit();
  if (q) q->commit();
  r.model_dir = m.target();
  return r;
}

// An ONNX file exported earlier (by ember or any other producer) copied into a new model folder
// of the repository as <version>/model.onnx, with its external data files, and its config.pbtxt
// written from the graph's inputs and outputs. o.onnx and o.int8 are not used.
inline RepositoryResult add_onnx_model(const std::filesystem::path& onnx_file, const std::filesystem::path& repository,
                                       const RepositoryOptions& o) {
  detail::check_options(o.config);
  detail::check_version(o);
  RepositoryResult r;
  r.signature = read_onnx_signature(onnx_file);
  for (const std::string& f : r.signature.data_files) {
    const std::filesystem::path rel(f);
    bool inside = !rel.is_absolute() && !rel.empty();
    for (const auto& part : rel) inside = inside && part != "..";
    EMBER_CHECK(inside, FormatError, "ONNX file '", onnx_file.string(), "' names the external data file '", f,
                "' outside its folder; Triton loads a model's data from its version folder");
  }
  // The config first: a graph Triton cannot serve with these options creates no folder.
  const std::string text = model_config(r.signature.inputs, r.signature.outputs, o.config);
  detail::PendingModel m(repository, o.config.name, o);
  const auto dir = m.version_dir(o.version);
  detail::copy_file(onnx_file, dir / "model.onnx");
  for (const std::string& f : r.signature.data_files) {
    std::error_code ec;
    std::filesystem::create_directories((dir / f).parent_path(), ec);
    detail::copy_file(onnx_file.parent_path() / f, dir / f);
  }
  write_file_atomic(m.config_path(), text);
  r.config = text;
  m.commit();
  r.model_dir = m.target();
  return r;
}

}  // namespace ember::io::triton

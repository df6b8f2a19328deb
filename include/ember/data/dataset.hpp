#pragma once
// data::Example and data::Dataset: what the DataLoader (data/dataloader.hpp) reads from.
//
// An Example is one sample: named fields, each a host tensor ("image" uint8 [28, 28], "label"
// int64 []). A Dataset gives random access to its examples by index and must be safe to call
// from several threads at once (the loader's workers are threads); the datasets here are
// immutable after construction, so they are. Fields may be views of a dataset's own storage:
// a transform makes new tensors, it never writes into a field in place.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ember/core/error.hpp"
#include "ember/core/named_list.hpp"
#include "ember/core/tensor.hpp"

namespace ember::data {

class Example {
 public:
  Example() = default;
  Example(std::initializer_list<std::pair<std::string, AnyTensor>> fields) : fields_(fields) {}

  // Adds the field, or replaces the one of that name.
  void set(const std::string& name, AnyTensor t) { fields_.set(name, std::move(t)); }
  bool has(const std::string& name) const { return fields_.find(name) != nullptr; }
  const AnyTensor& operator[](const std::string& name) const {
    if (const AnyTensor* t = fields_.find(name)) return *t;
    throw ValueError(::ember::detail::str_cat("Example: no field '", name, "' (fields: ", field_names(), ")"));
  }
  template <class T>
  Tensor<T> get(const std::string& name) const {
    return Tensor<T>((*this)[name]);
  }
  // Fields in insertion order (the order the collate function stacks them in).
  const std::vector<std::pair<std::string, AnyTensor>>& fields() const { return fields_.entries(); }
  size_t size() const { return fields_.size(); }

  std::string field_names() const {
    std::string s = fields_.names();
    return s.empty() ? std::string("none") : s;
  }

 private:
  NamedList<AnyTensor> fields_;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Example i, 0 <= i < size(); thread-safe. Out of range: IndexError.
  virtual Example get(int64_t i) const = 0;
  // A name for messages ("idx(/path/train-images-idx3-ubyte.gz)").
  virtual std::string name() const { return "dataset"; }

 protected:
  void check_index(int64_t i) const {
    EMBER_CHECK(i >= 0 && i < size(), IndexError, name(), ": index ", i, " out of range [0, ", size(), ")");
  }
};

// A dataset over in-memory tensors, sliced along the first dimension: example i has, for each
// field, the view field.select(i). Every field must have the same first dimension.
class TensorDataset : public Dataset {
 public:
  TensorDataset(std::vector<std::pair<std::string, AnyTensor>> fields, std::string name = "tensor_dataset")
      : fields_(std::move(fields)), name_(std::move(name)) {
    EMBER_CHECK(!fields_.empty(), ValueError, name_, ": needs at least one field");
    for (const auto& f : fields_) {
      EMBER_CHECK(f.second.defined(), ValueError, name_, ": field '", f.first, "' is an undefined tensor");
      EMBER_CHECK(f.second.device().is_cpu(), DeviceError, name_, ": field '", f.first, "' is on ",
                  f.second.device().str(), "; datasets hold host tensors (the loader uploads batches)");
      EMBER_CHECK(f.second.dim() >= 1, ShapeError, name_, ": field '", f.first,
                  "' is a scalar; fields are sliced along their first dimension");
      EMBER_CHECK(f.second.size(0) == fields_[0].second.size(0), ShapeError, name_, ": field '", f.first, "' has ",
                  f.second.size(0), " rows but field '", fields_[0].first, "' has ", fields_[0].second.size(0));
    }
    n_ = fields_[0].second.size(0);
  }

  int64_t size() const override { return n_; }
  Example get(int64_t i) const override {
    check_index(i);
    Example e;
    for (const auto& f : fields_) e.set(f.first, f.second.select(i));
    return e;
  }
  std::string name() const override { return name_; }
  const AnyTensor& field(const std::string& name) const {
    for (const auto& f : fields_)
      if (f.first == name) return f.second;
    throw ValueError(::ember::detail::str_cat(name_, ": no field '", name, "'"));
  }

 private:
  std::vector<std::pair<std::string, AnyTensor>> fields_;
  std::string name_;
  int64_t n_ = 0;
};

}  // namespace ember::data

#pragma once
// NamedList<V>: values by name in insertion order, looked up by a linear search (they hold a
// handful of entries). data::Example's fields and optim::Hyperparams are NamedLists.
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace ember {

template <class V>
class NamedList {
 public:
  using Entry = std::pair<std::string, V>;

  NamedList() = default;
  // The entries set in order: a repeated name keeps its first place and its last value.
  NamedList(std::initializer_list<Entry> entries) {
    for (const auto& [k, v] : entries) set(k, v);
  }

  // Adds the entry, or replaces the value of the one of that name (which keeps its place).
  void set(const std::string& name, V value) {
    if (V* v = find(name)) {
      *v = std::move(value);
    } else {
      entries_.emplace_back(name, std::move(value));
    }
  }
  const V* find(const std::string& name) const {
    for (const auto& [k, v] : entries_)
      if (k == name) return &v;
    return nullptr;
  }
  V* find(const std::string& name) { return const_cast<V*>(std::as_const(*this).find(name)); }

  const std::vector<Entry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  // "a, b, c" ("" when empty), for messages.
  std::string names() const {
    std::string s;
    for (const auto& [k, v] : entries_) s += (s.empty() ? "" : ", ") + k;
    return s;
  }
  bool operator==(const NamedList&) const = default;

 private:
  std::vector<Entry> entries_;
};

}  // namespace ember

#pragma once
// Device is a runtime value: the CPU, or CUDA device i.
#include <cstdint>
#include <ostream>
#include <string>

namespace ember {

enum class DeviceType : std::uint8_t { CPU, CUDA };

class Device {
 public:
  constexpr Device() = default;
  constexpr Device(DeviceType type, int index) : type_(type), index_(type == DeviceType::CPU ? 0 : index) {}
  static constexpr Device cpu() { return Device(DeviceType::CPU, 0); }
  static constexpr Device cuda(int index = 0) { return Device(DeviceType::CUDA, index); }
  constexpr DeviceType type() const { return type_; }
  constexpr int index() const { return index_; }
  constexpr bool is_cpu() const { return type_ == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type_ == DeviceType::CUDA; }
  std::string str() const { return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index_); }
  constexpr bool operator==(const Device&) const = default;

 private:
  DeviceType type_ = DeviceType::CPU;
  int index_ = 0;
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

}  // namespace ember

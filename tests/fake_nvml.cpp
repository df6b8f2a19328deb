// A stand-in for libnvidia-ml.so.1 with two GPUs and fixed readings, built as a shared library
// for tests/test_device_monitor.cpp: it exercises the monitor's dlopen/dlsym path and its
// hand-written declarations of NVML's functions and structs. Only the functions the monitor
// loads are defined; the readings follow NVML's units (percent, bytes, C, milliwatts, MHz).
#include <atomic>

namespace {
struct FakeDevice {
  int index;
};
FakeDevice devices[2] = {{0}, {1}};
std::atomic<int> inits{0}, shutdowns{0};
struct Utilization {
  unsigned int gpu, memory;
};
struct Memory {
  unsigned long long total, free, used;
};
}  // namespace

extern "C" {
int nvmlInit_v2() {
  inits.fetch_add(1);
  return 0;
}
int nvmlShutdown() {
  shutdowns.fetch_add(1);
  return 0;
}
int nvmlDeviceGetCount_v2(unsigned int* n) {
  *n = 2;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void** device) {
  if (i >= 2) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = &devices[i];
  return 0;
}
int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  const int i = static_cast<FakeDevice*>(device)->index;
  u->gpu = i == 0 ? 37 : 90;
  u->memory = 12;
  return 0;
}
int nvmlDeviceGetMemoryInfo(void* device, Memory* m) {
  m->total = 80ull << 30;
  m->used = static_cast<FakeDevice*>(device)->index == 0 ? (20ull << 30) : (1ull << 30);
  m->free = m->total - m->used;
  return 0;
}
int nvmlDeviceGetTemperature(void*, int sensor, unsigned int* t) {
  if (sensor != 0) return 2;
  *t = 61;
  return 0;
}
int nvmlDeviceGetPowerUsage(void*, unsigned int* mw) {
  *mw = 215500;
  return 0;
}
int nvmlDeviceGetClockInfo(void*, int type, unsigned int* mhz) {
  if (type != 1) return 2;  // only the SM clock is asked for
  *mhz = 1755;
  return 0;
}
// No nvmlDeviceGetCurrentClocksThrottleReasons: an optional function the monitor must do without.
int fake_nvml_inits() { return inits.load(); }
int fake_nvml_shutdowns() { return shutdowns.load(); }
}
